"""Reads of health events that other modules share (the node's facts, recommendations)."""

from .choices import NODE_AFFECTING
from .models import HealthEvent, Silence


def open_problem_events(node, now):
    """The node's open warning/critical events, less signatures an operator silenced,
    critical before warning, then oldest first."""
    silenced = Silence.objects.active(now).filter(node=node).values("signature")
    # "critical" sorts before "warning".
    return list(
        HealthEvent.objects.open()
        .filter(node=node, severity__in=NODE_AFFECTING)
        .exclude(signature__in=silenced)
        .select_related("gpu")
        .order_by("severity", "first_seen", "id")
    )


def describe_open_problems(events):
    """'xid:79 on GPU 3 (+1 more)' for a node's open warning/critical events, worst first."""
    if not events:
        return ""
    worst = events[0]
    text = worst.signature
    if worst.gpu is not None:
        text += f" on GPU {worst.gpu.index}"
    if len(events) > 1:
        text += f" (+{len(events) - 1} more)"
    return text
