import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clusterui.settings")

app = Celery("clusterui")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
