from django import forms

from nodes.choices import NodeState

from .models import Cluster, validate_secret_name

CONFIGURATION_WIDGETS = {
    "billing_rate_per_gpu_hour": forms.NumberInput(attrs={"step": "0.0001", "min": "0"}),
}
CONFIGURATION_HELP = {
    "acceptance_tests_enabled": (
        "A new or reprovisioned node stays pending, taking no work, until its agent passes "
        "NVML sanity, GPU compute, GPU memory bandwidth and scratch storage checks against "
        "its GPU model's baseline: some minutes per node before it is usable, in exchange "
        "for finding a bad GPU before a job does. Recommended for multi-GPU training and "
        "long-running clusters, where one slow or faulty GPU stalls the whole job. Nodes "
        "that joined before it was turned on are not affected."
    ),
}


class ClusterCreateForm(forms.ModelForm):
    class Meta:
        model = Cluster
        fields = ["slug", *Cluster.CONFIGURATION_FIELDS]
        widgets = CONFIGURATION_WIDGETS
        help_texts = {"slug": "Short name used in URLs, e.g. prod-h200. Cannot change later.",
                      **CONFIGURATION_HELP}


class ClusterSettingsForm(forms.ModelForm):
    class Meta:
        model = Cluster
        fields = list(Cluster.CONFIGURATION_FIELDS)
        widgets = CONFIGURATION_WIDGETS
        help_texts = CONFIGURATION_HELP


class TimelineFilterForm(forms.Form):
    node = forms.CharField(required=False, max_length=63)
    state = forms.ChoiceField(
        required=False, choices=[("", "any state"), *NodeState.choices], label="to state"
    )
    page = forms.IntegerField(required=False, min_value=1)


class JoinTokenForm(forms.Form):
    note = forms.CharField(max_length=200, required=False,
                           help_text="What it is for, e.g. 'rack 12 provisioning'.")
    expires_in_hours = forms.IntegerField(
        min_value=1, max_value=24 * 365, initial=24,
        help_text="It stops working after this many hours (a leaked one does not last).")
    single_use = forms.BooleanField(
        required=False, help_text="It stops working once one node has joined with it.")


class SecretForm(forms.Form):
    """A secret's name and value (write-only: the page never shows a value)."""

    name = forms.CharField(max_length=64, validators=[validate_secret_name],
                           help_text="Scripts and provider commands use it as $NAME.")
    value = forms.CharField(max_length=10_000, strip=False,
                            widget=forms.PasswordInput(render_value=False))
    description = forms.CharField(max_length=200, required=False,
                                  help_text="What it is for; shown, unlike the value.")
