"""What an action on a Nodes page answers with, whichever app's view took it: htmx swaps
the part of the page it changed, a plain form goes back to the page."""

from django.contrib import messages
from django.shortcuts import redirect, render
from django.urls import reverse

from .forms import PauseNodeForm
from .queries import node_list_context


def bulk_response(request, cluster, form):
    """After a bulk operation: htmx swaps the list (with the same filters, from the query
    string) and the messages; a plain form goes back to the list."""
    for errors in form.errors.values():
        messages.error(request, " ".join(errors))
    if not request.htmx:
        query = request.GET.urlencode()
        return redirect(reverse("nodes:list", args=[cluster.slug]) + (f"?{query}" if query else ""))
    context = {"cluster": cluster, "tab": "nodes", "bulk_response": True,
               **node_list_context(cluster, request.GET)}
    return render(request, "nodes/list.html#node-table", context)


def node_status_or_redirect(request, node):
    """After an operation: htmx swaps the node's status panel; a plain form goes back."""
    if not request.htmx:
        return redirect(node)
    node.refresh_from_db()
    context = {"cluster": node.cluster, "node": node, "pause_form": PauseNodeForm()}
    return render(request, "nodes/detail.html#node-status", context)


def bulk_summary(done, outcomes, otherwise):
    """'paused 5; 2 were already paused' from one boolean per node."""
    changed = sum(outcomes)
    text = f"{done.capitalize()} {changed} node{'s' if changed != 1 else ''}"
    unchanged = len(outcomes) - changed
    if unchanged:
        text += f"; {unchanged} {'was' if unchanged == 1 else 'were'} {otherwise}"
    return text + "."

