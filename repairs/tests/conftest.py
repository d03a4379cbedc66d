import pytest


@pytest.fixture
def enqueued(monkeypatch):
    """Step ids enqueued (on commit), in order, instead of Celery: a test runs each with
    repairs.steps.run_step."""
    ids = []
    monkeypatch.setattr("repairs.services.enqueue_step", ids.append)
    monkeypatch.setattr("repairs.steps.enqueue_step", ids.append)
    return ids


@pytest.fixture
def no_tasks(monkeypatch):
    """Steps are enqueued on commit; tests that look at statuses, not at running steps, send
    them nowhere (pytestmark: pytest.mark.usefixtures("no_tasks"))."""
    monkeypatch.setattr("repairs.services.enqueue_step", lambda step_id: None)
