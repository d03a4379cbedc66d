from django import template

from jobs.queries import node_jobs_context

register = template.Library()


@register.inclusion_tag("jobs/_node_jobs.html", takes_context=True)
def node_jobs(context, node):
    """The node page's jobs panel; one query. A tag rather than a line in node_detail's
    context so the panel comes with its own data wherever a node page includes it."""
    return {"cluster": context["cluster"], "node": node, **node_jobs_context(node)}
