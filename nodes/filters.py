import django_filters

from .choices import NodeState
from .models import Node


class NodeFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=NodeState.choices, empty_label="any state")
    name = django_filters.CharFilter(field_name="name", lookup_expr="icontains", label="name")

    class Meta:
        model = Node
        fields = ["state", "name"]
