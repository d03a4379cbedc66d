"""/api/v1/: the API's views sign in with its tokens, not the session (LoginRequiredMiddleware
leaves them to ninja's auth); its docs (/api/v1/docs) and schema are public, as the schema
was; any other path under it is a 404 problem."""

from django.urls import re_path

from .v1 import api, unknown_path

patterns, app_name, namespace = api.urls
patterns = [*patterns, re_path(r"^.*$", unknown_path, name="unknown")]
for pattern in patterns:
    pattern.callback.login_required = False

urlpatterns = patterns
