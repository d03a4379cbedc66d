import pytest


@pytest.fixture
def enqueued(monkeypatch):
    """Step ids enqueued (on commit), in order, instead of Celery: a test runs each with
    repairs.steps.run_step."""
    ids = []
    monkeypatch.setattr("repairs.services.enqueue_step", ids.append)
    monkeypatch.setattr("repairs.steps.enqueue_step", ids.append)
    return ids
