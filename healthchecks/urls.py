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
    # Actions on the Nodes pages that are health's: a check on the selected nodes, and
    # accepting a node's latest hello as its GPU inventory (closing its gpu_lost events).
    path("nodes/~selected/check/", views.bulk_check, name="bulk_check"),
    path("nodes/<str:name>/gpus/accept/", views.node_accept_gpu_inventory,
         name="accept_gpu_inventory"),
]
