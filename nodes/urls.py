from django.urls import path

from . import views

app_name = "nodes"

# "~selected" and "~maintenance" are no node's name ('~' is not allowed in one): the bulk operations' routes
# never shadow a node's.
urlpatterns = [
    path("", views.node_list, name="list"),
    path("~selected/pause/", views.bulk_pause, name="bulk_pause"),
    path("~selected/resume/", views.bulk_resume, name="bulk_resume"),
    path("~maintenance/", views.maintenance, name="maintenance"),
    path("~maintenance/<int:window_id>/", views.maintenance_change, name="maintenance_change"),
    path("~maintenance/<int:window_id>/end/", views.maintenance_end, name="maintenance_end"),
    path("~selected/role/", views.bulk_set_role, name="bulk_set_role"),
    path("<str:name>/", views.node_detail, name="detail"),
    path("<str:name>/charts/", views.node_charts, name="charts"),
    path("<str:name>/live/", views.node_live, name="live"),
    path("<str:name>/hygiene/", views.node_hygiene, name="hygiene"),
    path("<str:name>/cleanup/", views.node_cleanup, name="cleanup"),
    path("<str:name>/pause/", views.node_pause, name="pause"),
    path("<str:name>/resume/", views.node_resume, name="resume"),
    path("<str:name>/role/", views.node_set_role, name="set_role"),
    path("<str:name>/rejoin/open/", views.node_rejoin_open, name="rejoin_open"),
    path("<str:name>/rejoin/close/", views.node_rejoin_close, name="rejoin_close"),
    path("<str:name>/remove/", views.node_remove, name="remove"),
    path("<str:name>/bundles/", views.bundle_request, name="bundle_request"),
    path("<str:name>/bundles/<uuid:public_id>/", views.bundle_download, name="bundle_download"),
]
