"""Slurm's commands for the demo's simulated fleet (demo/slurm/commands.py), on the PATH of
the demo's own processes through demo/bin/."""
