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
