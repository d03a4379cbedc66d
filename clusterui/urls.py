from django.contrib.auth import views as auth_views
from django.urls import include, path

from nodes.views import metrics

from . import views

cluster_patterns = [
    path("clusters/", views.cluster_list, name="cluster_list"),
    path("clusters/new/", views.cluster_create, name="cluster_create"),
    path("audit/", views.audit_list, name="audit"),
    path("audit/export.csv", views.audit_csv, name="audit_csv"),
    path("c/<slug:slug>/", views.overview, name="overview"),
    path("c/<slug:slug>/settings/", views.cluster_settings, name="cluster_settings"),
    path("c/<slug:slug>/settings/join-tokens/", views.join_token_create,
         name="join_token_create"),
    path("c/<slug:slug>/settings/join-tokens/<uuid:public_id>/revoke/", views.join_token_revoke,
         name="join_token_revoke"),
    path("c/<slug:slug>/kubernetes/", views.kubernetes_access, name="kubernetes_access"),
    path("c/<slug:slug>/kubernetes/kubeconfig/", views.kubeconfig_download,
         name="kubeconfig_download"),
]

urlpatterns = [
    path("", views.home, name="home"),
    path("accounts/login/", auth_views.LoginView.as_view(redirect_authenticated_user=True),
         name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("metrics", metrics, name="metrics"),
    path("healthz", views.healthz, name="healthz"),
    path("", include((cluster_patterns, "clusterui"))),
    path("c/<slug:slug>/nodes/", include("nodes.urls")),
    path("c/<slug:slug>/health/", include("healthchecks.urls")),
    path("c/<slug:slug>/repair/", include("repairs.urls")),
]
