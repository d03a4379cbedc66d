"""Per-user API tokens (issue 16): a token acts as its user, with the user's role."""

from django.conf import settings
from django.db import models


class ApiTokenQuerySet(models.QuerySet):
    def usable(self, now):
        return self.filter(revoked_at__isnull=True, expires_at__gt=now, user__is_active=True)


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="what it is for, e.g. 'pagerduty bot'")
    prefix = models.CharField(max_length=16, unique=True,
                              help_text="the token's first characters: how lists name it")
    secret_hash = models.CharField(max_length=64, unique=True, help_text="SHA-256 of the token")
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"API token {self.prefix}… ({self.name}) of {self.user}"
