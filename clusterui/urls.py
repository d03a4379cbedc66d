from django.contrib.auth.decorators import login_not_required
from django.urls import include, path

from api import views as api_views
from api.urls import urlpatterns as api_patterns
from clusters import accounts, oidc
from clusters import views as cluster_views
from gateway.bundle_upload import bundle_upload
from gateway.views import agent_wheel, agent_wheels, metrics, metrics_targets
from overview import views as overview_views

from . import views

cluster_patterns = [
    path("clusters/", overview_views.cluster_list, name="cluster_list"),
    path("clusters/new/", overview_views.cluster_create, name="cluster_create"),
    path("audit/", cluster_views.audit_list, name="audit"),
    path("audit/export.csv", cluster_views.audit_csv, name="audit_csv"),
    path("secrets/", cluster_views.secrets_page, name="secrets"),
    path("secrets/<str:secret>/delete/", cluster_views.secret_delete, name="secret_delete"),
    path("c/<slug:slug>/", overview_views.overview, name="overview"),
    path("c/<slug:slug>/settings/", overview_views.cluster_settings, name="cluster_settings"),
    path("c/<slug:slug>/settings/agent-daemonset.yaml", overview_views.agent_daemonset,
         name="agent_daemonset"),
    path("c/<slug:slug>/settings/join-tokens/", overview_views.join_token_create,
         name="join_token_create"),
    path("c/<slug:slug>/settings/rejoin/open/", overview_views.cluster_rejoin_open,
         name="cluster_rejoin_open"),
    path("c/<slug:slug>/settings/rejoin/close/", overview_views.cluster_rejoin_close,
         name="cluster_rejoin_close"),
    path("c/<slug:slug>/settings/join-tokens/<uuid:public_id>/revoke/",
         overview_views.join_token_revoke, name="join_token_revoke"),
    path("c/<slug:slug>/kubernetes/", cluster_views.kubernetes_access, name="kubernetes_access"),
    path("c/<slug:slug>/kubernetes/kubeconfig/", cluster_views.kubeconfig_download,
         name="kubeconfig_download"),
]

urlpatterns = [
    path("", views.home, name="home"),
    # Sign-in and sign-out (clusters/accounts.py, clusters/oidc.py); the OIDC names are
    # the ones mozilla-django-oidc reverses.
    path("accounts/login/", accounts.sign_in, name="login"),
    path("accounts/logout/", accounts.sign_out, name="logout"),
    path("accounts/break-glass/", accounts.break_glass, name="break_glass"),
    path("accounts/sign-in-failed/", accounts.sign_in_failed, name="sign_in_failed"),
    path("accounts/signed-out/", accounts.signed_out, name="signed_out"),
    path("oidc/authenticate/", login_not_required(oidc.AuthenticationRequestView.as_view()),
         name="oidc_authentication_init"),
    path("oidc/callback/", login_not_required(oidc.CallbackView.as_view()),
         name="oidc_authentication_callback"),
    path("agent/bundles/<str:bundle_id>/", bundle_upload, name="agent_bundle_upload"),
    path("agent/wheels/", agent_wheels, name="agent_wheels"),
    path("agent/wheels/<str:name>", agent_wheel, name="agent_wheel"),
    path("metrics", metrics, name="metrics"),
    path("metrics/targets", metrics_targets, name="metrics_targets"),
    path("api/v1/", include((api_patterns, "api"))),
    path("account/api-tokens/", api_views.token_list, name="api_tokens"),
    path("account/api-tokens/<str:prefix>/revoke/", api_views.token_revoke,
         name="api_token_revoke"),
    path("healthz", views.healthz, name="healthz"),
    path("", include((cluster_patterns, "clusterui"))),
    path("c/<slug:slug>/nodes/", include("nodes.urls")),
    path("c/<slug:slug>/settings/scripts/", include("startup.urls")),
    path("c/<slug:slug>/settings/notifications/", include("notifications.urls")),
    path("c/<slug:slug>/health/", include("healthchecks.urls")),
    path("c/<slug:slug>/repair/", include("repairs.urls")),
    path("c/<slug:slug>/jobs/", include("jobs.urls")),
]
