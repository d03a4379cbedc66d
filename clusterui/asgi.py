import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "clusterui.settings")

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from gateway import daphne_closes, daphne_upgrades  # noqa: E402
from gateway.bundle_upload import UploadSizeGuard  # noqa: E402
from gateway.routing import websocket_urlpatterns  # noqa: E402

from common import gc_tuning  # noqa: E402

# The URLconf (every view, and the API's schemas) imported at start, not by the first
# request: Django resolves a request's URL on the event loop, and the import held it for
# 0.4 s of CPU and more on a busy core, every agent's frames and every page waiting
# (py-spy, bench/README.md "Embedded mode"). Before the freeze below, as the rest.
from django.urls import get_resolver  # noqa: E402

get_resolver().url_patterns

# Agents' WebSocket upgrades a few per turn of daphne's loop: pages never wait behind a
# fleet's handshakes (gateway/daphne_upgrades.py).
daphne_upgrades.install()
# Its WebSocket close frames written before a peer that does not answer them is dropped
# (gateway/daphne_closes.py).
daphne_closes.install()

application = ProtocolTypeRouter(
    {
        "http": UploadSizeGuard(django_asgi_app),
        "websocket": URLRouter(websocket_urlpatterns),
    }
)

# Last: what the server loaded so far lives as long as the process, and is frozen
# (common/gc_tuning.py: full collections stopped the event loop for up to 400 ms).
gc_tuning.apply()
