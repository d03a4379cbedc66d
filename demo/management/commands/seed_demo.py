import time

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from demo import seed as demo
from jobs.services import do_import_jobs


class Command(BaseCommand):
    help = (
        "Embedded mode only: create the accounts demo (operator) and admin (admin), each with "
        "its name as password, and the cluster 'demo' (64 nodes x 8 H200 GPUs) with a day of "
        "history. Safe to re-run: an existing 'demo' cluster is kept unless --reset."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--reset", action="store_true",
            help="delete the existing 'demo' cluster (its nodes, history and usage) and rebuild it",
        )
        parser.add_argument(
            "--fleet-dir", metavar="DIR",
            help="also prepare the state dirs of the simulated agents (python -m agent.sim.fleet)",
        )
        parser.add_argument(
            "--receiver-url", metavar="URL",
            help="also add the channel 'demo receiver', a signed webhook to this URL "
                 "(scripts/demo_receiver.py), its signing key written to --receiver-key-file")
        parser.add_argument("--receiver-key-file", metavar="FILE")
        parser.add_argument(
            "--import-jobs", action="store_true",
            help="then import the demo cluster's jobs from the simulated Slurm's sacct "
                 "(demo/bin/ on the PATH, as scripts/demo.sh sets it)")
        parser.add_argument(
            "--dry-run", action="store_true",
            help="do everything in a transaction, report, and roll it back",
        )

    def handle(self, *args, reset=False, dry_run=False, fleet_dir=None, receiver_url=None,
               receiver_key_file=None, import_jobs=False, **options):
        if receiver_url and not receiver_key_file:
            raise CommandError("--receiver-url needs --receiver-key-file")
        started = time.monotonic()
        try:
            with transaction.atomic():
                result = demo.seed(reset=reset)
                if fleet_dir and not dry_run:
                    demo.prepare_fleet(fleet_dir, reset=reset)
                if receiver_url and not dry_run:
                    demo.prepare_receiver(receiver_url, receiver_key_file)
                if dry_run:
                    transaction.set_rollback(True)
        except demo.NotEmbedded as exc:
            raise CommandError(
                f"{exc}: it creates accounts whose password is their name, which must never "
                "exist in production mode."
            ) from None
        except demo.SeedError as exc:
            raise CommandError(str(exc)) from None

        accounts = ", ".join(f"{name} ({role.label})" for name, role in demo.ACCOUNTS)
        prefix = "Dry run, rolled back: " if dry_run else ""
        self.stdout.write(f"{prefix}accounts {accounts}; password = name.")
        cluster = result.cluster
        if result.created:
            self.stdout.write(self.style.SUCCESS(
                f"{prefix}created cluster {cluster.slug} in {time.monotonic() - started:.1f} s."
            ))
        else:
            self.stdout.write(
                f"Kept the existing cluster {cluster.slug} as it is (--reset rebuilds it)."
            )
        nodes = sum(result.counts.values())
        states = ", ".join(f"{state.label} {n}" for state, n in result.counts.items())
        self.stdout.write(
            f"  {nodes} nodes: {states}\n"
            f"  {result.transitions} state transitions, {result.events} health events "
            f"({result.open_events} open), {result.rollups} minutes of usage"
        )
        if import_jobs and not dry_run:
            imported = do_import_jobs(cluster)
            if imported.error:
                self.stderr.write(f"  no jobs imported: {imported.error}")
            else:
                self.stdout.write(f"  jobs from the simulated Slurm: {imported.created} new, "
                                  f"{imported.updated} updated")
