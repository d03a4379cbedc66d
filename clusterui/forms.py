from django import forms

from nodes.choices import NodeState

from .models import Cluster

CONFIGURATION_WIDGETS = {
    "billing_rate_per_gpu_hour": forms.NumberInput(attrs={"step": "0.0001", "min": "0"}),
}


class ClusterCreateForm(forms.ModelForm):
    class Meta:
        model = Cluster
        fields = ["slug", *Cluster.CONFIGURATION_FIELDS]
        widgets = CONFIGURATION_WIDGETS
        help_texts = {"slug": "Short name used in URLs, e.g. prod-h200. Cannot change later."}


class ClusterSettingsForm(forms.ModelForm):
    class Meta:
        model = Cluster
        fields = list(Cluster.CONFIGURATION_FIELDS)
        widgets = CONFIGURATION_WIDGETS


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
        required=False, min_value=1, max_value=24 * 365,
        help_text="Leave empty for a token that works until revoked.")
