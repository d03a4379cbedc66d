from django import forms

from clusters.forms import ClusterSettingsForm
from healthchecks.check_catalog import ACCEPTANCE_CHECKS, CHECKS
from nodes.choices import NodeState


class TimelineFilterForm(forms.Form):
    node = forms.CharField(required=False, max_length=63)
    state = forms.ChoiceField(
        required=False, choices=[("", "any state"), *NodeState.choices], label="to state"
    )
    routine = forms.BooleanField(required=False, label="routine too",
                                 help_text="registrations, first boots, boot windows ending")
    page = forms.IntegerField(required=False, min_value=1)


def battery_choices():
    return [(check.name, f"{check.label}: {check.description}") for check in CHECKS.values()]


class BatteryField(forms.MultipleChoiceField):
    when_empty = ACCEPTANCE_CHECKS  # what no check ticked (stored "") runs

    def to_python(self, value):
        """A blank value (the stored "", posted as it is) ticks nothing."""
        return [name for name in super().to_python(value) if name]


class BatteryChoice(forms.ModelForm):
    """Cluster.acceptance_checks as the catalog's checks to tick (stored space-separated)."""

    acceptance_checks = BatteryField(
        choices=battery_choices, required=False, widget=forms.CheckboxSelectMultiple,
        label="the acceptance battery",
        help_text="Run in this order on each new node, each against its GPU model's baseline. "
                  "None ticked: the default battery.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        stored = self.initial.get("acceptance_checks") or ""
        if isinstance(stored, str):
            self.initial["acceptance_checks"] = stored.split() or list(ACCEPTANCE_CHECKS)

    def clean_acceptance_checks(self):
        """Space-separated in the catalog's order; "" for the default battery."""
        chosen = [name for name in CHECKS if name in self.cleaned_data["acceptance_checks"]]
        return "" if tuple(chosen) == ACCEPTANCE_CHECKS else " ".join(chosen)


class ClusterSettingsPageForm(BatteryChoice, ClusterSettingsForm):
    class Meta(ClusterSettingsForm.Meta):
        pass
