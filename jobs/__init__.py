"""Job accounting imported from Slurm's sacct (the cluster's scheduler), the Jobs tab."""
