from django import forms

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


class SecretForm(forms.Form):
    """A secret's name and value (write-only: the page never shows a value)."""

    name = forms.CharField(max_length=64, validators=[validate_secret_name],
                           help_text="Scripts and provider commands use it as $NAME.")
    value = forms.CharField(max_length=10_000, strip=False,
                            widget=forms.PasswordInput(render_value=False))
    description = forms.CharField(max_length=200, required=False,
                                  help_text="What it is for; shown, unlike the value.")
