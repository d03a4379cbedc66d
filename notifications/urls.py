from django.urls import path

from . import views

app_name = "notifications"

urlpatterns = [
    path("", views.channel_list, name="list"),
    path("new/", views.channel_create, name="create"),
    path("<int:channel_id>/", views.channel_detail, name="detail"),
    path("<int:channel_id>/deliveries/", views.channel_deliveries, name="deliveries"),
    path("<int:channel_id>/test/", views.channel_test, name="test"),
    path("<int:channel_id>/rotate-key/", views.channel_rotate, name="rotate"),
    path("<int:channel_id>/delete/", views.channel_delete, name="delete"),
]
