from urllib.parse import urlencode, urlsplit

from django.conf import settings
from django.contrib.auth import REDIRECT_FIELD_NAME
from django.http import HttpResponse
from django.shortcuts import resolve_url
from django.urls import reverse
from django.utils.cache import patch_vary_headers
from django.utils.functional import cached_property
from mozilla_django_oidc.middleware import SessionRefresh

from common.redirects import is_this_sites


class VaryOnHtmxMiddleware:
    """Pages and their htmx fragments share URLs; caches must keep them apart."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        patch_vary_headers(response, ("HX-Request",))
        return response


class SignInRedirectMiddleware(SessionRefresh):
    """Sends people to sign in, in a way htmx can follow.

    With OpenID Connect on, a signed-in user's page loads go by the provider again every
    OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS (mozilla-django-oidc's SessionRefresh: a redirect to
    the provider with prompt=none, silent while the IdP session lasts; it re-syncs the role).

    An htmx request cannot follow that redirect (the browser's XHR would follow it across
    origins, out of sight), nor LoginRequiredMiddleware's redirect of an anonymous request
    (the sign-in page would be swapped into a fragment). For htmx requests both become a 401
    with HX-Redirect to the sign-in page, whose `next` is the page the browser is on, not the
    fragment's URL. Plain requests keep the redirect. Sits before LoginRequiredMiddleware.
    """

    @cached_property
    def exempt_urls(self):
        # mozilla-django-oidc's own list names its logout view, which clusterui replaces.
        names = [*settings.OIDC_EXEMPT_URLS, "oidc_authentication_init",
                 "oidc_authentication_callback"]
        return {reverse(name) for name in names}

    def process_request(self, request):
        if not settings.CLUSTERUI_OIDC_ENABLED:
            return None
        return super().process_request(request)

    def process_response(self, request, response):
        if request.headers.get("HX-Request") != "true" or not is_sign_in_redirect(response):
            return response
        client_redirect = HttpResponse(status=401)
        client_redirect["HX-Redirect"] = sign_in_url_for_htmx(request)
        return client_redirect


def is_sign_in_redirect(response):
    if response.status_code not in (301, 302, 303, 307, 308):
        return False
    location = response.get("Location", "")
    if urlsplit(location).path == resolve_url(settings.LOGIN_URL):
        return True
    endpoint = settings.OIDC_OP_AUTHORIZATION_ENDPOINT
    return bool(settings.CLUSTERUI_OIDC_ENABLED and endpoint and location.startswith(endpoint))


def sign_in_url_for_htmx(request):
    """The sign-in URL, coming back to the page htmx made the request from."""
    sign_in = resolve_url(settings.LOGIN_URL)
    current = request.headers.get("HX-Current-URL", "")
    if not is_this_sites(request, current):
        return sign_in
    parts = urlsplit(current)
    page = parts.path + (f"?{parts.query}" if parts.query else "")
    return f"{sign_in}?{urlencode({REDIRECT_FIELD_NAME: page})}"
