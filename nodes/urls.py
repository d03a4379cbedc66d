from django.urls import path

from . import views

app_name = "nodes"

urlpatterns = [
    path("", views.node_list, name="list"),
    path("<str:name>/", views.node_detail, name="detail"),
    path("<str:name>/pause/", views.node_pause, name="pause"),
    path("<str:name>/resume/", views.node_resume, name="resume"),
    path("<str:name>/gpus/accept/", views.node_accept_gpu_inventory,
         name="accept_gpu_inventory"),
]
