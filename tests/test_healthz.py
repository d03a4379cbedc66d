"""/healthz: the load balancer's probe, answered without signing in."""

import socket

import pytest
from django.db import OperationalError

pytestmark = pytest.mark.django_db


def closed_loopback_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_it_answers_200_when_the_database_answers(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response["Cache-Control"] == "no-store"


def test_it_needs_no_sign_in_and_says_nothing_more_to_a_signed_in_user(client_for, viewer):
    assert client_for(viewer).get("/healthz").json() == {"status": "ok"}


def test_it_answers_503_naming_an_unreachable_redis(client, settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{closed_loopback_port()}/0"
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "failing", "failed": ["redis"]}


def test_it_answers_503_naming_the_database_without_its_error(client, monkeypatch):
    class Unreachable:
        def cursor(self):
            raise OperationalError('connection to "db.internal" failed: password hunter2')

    monkeypatch.setattr("clusterui.views.connection", Unreachable())
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["failed"] == ["database"]
    assert b"hunter2" not in response.content and b"db.internal" not in response.content


def test_it_refuses_post(client):
    assert client.post("/healthz").status_code == 405
