"""The JSON API, /api/v1/ on django-ninja (layer 2): per-user API tokens, and the pages'
reads and actions through the same services, with problem-details errors."""
