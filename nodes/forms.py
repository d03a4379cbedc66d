from django import forms

from . import maintenance
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


class MaintenanceWindowForm(forms.Form):
    """A maintenance window: once (from starts_at, until ends_at or until ended by hand) or
    recurring (each time of a cron expression, for duration_minutes), over named nodes or the
    whole cluster."""

    reason = forms.CharField(max_length=300)
    nodes = forms.CharField(
        required=False, max_length=10000, widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Node names, separated by spaces or commas; empty: the whole cluster (no "
                  "repair anywhere: how a cluster is paused).")
    starts_at = forms.DateTimeField(help_text="The console's time zone (TIME_ZONE, UTC unless "
                                              "set), e.g. 2026-12-05 02:00.")
    ends_at = forms.DateTimeField(required=False, help_text="Empty: until someone ends it.")
    cron = forms.CharField(
        required=False, max_length=100, label="recurring at (cron, UTC)",
        help_text="Empty: once. Else each occurrence starts at these times from starts_at on, "
                  "e.g. '0 2 * * 6' for Saturdays at 02:00.")
    duration_minutes = forms.IntegerField(required=False, min_value=1, max_value=7 * 24 * 60,
                                          help_text="Recurring: how long each occurrence lasts.")

    def __init__(self, *args, cluster, **kwargs):
        super().__init__(*args, **kwargs)
        self.cluster = cluster

    def clean_nodes(self):
        names = [name for name in self.cleaned_data["nodes"].replace(",", " ").split() if name]
        found = list(self.cluster.nodes.filter(name__in=names))
        unknown = sorted(set(names) - {node.name for node in found})
        if unknown:
            raise forms.ValidationError(f"No such node in this cluster: {', '.join(unknown)}.")
        return found

    def clean(self):
        cleaned = super().clean()
        starts, ends = cleaned.get("starts_at"), cleaned.get("ends_at")
        if starts and ends and ends <= starts:
            self.add_error("ends_at", "It must end after it starts.")
        cron, duration = cleaned.get("cron", ""), cleaned.get("duration_minutes")
        if cron:
            problem = maintenance.cron_problem(cron)
            if problem:
                self.add_error("cron", f"Not a cron expression: {problem}.")
            if not duration:
                self.add_error("duration_minutes", "A recurring window needs a duration.")
        elif duration:
            self.add_error("duration_minutes", "A duration is for a recurring window (cron).")
        return cleaned


class MaintenanceWindowChangeForm(forms.Form):
    """What may change in a window once made: why, and when it ends (empty: until ended)."""

    reason = forms.CharField(max_length=300)
    ends_at = forms.DateTimeField(required=False, help_text="Empty: until someone ends it.")

    def __init__(self, *args, window, **kwargs):
        super().__init__(*args, **kwargs)
        self.window = window

    def clean_ends_at(self):
        ends = self.cleaned_data["ends_at"]
        if ends is not None and ends <= self.window.starts_at:
            raise forms.ValidationError("It must end after it starts.")
        return ends


class JoinTokenForm(forms.Form):
    note = forms.CharField(max_length=200, required=False,
                           help_text="What it is for, e.g. 'rack 12 provisioning'.")
    expires_in_hours = forms.IntegerField(
        min_value=1, max_value=24 * 365, initial=24,
        help_text="It stops working after this many hours (a leaked one does not last).")
    single_use = forms.BooleanField(
        required=False, help_text="It stops working once one node has joined with it.")
