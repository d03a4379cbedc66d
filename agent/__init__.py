"""The clusterui node agent: reads the GPUs (NVML) and the node (psutil) and reports them
to the clusterui server over one WebSocket, as shared/PROTOCOL.md describes.

A standalone package: it imports nothing from the Django project."""

__version__ = "1.0.0"
