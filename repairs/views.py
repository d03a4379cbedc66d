from django.shortcuts import render
from django.views.decorators.http import require_GET

from clusterui.roles import Role, require_role
from clusterui.views import get_cluster_for_user
from nodes.choices import NodeState
from nodes.models import Node


@require_GET
@require_role(Role.VIEWER)
def repair_list(request, slug):
    """Nodes out of service, worst first: what repairs are for."""
    cluster = get_cluster_for_user(request, slug)
    nodes = Node.objects.filter(
        cluster=cluster, state__in=[NodeState.UNHEALTHY, NodeState.PAUSED]
    ).order_by("-state", "state_changed_at")
    return render(request, "repairs/list.html", {"cluster": cluster, "tab": "repair",
                                                 "nodes": nodes})
