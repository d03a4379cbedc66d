"""What several repair tests do the same way."""

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from repairs import steps


def past_the_bundle(enqueued, now=None):
    """Run the enqueued collect_bundle step with no agent to answer it: the bundle is asked
    for, and past its deadline the repair goes on without it (the next step enqueued)."""
    step_id = enqueued.pop(0)
    asked = steps.run_step(step_id, now=now)
    assert "asked the agent for a diagnostic bundle" in asked.message, asked
    later = (now or timezone.now()) + timedelta(seconds=settings.CLUSTERUI_BUNDLE_DEADLINE_S + 1)
    went_on = steps.run_step(step_id, now=later)
    assert isinstance(went_on, steps.Done) and "no diagnostic bundle" in went_on.message, went_on
    return went_on
