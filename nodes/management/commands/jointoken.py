from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from clusters.models import Cluster
from nodes.services import do_issue_join_token


class Command(BaseCommand):
    help = "Print a new join token for a cluster: agents use it to register their nodes."

    def add_arguments(self, parser):
        parser.add_argument("--cluster", required=True, help="the cluster's slug")
        parser.add_argument("--expires-in-hours", type=int, default=None,
                            help="the token stops working after this many hours "
                                 "(default CLUSTERUI_JOIN_TOKEN_HOURS: 24)")
        parser.add_argument("--single-use", action="store_true",
                            help="the token stops working once a node has joined with it")
        parser.add_argument("--note", default="", help="what the token is for")

    def handle(self, *args, cluster, expires_in_hours, single_use, note, **options):
        try:
            target = Cluster.objects.get(slug=cluster)
        except Cluster.DoesNotExist:
            raise CommandError(f"no cluster with slug {cluster!r}") from None
        if expires_in_hours is not None and expires_in_hours <= 0:
            raise CommandError("--expires-in-hours must be positive")
        expires_at = (timezone.now() + timedelta(hours=expires_in_hours)
                      if expires_in_hours else None)
        _, plaintext = do_issue_join_token(target, expires_at=expires_at, single_use=single_use,
                                           note=note or "manage.py jointoken")
        self.stdout.write(plaintext)
