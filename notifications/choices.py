from django.db import models


class AlertKind(models.TextChoices):
    """What a notification rule can ask for (issue 16). The first four stay firing while
    their condition holds and send a resolved message when it ends; the last three are
    one-off happenings, sent once."""

    REPAIR_AWAITING_APPROVAL = "repair_awaiting_approval", "a repair awaits approval"
    REPAIR_STUCK = "repair_stuck", "a repair is stuck"
    REPAIR_PAST_DEADLINE = "repair_past_deadline", "a repair waits for jobs past its deadline"
    NODE_UNHEALTHY = "node_unhealthy", "a node is unhealthy"
    CLUSTER_DEGRADED = "cluster_degraded", "the cluster is degraded"
    REPAIR_FAILED = "repair_failed", "a repair failed"
    ACCEPTANCE_FAILED = "acceptance_failed", "acceptance tests failed"
    SCRIPT_FAILED = "script_failed", "a startup script failed"


ONE_OFF_KINDS = (AlertKind.REPAIR_FAILED, AlertKind.ACCEPTANCE_FAILED, AlertKind.SCRIPT_FAILED)
