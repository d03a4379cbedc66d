"""The cluster a URL names, for the user who asks: the one place that decides who may read
which cluster (today every role reads every cluster; per-cluster access changes this)."""

from django.http import Http404, HttpRequest
from django.shortcuts import get_object_or_404

from .models import Cluster
from .roles import Role, has_role


def get_cluster_for_user(request: HttpRequest, slug: str) -> Cluster:
    """The cluster named by `slug`, for a user who may read it; 404 for an unknown one, and
    for a user without a role, who reads no cluster (as healthchecks' _get_check_for_user)."""
    if not has_role(request.user, Role.VIEWER):
        raise Http404("No such cluster.")
    return get_object_or_404(Cluster, slug=slug)


def clusters_for_user(user):
    """The clusters `user` may read (what other clusters' history a page may show them)."""
    if not has_role(user, Role.VIEWER):
        return Cluster.objects.none()
    return Cluster.objects.all()
