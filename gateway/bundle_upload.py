"""The agent's diagnostic bundle upload, POST /agent/bundles/<bundle_id>/ (PROTOCOL.md
"Diagnostic bundles"): a Django view on the web processes, and an ASGI guard in front of
Django that answers a body without a Content-Length, or over CLUSTERUI_BUNDLE_MAX_BYTES,
before any of it is read (Django's ASGI handler spools a body to a file before the view
runs). nodes.bundles judges the rest."""

from django.conf import settings
from django.contrib.auth.decorators import login_not_required
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from nodes.bundles import receive_upload

UPLOAD_PATH = "/agent/bundles/"


@csrf_exempt
@login_not_required
@require_POST
def bundle_upload(request, bundle_id):
    answer = receive_upload(bundle_id, request.headers.get("Authorization"),
                            request.headers.get("Content-Length"),
                            request.headers.get("X-Content-SHA256"), request)
    return JsonResponse({"status": answer.status, "detail": answer.message},
                        status=answer.status)


class UploadSizeGuard:
    """ASGI middleware: an upload to UPLOAD_PATH without a Content-Length (411) or over the
    largest bundle (413) is answered at once and its body is never read."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith(UPLOAD_PATH):
            refusal = self.refusal(dict(scope["headers"]).get(b"content-length"))
            if refusal is not None:
                await self.answer(send, *refusal)
                return
        await self.app(scope, receive, send)

    @staticmethod
    def refusal(header):
        if header is None or not header.strip().isdigit():
            return 411, b'{"status": 411, "detail": "Content-Length is required"}'
        if int(header) > settings.CLUSTERUI_BUNDLE_MAX_BYTES:
            return 413, b'{"status": 413, "detail": "over the largest bundle this server takes"}'
        return None

    @staticmethod
    async def answer(send, status, body):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
