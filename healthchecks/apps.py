from django.apps import AppConfig


class HealthchecksConfig(AppConfig):
    name = "healthchecks"
    verbose_name = "health checks"
