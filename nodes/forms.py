from django import forms

from healthchecks.checks import ACCEPTANCE_CHECKS
from healthchecks.forms import ACCEPTANCE_BATTERY, RunCheckForm
from healthchecks.models import CheckRun

from .choices import NodeRole
from .services import REJOIN_MAX_HOURS

ROLE_ERRORS = {"required": "Pick a role.",
               "invalid_choice": "%(value)s is not a role: pick worker, login or controller."}


class PauseNodeForm(forms.Form):
    reason = forms.CharField(max_length=200, help_text="Why: shown on the node and the timeline.")


class RejoinForm(forms.Form):
    """Open a node (or a whole cluster) to re-join for a while (PROTOCOL.md)."""
    hours = forms.IntegerField(min_value=1, max_value=REJOIN_MAX_HOURS, initial=2,
                               error_messages={"required": "Say for how many hours."})


class RemoveNodeForm(forms.Form):
    reason = forms.CharField(max_length=200, error_messages={
        "required": "Say why the node is removed: it goes on the audit trail."})


class NodeRoleForm(forms.Form):
    role = forms.ChoiceField(choices=NodeRole.choices, error_messages=ROLE_ERRORS)


class BulkNodesForm(forms.Form):
    """Nodes of one cluster, chosen by name in the Nodes tab's list."""

    nodes = forms.ModelMultipleChoiceField(queryset=None, to_field_name="name",
                                           error_messages={"required": "Select some nodes."})

    def __init__(self, *args, cluster, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["nodes"].queryset = cluster.nodes.select_related("cluster").order_by("name")


class BulkPauseForm(BulkNodesForm):
    reason = forms.CharField(max_length=200, error_messages={
        "required": "Say why the nodes are paused."})


class BulkRoleForm(BulkNodesForm):
    role = forms.ChoiceField(choices=NodeRole.choices, error_messages=ROLE_ERRORS)


class BulkCheckForm(BulkNodesForm):
    check = forms.ChoiceField()

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The same choices as a single node's "run a check" (the acceptance battery included).
        self.fields["check"].choices = RunCheckForm(cluster=None).fields["check"].choices

    def checks_and_purpose(self):
        if self.cleaned_data["check"] == ACCEPTANCE_BATTERY:
            return ACCEPTANCE_CHECKS, CheckRun.Purpose.ACCEPTANCE
        return (self.cleaned_data["check"],), CheckRun.Purpose.ON_DEMAND
