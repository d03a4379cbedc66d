import uvloop
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from common import gc_tuning
from gateway.publisher import run_publisher_process


class Command(BaseCommand):
    help = ("Run the live publisher alone (production, REDIS_URL set): it leads through a Redis "
            "lease (whatever CLUSTERUI_PUBLISHER_LEADS says), folds every server process's "
            "samples, and pushes to browsers and agents. Server processes run beside it with "
            "CLUSTERUI_PUBLISHER_LEADS=false.")

    def handle(self, *args, **options):
        if not settings.REDIS_URL:
            raise CommandError("the publisher process is for production: set REDIS_URL (in "
                               "embedded mode the one server process publishes)")
        gc_tuning.apply()
        uvloop.run(run_publisher_process())
