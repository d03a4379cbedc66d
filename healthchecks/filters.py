import re
from datetime import timedelta

import django_filters
from django import forms
from django.utils import timezone

from .choices import Severity, Source
from .checks import CHECKS
from .models import CheckRun, HealthEvent

# The time range presets: events active within this long before now.
PERIODS = {
    "1h": ("last hour", timedelta(hours=1)),
    "24h": ("last 24 h", timedelta(hours=24)),
    "7d": ("last 7 days", timedelta(days=7)),
    "30d": ("last 30 days", timedelta(days=30)),
}


def datetime_input():
    return forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")


class HealthEventFilterForm(forms.Form):
    def clean(self):
        cleaned = super().clean()
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until:
            self.add_error("until", "must not be before since.")
        return cleaned


class HealthEventFilter(django_filters.FilterSet):
    severity = django_filters.ChoiceFilter(choices=Severity.choices, empty_label="any severity")
    node = django_filters.CharFilter(field_name="node__name", lookup_expr="icontains", label="node")
    signature = django_filters.CharFilter(
        method="filter_signature",
        widget=forms.TextInput(attrs={"placeholder": "xid, xid:79, throttle"}),
    )
    source = django_filters.ChoiceFilter(choices=Source.choices, empty_label="any source")
    open = django_filters.BooleanFilter(
        field_name="closed_at", lookup_expr="isnull", label="status",
        widget=forms.Select(choices=[("", "open or closed"), ("true", "open"),
                                     ("false", "closed")]),
    )
    # Time range: the events active in the window, i.e. seen at or after its start and first
    # seen at or before its end. A preset and since/until may be combined: all of them apply.
    period = django_filters.ChoiceFilter(
        choices=[(key, label) for key, (label, _) in PERIODS.items()], empty_label="all time",
        method="filter_period", label="time range",
    )
    since = django_filters.DateTimeFilter(field_name="last_seen", lookup_expr="gte",
                                          widget=datetime_input())
    until = django_filters.DateTimeFilter(field_name="first_seen", lookup_expr="lte",
                                          widget=datetime_input())

    class Meta:
        model = HealthEvent
        fields = ["severity", "node", "signature", "source", "open", "period", "since", "until"]
        form = HealthEventFilterForm

    def filter_signature(self, queryset, name, value):
        """A whole signature or whole parts of one, split at ':' and '_': "xid" finds every
        Xid, "xid:4" finds Xid 4 and not Xid 43, "throttle" finds thermal_throttle."""
        parts = r"(^|[:_])" + re.escape(value.strip()) + r"($|[:_])"
        return queryset.filter(signature__iregex=parts)

    def filter_period(self, queryset, name, value):
        return queryset.filter(last_seen__gte=timezone.now() - PERIODS[value][1])


class CheckRunFilter(django_filters.FilterSet):
    node = django_filters.CharFilter(field_name="node__name", lookup_expr="exact", label="node")
    check = django_filters.ChoiceFilter(
        field_name="check_name", empty_label="any check",
        choices=[(name, check.label) for name, check in CHECKS.items()])
    status = django_filters.ChoiceFilter(choices=CheckRun.Status.choices, empty_label="any status")
    purpose = django_filters.ChoiceFilter(choices=CheckRun.Purpose.choices,
                                          empty_label="any purpose")

    class Meta:
        model = CheckRun
        fields = ["node", "check", "status", "purpose"]
