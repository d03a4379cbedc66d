"""Serve plotly.js straight from the installed plotly package: no CDN, no JS build."""

from django.conf import settings
from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

VENDORED = {"vendor/plotly.min.js": settings.PLOTLY_JS}


class VendoredPackageFinder(BaseFinder):
    def check(self, **kwargs):
        return []

    def find(self, path, find_all=False, **kwargs):
        match = str(VENDORED[path]) if path in VENDORED else None
        if find_all:
            return [match] if match else []
        return match

    def list(self, ignore_patterns):
        for path, source in VENDORED.items():
            storage = FileSystemStorage(location=source.parent)
            storage.prefix = path.rsplit("/", 1)[0]
            yield source.name, storage
