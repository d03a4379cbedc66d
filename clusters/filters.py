import django_filters
from django import forms
from django.db.models import Q

from .models import AuditEntry, Cluster
from common.timerange import (TimeRangeFilterForm, TimeRangeFilterMixin, period_filter,
                        since_filter, until_filter)


class AuditEntryFilter(TimeRangeFilterMixin, django_filters.FilterSet):
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
    period = period_filter()
    period_field = "at"
    since = since_filter("at")
    until = until_filter("at")

    class Meta:
        model = AuditEntry
        fields = ["person", "action", "object", "cluster", "period", "since", "until"]
        form = TimeRangeFilterForm

    def filter_object(self, queryset, name, value):
        """The object's type (e.g. repairs.repair), its id or its name."""
        value = value.strip()
        return queryset.filter(Q(object_type__icontains=value) | Q(object_id=value)
                               | Q(object_repr__icontains=value))
