from django.urls import path

from .consumers import AgentConsumer

# Agents authenticate with their own bearer tokens: no session, no origin check.
agent_urlpatterns = [
    path("ws/agent/", AgentConsumer.as_asgi()),
]
