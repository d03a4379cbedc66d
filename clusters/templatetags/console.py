from django import template
from datetime import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from common.durations import duration_text

register = template.Library()


TIME_STYLES = {"short": "%m-%d %H:%M", "minute": "%Y-%m-%d %H:%M", "second": "%Y-%m-%d %H:%M:%S"}


@register.simple_tag
def timestamp(value, style="minute"):
    """A time shown in the browser's local time, the UTC offset on hover (static/js/console.js).

    Without JavaScript it reads in UTC. style: short, minute or second.
    """
    if value is None:
        return mark_safe('<span class="muted">never</span>')
    utc = value.astimezone(timezone.utc)
    return format_html(
        '<time datetime="{}" data-style="{}" title="{}">{} UTC</time>',
        utc.isoformat(),
        style,
        utc.strftime("%Y-%m-%d %H:%M:%S UTC"),
        utc.strftime(TIME_STYLES[style]),
    )


@register.filter
def duration(seconds):
    """Seconds in words (45 s, 16 min, 3 h 05 min); "" for None."""
    return "" if seconds is None else duration_text(seconds)


@register.filter
def gib(value):
    """Bytes as GiB with one decimal."""
    if value is None:
        return "–"
    return f"{value / 2**30:,.1f} GiB"


@register.simple_tag(takes_context=True)
def query_with(context, **changes):
    """The current query string with some parameters replaced (for paging links)."""
    query = context["request"].GET.copy()
    for key, value in changes.items():
        query[key] = value
    return "?" + query.urlencode()


@register.filter
def token_status(token, now):
    return token.status(now)
