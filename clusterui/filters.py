import django_filters
from django import forms
from django.db.models import Q
from django.utils import timezone

from healthchecks.filters import PERIODS, datetime_input

from .models import AuditEntry, Cluster


class AuditEntryFilterForm(forms.Form):
    def clean(self):
        cleaned = super().clean()
        since, until = cleaned.get("since"), cleaned.get("until")
        if since and until and since > until:
            self.add_error("until", "must not be before since.")
        return cleaned


class AuditEntryFilter(django_filters.FilterSet):
    """The audit trail page and its CSV export: by person, action, object, cluster and time."""

    person = django_filters.CharFilter(field_name="actor_name", lookup_expr="icontains",
                                       label="person")
    action = django_filters.CharFilter(
        field_name="action", lookup_expr="startswith",
        widget=forms.TextInput(attrs={"placeholder": "repair., node.pause"}))
    object = django_filters.CharFilter(
        method="filter_object", label="object",
        widget=forms.TextInput(attrs={"placeholder": "gpu-0042, repairs.repair"}))
    cluster = django_filters.ModelChoiceFilter(
        queryset=Cluster.objects.only("name", "slug"), to_field_name="slug",
        empty_label="any cluster")
    period = django_filters.ChoiceFilter(
        choices=[(key, label) for key, (label, _) in PERIODS.items()], empty_label="all time",
        method="filter_period", label="time range")
    since = django_filters.DateTimeFilter(field_name="at", lookup_expr="gte",
                                          widget=datetime_input())
    until = django_filters.DateTimeFilter(field_name="at", lookup_expr="lte",
                                          widget=datetime_input())

    class Meta:
        model = AuditEntry
        fields = ["person", "action", "object", "cluster", "period", "since", "until"]
        form = AuditEntryFilterForm

    def filter_object(self, queryset, name, value):
        """The object's type (e.g. repairs.repair), its id or its name."""
        value = value.strip()
        return queryset.filter(Q(object_type__icontains=value) | Q(object_id=value)
                               | Q(object_repr__icontains=value))

    def filter_period(self, queryset, name, value):
        return queryset.filter(at__gte=timezone.now() - PERIODS[value][1])
