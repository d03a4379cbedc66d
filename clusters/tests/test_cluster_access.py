"""get_cluster_for_user: the one function that says who reads which cluster."""

import pytest
from django.http import Http404
from django.test import RequestFactory

from clusters.queries import get_cluster_for_user


def request_by(user):
    request = RequestFactory().get("/")
    request.user = user
    return request


@pytest.mark.parametrize("persona", ["viewer", "operator", "admin"])
def test_every_role_reads_the_cluster(request, cluster, persona):
    user = request.getfixturevalue(persona)
    assert get_cluster_for_user(request_by(user), cluster.slug) == cluster


def test_a_user_without_a_role_reads_no_cluster(cluster, outsider):
    with pytest.raises(Http404):
        get_cluster_for_user(request_by(outsider), cluster.slug)


def test_an_unknown_cluster_is_not_found(viewer):
    with pytest.raises(Http404):
        get_cluster_for_user(request_by(viewer), "no-such-cluster")
