"""{% node_script_runs node %}: the node page's startup script runs (startup/_node_runs.html).
A tag rather than a context line, so the node page's view needs no change for it."""

from django import template

register = template.Library()

RUNS_SHOWN = 20


@register.inclusion_tag("startup/_node_runs.html")
def node_script_runs(node):
    runs = node.script_runs.select_related("script")[:RUNS_SHOWN]
    return {"script_runs": list(runs)}
