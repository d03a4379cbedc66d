import django_filters
from django import forms
from django.utils import timezone

from healthchecks.filters import PERIODS, datetime_input

from .choices import FINISHED_STATUSES, Action, Status
from .models import Repair


class RepairHistoryFilterForm(forms.Form):
    def clean(self):
        cleaned = super().clean()
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until:
            self.add_error("until", "must not be before since.")
        return cleaned


class RepairHistoryFilter(django_filters.FilterSet):
    """The Repair tab's history and its CSV export: finished repairs by node, action, status
    and time range. A repair is in a window when it was requested before the window ended
    and finished after it began."""

    node = django_filters.CharFilter(field_name="node__name", lookup_expr="icontains",
                                     label="node")
    action = django_filters.ChoiceFilter(choices=Action.choices, empty_label="any action")
    status = django_filters.ChoiceFilter(
        choices=[(s.value, s.label) for s in Status if s in FINISHED_STATUSES],
        empty_label="any outcome")
    period = django_filters.ChoiceFilter(
        choices=[(key, label) for key, (label, _) in PERIODS.items()], empty_label="all time",
        method="filter_period", label="time range")
    since = django_filters.DateTimeFilter(field_name="finished_at", lookup_expr="gte",
                                          widget=datetime_input())
    until = django_filters.DateTimeFilter(field_name="requested_at", lookup_expr="lte",
                                          widget=datetime_input())

    class Meta:
        model = Repair
        fields = ["node", "action", "status", "period", "since", "until"]
        form = RepairHistoryFilterForm

    def filter_period(self, queryset, name, value):
        return queryset.filter(finished_at__gte=timezone.now() - PERIODS[value][1])
