"""The Django project's wiring (settings, urls, asgi, celery) and the cluster itself: Cluster
and its scheduler, roles and sign-in, the audit trail, the change feed (changes.py) every
app appends to, and the cluster pages. The layers: README.md "Layout", .importlinter."""

from .celery import app as celery_app

__all__ = ("celery_app",)
