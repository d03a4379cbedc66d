"""Many nodes joining with one join token at once (a new cluster powering on): their
transactions share no row lock, so they run side by side instead of taking turns."""

import threading

import pytest
from django.db import connection, transaction

from clusters.models import Cluster
from gateway import ingest
from gateway.ingest import TokenGrant
from gateway.tests.test_consumers import hello
from gateway.tests.test_reconnects import counted_statements
from healthchecks.check_catalog import ACCEPTANCE_CHECKS
from nodes.models import AgentToken
from nodes.services import do_issue_join_token

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_join_waits_for_no_other_join_in_flight(cluster):
    # With acceptance on, each join changes the cluster's "n of N joined nodes passed".
    cluster.acceptance_tests_enabled = True
    cluster.save()
    token, _ = do_issue_join_token(cluster)
    grant = TokenGrant.of(token)
    first_in_flight, second_done = threading.Event(), threading.Event()
    outcomes = {}

    def first_join():
        try:
            with transaction.atomic():  # held open until the second join is done
                outcomes["first"] = ingest.accept_hello(grant, hello(node="gpu-001"))
                first_in_flight.set()
                second_done.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=first_join)
    thread.start()
    assert first_in_flight.wait(10)
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '3s'")  # waiting on the first's row locks fails
    try:
        outcomes["second"] = ingest.accept_hello(grant, hello(node="gpu-002"))
    finally:
        second_done.set()
        thread.join()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")

    assert outcomes["first"].node_id and outcomes["second"].node_id
    # Both noted once committed: the token's use, and the cluster's status from both nodes.
    assert AgentToken.objects.get(pk=token.pk).last_used_at is not None
    cluster.refresh_from_db()
    assert (cluster.status, cluster.status_reason) == (
        Cluster.Status.ACCEPTING, "0 of 2 joined nodes passed acceptance")


def join_statements(cluster, monkeypatch, node_name):
    token, _ = do_issue_join_token(cluster)
    with monkeypatch.context() as patched, counted_statements(patched) as statements:
        outcome = ingest.accept_hello(TokenGrant.of(token), hello(node=node_name))
        frames = ingest.frames_after_welcome(outcome.node_id)
    return statements.sql, frames


def test_a_join_asks_for_its_whole_acceptance_battery_in_the_same_statements(
        cluster, monkeypatch):
    """Every node of a new cluster asks for its battery as it joins: one insert of runs, one
    state refresh and one send, however many checks it holds. Fails when the count grows."""
    cluster.acceptance_tests_enabled = True
    cluster.acceptance_checks = "nvml_sanity"
    cluster.save()
    join_statements(cluster, monkeypatch, "gpu-000")  # the process's first reads are cached
    one_check, frames = join_statements(cluster, monkeypatch, "gpu-001")
    assert [frame["check"] for frame in frames if frame["type"] == "run_check"] == [
        "nvml_sanity"]

    cluster.acceptance_checks = " ".join(ACCEPTANCE_CHECKS)
    cluster.save()
    battery, frames = join_statements(cluster, monkeypatch, "gpu-002")
    assert len(ACCEPTANCE_CHECKS) > 1
    assert [frame["check"] for frame in frames if frame["type"] == "run_check"] == list(
        ACCEPTANCE_CHECKS)
    assert len(without_status_writes(battery)) == len(without_status_writes(one_check)) <= 62, (
        battery)


def without_status_writes(statements):
    """Less the cluster's status and its timeline row: written once the join commits, when the
    status changes (or only its reason)."""
    return [sql for sql in statements
            if not sql.startswith(('UPDATE "clusterui_cluster"',
                                   'INSERT INTO "clusterui_clustertransition"'))]
