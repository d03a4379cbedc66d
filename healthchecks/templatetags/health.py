from django import template

register = template.Library()


@register.filter
def xid_entry(signature, xids):
    """The catalog entry for an `xid:<code>` signature, or None."""
    kind, _, code = signature.partition(":")
    return xids.get(int(code)) if kind == "xid" and code.isdigit() else None
