from django.db import models


class Severity(models.TextChoices):
    INFO = "info", "info"
    WARNING = "warning", "warning"
    CRITICAL = "critical", "critical"


# Severities that make a node unhealthy while an event of theirs is open.
NODE_AFFECTING = (Severity.WARNING, Severity.CRITICAL)


class Source(models.TextChoices):
    PASSIVE = "passive", "passive"
    ACTIVE = "active", "active"
