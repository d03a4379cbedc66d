import django_filters

from .choices import Severity
from .models import HealthEvent


class HealthEventFilter(django_filters.FilterSet):
    severity = django_filters.ChoiceFilter(choices=Severity.choices, empty_label="any severity")
    node = django_filters.CharFilter(field_name="node__name", lookup_expr="icontains", label="node")
    signature = django_filters.CharFilter(lookup_expr="icontains")
    open = django_filters.BooleanFilter(
        field_name="closed_at", lookup_expr="isnull", label="open only"
    )

    class Meta:
        model = HealthEvent
        fields = ["severity", "node", "signature", "open"]
