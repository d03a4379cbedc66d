"""The browsers' socket: a signed-in page of a cluster gets its summary once a second and
the change feed's notices (the publisher sends both). Read-only, by session."""

import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from clusters.models import Cluster
from clusters.roles import Role, has_role
from common.groups import cluster_group

from .publisher import ensure_publisher


class LiveClusterConsumer(AsyncWebsocketConsumer):
    """/ws/live/cluster/<slug>/: a signed-in browser gets the cluster summary once a second,
    and, from the change feed (gateway.publisher), {"type": "health.changed"},
    {"type": "repair.changed"} or {"type": "check.changed"} when the cluster's health
    events, repairs or check runs change."""

    group = None

    async def connect(self):
        ensure_publisher()
        user = self.scope.get("user")
        slug = self.scope["url_route"]["kwargs"]["slug"]
        if user is None or not await database_sync_to_async(may_watch)(user, slug):
            await self.close(code=4403)
            return
        self.group = cluster_group(slug)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None):
        """Browsers only listen."""

    async def cluster_summary(self, message):
        await self.send(text_data=json.dumps(message["summary"]))

    async def health_changed(self, message):
        """An event opened, counted, closed or was acknowledged. The Health checks tab
        re-fetches its table (static/js/health.js)."""
        await self.forward(message)

    async def repair_changed(self, message):
        """A repair of the cluster moved. The Repair tab and node pages re-fetch what shows it
        (static/js/repairs.js)."""
        await self.forward(message)

    async def check_changed(self, message):
        """A check run was asked for or finished (the check runs table re-fetches)."""
        await self.forward(message)

    async def forward(self, message):
        await self.send(text_data=json.dumps({"type": message["type"],
                                              "cluster": message["cluster"]}))


def may_watch(user, slug):
    return has_role(user, Role.VIEWER) and Cluster.objects.filter(slug=slug).exists()
