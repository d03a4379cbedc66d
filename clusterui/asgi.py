import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clusterui.settings")

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from gateway.bundle_upload import UploadSizeGuard  # noqa: E402
from gateway.routing import websocket_urlpatterns  # noqa: E402

from common import gc_tuning  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": UploadSizeGuard(django_asgi_app),
        "websocket": URLRouter(websocket_urlpatterns),
    }
)

# Last: what the server loaded so far lives as long as the process, and is frozen
# (common/gc_tuning.py: full collections stopped the event loop for up to 400 ms).
gc_tuning.apply()
