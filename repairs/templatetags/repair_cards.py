"""The node page's Repair section, drawn by repairs (the nodes app never imports it):
static/js/repairs.js re-fetches it from repairs:node."""

from django import template

from repairs.queries import node_repairs_context

register = template.Library()


@register.inclusion_tag("repairs/_node_repairs.html", takes_context=True)
def node_repair_card(context, node):
    return {**context.flatten(), **node_repairs_context(node, context["request"].user)}
