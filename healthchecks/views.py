from django.core.paginator import Paginator
from django.shortcuts import render
from django.views.decorators.http import require_GET

from clusterui.roles import Role, require_role
from clusterui.views import get_cluster_for_user

from .filters import HealthEventFilter
from .models import HealthEvent

EVENTS_PAGE_SIZE = 50


@require_GET
@require_role(Role.VIEWER)
def event_list(request, slug):
    cluster = get_cluster_for_user(request, slug)
    events = HealthEvent.objects.filter(node__cluster=cluster).select_related("node", "gpu")
    event_filter = HealthEventFilter(request.GET, queryset=events)
    matching = event_filter.qs if event_filter.is_valid() else events.none()
    page = Paginator(matching, EVENTS_PAGE_SIZE).get_page(request.GET.get("page"))
    context = {"cluster": cluster, "tab": "health", "filter": event_filter, "page": page}
    return render(
        request, "healthchecks/list.html" + ("#event-table" if request.htmx else ""), context
    )
