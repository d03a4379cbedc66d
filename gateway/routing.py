from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from .consumers import AgentConsumer
from .live_consumers import LiveClusterConsumer


def browser_socket(consumer):
    """Browsers: the signed-in session, and only from this site's own pages."""
    return AllowedHostsOriginValidator(AuthMiddlewareStack(consumer.as_asgi()))


websocket_urlpatterns = [
    # Agents authenticate with their own bearer tokens: no session, no origin check.
    path("ws/agent/", AgentConsumer.as_asgi()),
    path("ws/live/cluster/<slug:slug>/", browser_socket(LiveClusterConsumer)),
]
