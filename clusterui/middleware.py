from django.utils.cache import patch_vary_headers


class VaryOnHtmxMiddleware:
    """Pages and their htmx fragments share URLs; caches must keep them apart."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        patch_vary_headers(response, ("HX-Request",))
        return response
