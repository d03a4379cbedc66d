from django.urls import path

from . import views

app_name = "healthchecks"

urlpatterns = [
    path("", views.event_list, name="list"),
    path("checks/", views.check_runs, name="runs"),
    path("checks/run/", views.run_check, name="run"),
    path("<uuid:public_id>/acknowledge/", views.event_acknowledge, name="acknowledge"),
    path("<uuid:public_id>/resolve/", views.event_resolve, name="resolve"),
    path("<uuid:public_id>/silence/", views.event_silence, name="silence"),
]
