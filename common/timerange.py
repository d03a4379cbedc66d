"""The time range filter the events, repairs history and audit trail pages share: a preset
period (the last hour ... the last 30 days), since and until. Each FilterSet says which of
its model's time fields each one filters on; a preset and since/until may be combined, and
all of them apply."""

from datetime import timedelta

import django_filters
from django import forms
from django.utils import timezone

# The time range presets: within this long before now.
PERIODS = {
    "1h": ("last hour", timedelta(hours=1)),
    "24h": ("last 24 h", timedelta(hours=24)),
    "7d": ("last 7 days", timedelta(days=7)),
    "30d": ("last 30 days", timedelta(days=30)),
}


def datetime_input():
    return forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M")


def period_filter():
    """A preset; the FilterSet's filter_period() applies it (see TimeRangeFilterMixin)."""
    return django_filters.ChoiceFilter(
        choices=[(key, label) for key, (label, _) in PERIODS.items()], empty_label="all time",
        method="filter_period", label="time range")


def since_filter(field_name):
    """At or after since: `field_name` >= since."""
    return django_filters.DateTimeFilter(field_name=field_name, lookup_expr="gte",
                                         widget=datetime_input())


def until_filter(field_name):
    """At or before until: `field_name` <= until."""
    return django_filters.DateTimeFilter(field_name=field_name, lookup_expr="lte",
                                         widget=datetime_input())


class TimeRangeFilterMixin:
    """filter_period() for a FilterSet with period_filter(): `period_field` >= now - period."""

    period_field = None

    def filter_period(self, queryset, name, value):
        cutoff = timezone.now() - PERIODS[value][1]
        return queryset.filter(**{f"{self.period_field}__gte": cutoff})


class TimeRangeFilterForm(forms.Form):
    """The form of a FilterSet with since and until: until must not be before since."""

    def clean(self):
        cleaned = super().clean()
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until:
            self.add_error("until", "must not be before since.")
        return cleaned
