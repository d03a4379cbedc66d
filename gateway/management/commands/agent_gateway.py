import uvloop
from django.core.management.base import BaseCommand

from common import gc_tuning
from gateway.server import run_gateway


class Command(BaseCommand):
    help = ("Serve the agent socket (/ws/agent/) on the websockets library: a gateway process "
            "for large fleets (gateway/server.py). Web processes serve everything else.")

    def add_arguments(self, parser):
        parser.add_argument("--bind", default="127.0.0.1", help="address to listen on")
        parser.add_argument("--port", type=int, default=8001)

    def handle(self, *args, bind, port, **options):
        # As a web process does (clusterui/asgi.py): without it, full collections stopped
        # the gateway's event loop for 600-800 ms (bench/README.md, Ingest).
        gc_tuning.apply()
        # uvloop's event loop, in C: 5-10 points of the core less than asyncio's own at
        # 6,000-10,000 samples a second (bench/README.md, "The gateway on uvloop").
        uvloop.run(run_gateway(bind, port))
