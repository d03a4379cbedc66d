from django import forms

from nodes.forms import BulkNodesForm

from .check_catalog import CHECKS, acceptance_battery
from .models import CheckRun


class ResolveForm(forms.Form):
    comment = forms.CharField(max_length=200, help_text="What was done, or why it is over.")


class SilenceForm(forms.Form):
    hours = forms.FloatField(min_value=0.25, max_value=24 * 14, initial=4)
    reason = forms.CharField(max_length=200)


ACCEPTANCE_BATTERY = "acceptance"


def check_choices():
    """Every check by name, and "acceptance": the whole battery."""
    return [*((check.name, check.label) for check in CHECKS.values()),
            (ACCEPTANCE_BATTERY, "Acceptance tests (the whole battery)")]


def checks_and_purpose(choice, cluster):
    """What a check choice runs: the cluster's acceptance battery, or that one check on
    demand."""
    if choice == ACCEPTANCE_BATTERY:
        return acceptance_battery(cluster), CheckRun.Purpose.ACCEPTANCE
    return (choice,), CheckRun.Purpose.ON_DEMAND


class RunCheckForm(forms.Form):
    """Which check to run on which node of the cluster; "acceptance" runs the whole battery."""

    node = forms.CharField(max_length=63)
    check = forms.ChoiceField()

    def __init__(self, *args, cluster, **kwargs):
        super().__init__(*args, **kwargs)
        self.cluster = cluster
        self.fields["check"].choices = check_choices()

    def clean_node(self):
        name = self.cleaned_data["node"]
        node = self.cluster.nodes.filter(name=name).first()
        if node is None:
            raise forms.ValidationError(f"No node {name} in {self.cluster.name}.")
        return node

    def checks_and_purpose(self):
        return checks_and_purpose(self.cleaned_data["check"], self.cluster)


class BulkCheckForm(BulkNodesForm):
    """The Nodes list's "run a check" on the selected nodes: the same choices as one node's."""

    check = forms.ChoiceField()

    def __init__(self, *args, cluster, **kwargs):
        super().__init__(*args, cluster=cluster, **kwargs)
        self.cluster = cluster
        self.fields["check"].choices = check_choices()

    def checks_and_purpose(self):
        return checks_and_purpose(self.cleaned_data["check"], self.cluster)
