from django.urls import path

from . import views

app_name = "healthchecks"

urlpatterns = [
    path("", views.event_list, name="list"),
]
