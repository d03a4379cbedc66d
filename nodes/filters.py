import django_filters
from django.db.models import Case, Exists, OuterRef, Q, Value, When

from .choices import NodeRole, NodeState
from .models import Node
from .wheelhouse import console_agent_version

# The worst problem first: unhealthy nodes with an open critical event, the other unhealthy
# ones, then pending, booting, paused and healthy (through the events' relation to the node:
# health sits above nodes, which never imports it; "critical" is its Severity's value).
WORST_FIRST = Case(
    When(Q(state=NodeState.UNHEALTHY) & Exists(Node.objects.filter(
        pk=OuterRef("pk"), health_events__closed_at__isnull=True,
        health_events__severity="critical")), then=Value(0)),
    When(state=NodeState.UNHEALTHY, then=Value(1)),
    When(state=NodeState.PENDING, then=Value(2)),
    When(state=NodeState.BOOTING, then=Value(3)),
    When(state=NodeState.PAUSED, then=Value(4)),
    default=Value(5),
)

# Sorts done by the database; "util" and "temp" sort by the live store's numbers (views.py).
DB_SORTS = {
    "severity": (WORST_FIRST, "name"),
    "name": ("name",),
    "state": ("state", "name"),
    "last_seen": ("-last_seen", "name"),
}
LIVE_SORTS = ("util", "temp")
SORT_CHOICES = [("severity", "worst first"), ("name", "name"), ("state", "state"),
                ("util", "GPU utilization"), ("temp", "hottest GPU"), ("last_seen", "last seen")]
DEFAULT_SORT = "severity"


class NodeFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=NodeState.choices, empty_label="any state",
                                        help_text="the node's state")
    role = django_filters.ChoiceFilter(choices=NodeRole.choices, empty_label="any role",
                                       help_text="the node's role")
    signature = django_filters.CharFilter(
        method="with_open_signature", label="signature",
        help_text="nodes with an open health event of this signature (xid:79)")
    name = django_filters.CharFilter(method="matching_text", label="search",
                                     help_text="a part of the node's name or hostname")
    agent = django_filters.ChoiceFilter(
        choices=[("other", "another release than this console's")], method="with_agent",
        empty_label="any agent", label="agent",
        help_text="other: nodes whose agent is another release than the one this console "
                  "installs (an upgrade not yet rolled out)")

    class Meta:
        model = Node
        fields = ["state", "role", "signature", "name", "agent"]

    def with_open_signature(self, queryset, name, value):
        """Nodes with an open health event of that signature. The events' model comes from
        its relation to the node: health sits above nodes, which never imports it. One table
        in the subquery keeps the plan cheap however stale the planner's statistics are."""
        events = Node._meta.get_field("health_events").related_model.objects
        open_with_it = events.filter(signature=value, closed_at__isnull=True)
        return queryset.filter(pk__in=open_with_it.values("node_id"))

    def with_agent(self, queryset, name, value):
        return (queryset.exclude(agent_version="")
                .exclude(agent_version=console_agent_version()))

    def matching_text(self, queryset, name, value):
        return queryset.filter(Q(name__icontains=value) | Q(hostname__icontains=value))
