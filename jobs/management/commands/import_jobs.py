from django.core.management.base import BaseCommand, CommandError

from jobs.services import do_import_jobs, slurm_clusters


class Command(BaseCommand):
    help = "Import jobs from Slurm's accounting (sacct) for every Slurm cluster, or one."

    def add_arguments(self, parser):
        parser.add_argument("--cluster", help="a cluster's slug (default: every Slurm cluster)")

    def handle(self, *args, cluster=None, **options):
        found = slurm_clusters()
        if cluster:
            found = found.filter(slug=cluster)
            if not found:
                raise CommandError(f"no Slurm cluster {cluster!r}")
        failed = False
        for slurm_cluster in found:
            result = do_import_jobs(slurm_cluster,
                                    slurm_conf=slurm_cluster.scheduler_config or None)
            if result.error:
                failed = True
                self.stderr.write(f"{slurm_cluster.slug}: {result.error}")
            else:
                self.stdout.write(f"{slurm_cluster.slug}: {result.created} new, "
                                  f"{result.updated} updated")
        if failed:
            raise CommandError("some imports failed")
