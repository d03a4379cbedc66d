from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from clusters.models import AuditEntry
from nodes.services import find_usable_token

pytestmark = pytest.mark.django_db


def test_it_prints_a_usable_join_token_for_the_cluster(cluster):
    out = StringIO()
    call_command("jointoken", "--cluster", cluster.slug, "--expires-in-hours", "24", stdout=out)
    token = find_usable_token(out.getvalue().strip())
    assert token.kind == "join" and token.cluster == cluster and token.expires_at
    assert AuditEntry.objects.get().action == "jointoken.create"


def test_an_unknown_cluster_is_a_clear_error():
    with pytest.raises(CommandError, match="no cluster with slug 'nope'"):
        call_command("jointoken", "--cluster", "nope")
