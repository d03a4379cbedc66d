"""Where to send the browser back to: a URL the request names, only when it is this site's."""

from django.utils.http import url_has_allowed_host_and_scheme


def is_this_sites(request, url):
    """Whether `url` stays on this site (and on https when the request came over https)."""
    return url_has_allowed_host_and_scheme(url, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure())


def safe_next(request, wanted, fallback=""):
    """`wanted` (a "next" the request carries) when it is this site's, else `fallback`."""
    return wanted if is_this_sites(request, wanted) else fallback
