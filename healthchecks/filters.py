import re

import django_filters
from django import forms

from common.timerange import (TimeRangeFilterForm, TimeRangeFilterMixin, period_filter,
                                 since_filter, until_filter)

from .choices import Severity, Source
from .check_catalog import CHECKS
from .models import CheckRun, HealthEvent


class HealthEventFilter(TimeRangeFilterMixin, django_filters.FilterSet):
    severity = django_filters.ChoiceFilter(choices=Severity.choices, empty_label="any severity",
                                           help_text="the event's severity")
    node = django_filters.CharFilter(field_name="node__name", lookup_expr="icontains",
                                     label="node", help_text="a part of the node's name")
    signature = django_filters.CharFilter(
        method="filter_signature",
        widget=forms.TextInput(attrs={"placeholder": "xid, xid:79, throttle"}),
        help_text="a whole signature or whole parts of one: xid finds every Xid, xid:4 finds "
                  "Xid 4 and not Xid 43, throttle finds thermal_throttle",
    )
    source = django_filters.ChoiceFilter(choices=Source.choices, empty_label="any source",
                                         help_text="the event's source")
    # Absent: open or closed (the API's default); the Health checks tab opens on "true".
    open = django_filters.ChoiceFilter(
        choices=[("true", "open"), ("false", "closed"), ("any", "open or closed")],
        empty_label=None, method="filter_open", label="status",
        help_text="open or closed events; absent: both")
    # Time range: the events active in the window, i.e. seen at or after its start and first
    # seen at or before its end. A preset and since/until may be combined: all of them apply.
    period = period_filter()
    period_field = "last_seen"
    since = since_filter("last_seen")
    until = until_filter("first_seen")

    class Meta:
        model = HealthEvent
        fields = ["severity", "node", "signature", "source", "open", "period", "since", "until"]
        form = TimeRangeFilterForm

    def filter_open(self, queryset, name, value):
        if value == "any":
            return queryset
        return queryset.filter(closed_at__isnull=value == "true")

    def filter_signature(self, queryset, name, value):
        """A whole signature or whole parts of one, split at ':' and '_': "xid" finds every
        Xid, "xid:4" finds Xid 4 and not Xid 43, "throttle" finds thermal_throttle."""
        parts = r"(^|[:_])" + re.escape(value.strip()) + r"($|[:_])"
        return queryset.filter(signature__iregex=parts)


class CheckRunFilter(django_filters.FilterSet):
    node = django_filters.CharFilter(field_name="node__name", lookup_expr="exact", label="node",
                                     help_text="the node's name")
    check = django_filters.ChoiceFilter(
        field_name="check_name", empty_label="any check",
        choices=[(name, check.label) for name, check in CHECKS.items()], help_text="the check")
    status = django_filters.ChoiceFilter(choices=CheckRun.Status.choices, empty_label="any status",
                                         help_text="the run's status")
    purpose = django_filters.ChoiceFilter(choices=CheckRun.Purpose.choices,
                                          empty_label="any purpose", help_text="why it ran")

    class Meta:
        model = CheckRun
        fields = ["node", "check", "status", "purpose"]
