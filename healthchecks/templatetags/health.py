import json

from django import template

from healthchecks.catalog import xid_code

register = template.Library()


@register.filter
def xid_entry(signature, xids):
    """The catalog entry for an `xid:<code>` signature, or None."""
    code = xid_code(signature)
    return xids.get(code) if code is not None else None


@register.filter
def headline_metrics(metrics):
    """A check's top-level numbers, [(name, value)], for its row; the rest is in 'all metrics'."""
    if not isinstance(metrics, dict):
        return []
    return [(name, value) for name, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)]


@register.filter
def pretty_json(value):
    return json.dumps(value, indent=2, sort_keys=True)
