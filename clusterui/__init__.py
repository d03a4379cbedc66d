"""The project's wiring, on top of every layer: settings (one file, driven by the
environment), urls, asgi, celery, the static files finder, the
context processor and middleware every page goes through, and the home and /healthz views.
No models and no pages of its own. The layers: README.md "Layout", .importlinter."""

from .celery import app as celery_app

__all__ = ("celery_app",)
