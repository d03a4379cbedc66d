from django import forms

from clusters.forms import ClusterSettingsForm
from clusters.secret_store import SecretsUnavailable, seal, unseal
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


SEALED = "sealed:"


def sealed(value):
    """A secret the admin typed, as the page carries it: sealed (clusters.secret_store.seal),
    or nothing when the store has no key (the field's error says so)."""
    if not value or str(value).startswith(SEALED):
        return value
    try:
        return SEALED + seal(str(value))
    except SecretsUnavailable:
        return ""


class SealedPasswordInput(forms.PasswordInput):
    def __init__(self, attrs=None):
        super().__init__(attrs, render_value=True)

    def format_value(self, value):
        return super().format_value(sealed(value))


class SealedHiddenInput(forms.HiddenInput):
    def format_value(self, value):
        return super().format_value(sealed(value))


class SealedSecretField(forms.CharField):
    """A secret typed on one step of a multi-step page and used on a later one (the creation
    page's notification channel URL): the page shows it back, and posts it on, only sealed,
    so its HTML never holds it. A sealed value older than MAX_AGE_S, or changed, is refused."""

    widget = SealedPasswordInput
    hidden_widget = SealedHiddenInput
    MAX_AGE_S = 24 * 3600

    def to_python(self, value):
        value = super().to_python(value)
        if not value.startswith(SEALED):
            return value
        try:
            opened = unseal(value.removeprefix(SEALED), max_age_s=self.MAX_AGE_S)
        except SecretsUnavailable as exc:
            raise forms.ValidationError(str(exc)) from None
        if opened is None:
            raise forms.ValidationError("This page was open for over a day, or the value was "
                                        "changed: enter it again.")
        return opened

    def widget_attrs(self, widget):
        attrs = super().widget_attrs(widget)
        attrs.pop("maxlength", None)  # a sealed value is longer than the value: checked here
        return attrs

    def validate(self, value):
        super().validate(value)
        if value:
            try:
                seal(value)
            except SecretsUnavailable as exc:
                raise forms.ValidationError(str(exc)) from None


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
