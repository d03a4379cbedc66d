from django.urls import path

from . import views

app_name = "repairs"

urlpatterns = [
    path("", views.repair_list, name="list"),
    path("history.csv", views.history_csv, name="history_csv"),
    path("settings/", views.repair_settings, name="settings"),
    path("settings/policy/", views.repair_policy, name="policy"),
    path("node/<str:name>/", views.node_repairs, name="node"),
    path("node/<str:name>/propose/", views.repair_propose, name="propose"),
    path("node/<str:name>/recommend-again/", views.repair_recommend_again,
         name="recommend_again"),
    path("<uuid:public_id>/", views.repair_detail, name="detail"),
    path("<uuid:public_id>/approve/", views.repair_approve, name="approve"),
    path("<uuid:public_id>/reject/", views.repair_reject, name="reject"),
    path("<uuid:public_id>/cancel/", views.repair_cancel, name="cancel"),
    path("<uuid:public_id>/abort/", views.repair_abort, name="abort"),
    path("<uuid:public_id>/go-on-now/", views.repair_go_on_now, name="go_on_now"),
]
