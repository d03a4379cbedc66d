"""Health's template tags. Besides formatting, they draw health's sections of the Nodes
pages (the node page's open events, inventory review and checks; the list's worst open
signals, open signatures and check choices), so the nodes app never imports health to show
them: its templates load this library."""

import json
from datetime import timedelta

from django import template
from django.utils import timezone
from django.http import QueryDict

from healthchecks.forms import RunCheckForm, check_choices as all_check_choices
from healthchecks.gpu_lost import review_gpu_inventory
from healthchecks.queries import (
    check_runs_context,
    held_signal_text,
    open_events_by_signature,
    worst_open_signals,
)
from healthchecks.xid_catalog import xid_code

register = template.Library()


@register.simple_tag
def held_for(event):
    """"held 16 min, up to 88 °C" for a held signal; "" otherwise."""
    return held_signal_text(event, timezone.now())


# The Jobs tab's period fields (datetime-local inputs): local time, whole seconds.
JOBS_PERIOD_FORMAT = "%Y-%m-%dT%H:%M:%S"


@register.simple_tag
def jobs_at_the_time(event):
    """The Jobs tab's query for the jobs on the event's node while it was open: its period in
    the form's own format (so the fields show it), whole seconds, at least one second long (a
    notice opens and closes within one)."""
    start = timezone.localtime(event.first_seen).replace(microsecond=0)
    query = QueryDict(mutable=True)
    query.update({"node": event.node.name, "start": start.strftime(JOBS_PERIOD_FORMAT)})
    if event.closed_at is not None:
        end = timezone.localtime(event.closed_at).replace(microsecond=0) + timedelta(seconds=1)
        query["end"] = end.strftime(JOBS_PERIOD_FORMAT)
    return query.urlencode()


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


@register.simple_tag
def worst_open_signal_of(cluster, nodes, page):
    """{node id: "xid:79 on GPU 3"}: the worst open event of each node shown (one query; the
    whole cluster's for the grid, which has no page)."""
    return worst_open_signals(cluster, [node.pk for node in nodes] if page else None)


@register.filter
def signal_of(signals, node):
    return signals.get(node.pk, "")


@register.simple_tag
def open_signatures(cluster):
    """The signatures of the cluster's open events, worst first (the list's filter offers them)."""
    return [row["signature"] for row in open_events_by_signature(cluster)]


@register.simple_tag
def check_choices():
    return all_check_choices()


@register.inclusion_tag("healthchecks/_node_events.html", takes_context=True)
def node_health_events(context, node):
    """The node page's open health events."""
    return {**context.flatten(), "open_events": node.health_events.open().select_related("gpu")}


@register.inclusion_tag("healthchecks/_inventory_review.html", takes_context=True)
def node_inventory_review(context, node):
    """Under the node page's GPUs: how the latest hello differs from the inventory, and the
    button that accepts it."""
    return {**context.flatten(), "inventory_review": review_gpu_inventory(node)}


@register.inclusion_tag("healthchecks/_node_checks.html", takes_context=True)
def node_check_runs(context, node):
    """The node page's Checks section: its check runs, and the form that runs one."""
    runs = node.check_runs.select_related("node", "requested_by", "health_event")
    return {**context.flatten(), "run_form": RunCheckForm(cluster=node.cluster),
            **check_runs_context(node.cluster, runs, QueryDict(f"node={node.name}"), node=node)}
