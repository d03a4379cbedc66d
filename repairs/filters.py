import django_filters

from common.timerange import (TimeRangeFilterForm, TimeRangeFilterMixin, period_filter,
                                 since_filter, until_filter)

from .choices import FINISHED_STATUSES, Action, Status
from .models import Repair


class RepairHistoryFilter(TimeRangeFilterMixin, django_filters.FilterSet):
    """The Repair tab's history and its CSV export: finished repairs by node, action, status
    and time range. A repair is in a window when it was requested before the window ended
    and finished after it began."""

    node = django_filters.CharFilter(field_name="node__name", lookup_expr="icontains",
                                     label="node", help_text="a part of the node's name")
    action = django_filters.ChoiceFilter(choices=Action.choices, empty_label="any action",
                                         help_text="the repair's action")
    status = django_filters.ChoiceFilter(
        choices=[(s.value, s.label) for s in Status if s in FINISHED_STATUSES],
        empty_label="any outcome", help_text="how it finished")
    period = period_filter()
    period_field = "finished_at"
    since = since_filter("finished_at")
    until = until_filter("requested_at")

    class Meta:
        model = Repair
        fields = ["node", "action", "status", "period", "since", "until"]
        form = TimeRangeFilterForm


class RepairFilter(RepairHistoryFilter):
    """The API's repairs list: every repair, open ones too (`status=proposed`: those waiting
    for approval), by the history's fields."""

    status = django_filters.ChoiceFilter(choices=Status.choices, empty_label="any status",
                                         help_text="its status now")

    class Meta(RepairHistoryFilter.Meta):
        pass
