import apprise
from django import forms
from django.core.validators import URLValidator

from healthchecks.choices import Severity

from .choices import AlertKind
from .models import Channel
from .services import TIMING_FIELDS


def rules_for(kinds, min_severity, signature_prefix):
    """A rule per alert kind; unhealthy nodes' from `min_severity` and `signature_prefix`."""
    rules = []
    for kind in kinds:
        rule = {"kind": kind, "min_severity": Severity.WARNING, "signature_prefix": ""}
        if kind == AlertKind.NODE_UNHEALTHY:
            rule.update(min_severity=min_severity, signature_prefix=signature_prefix)
        rules.append(rule)
    return rules


class ChannelForm(forms.ModelForm):
    """A channel, its URL (write-only: left empty when editing, the stored one stays) and
    which kinds of alert it hears of."""

    url = forms.CharField(
        label="URL", max_length=2000, required=False,
        widget=forms.PasswordInput(render_value=False),
        help_text="Apprise: the service's URL, e.g. slack://T…/B…/X…, msteams://…, "
                  "pagerduty://…, opsgenie://…, mailtos://user:pass@host?to=ops@example.com. "
                  "Webhook: the https:// URL to POST to. Kept in the secrets store; never "
                  "shown again.")
    kinds = forms.MultipleChoiceField(
        label="send", choices=AlertKind.choices, widget=forms.CheckboxSelectMultiple,
        initial=[AlertKind.REPAIR_AWAITING_APPROVAL, AlertKind.REPAIR_FAILED,
                 AlertKind.REPAIR_STUCK, AlertKind.REPAIR_PAST_DEADLINE,
                 AlertKind.CLUSTER_DEGRADED])
    min_severity = forms.ChoiceField(
        label="unhealthy nodes from severity", choices=Severity.choices,
        initial=Severity.WARNING)
    signature_prefix = forms.CharField(
        label="unhealthy nodes with signatures starting", max_length=64, required=False,
        help_text="e.g. xid: for Xids only; empty for every signature.")

    class Meta:
        model = Channel
        fields = ["name", "kind", *TIMING_FIELDS]

    def __init__(self, *args, cluster, **kwargs):
        super().__init__(*args, **kwargs)
        self.cluster = cluster
        if self.instance.pk:
            self.fields["kind"].disabled = True
            self.fields["url"].help_text = (f"Stored: {self.instance.url_hint} Leave empty to "
                                            f"keep it; a new URL replaces it.")
            rules = list(self.instance.rules.all())
            self.initial["kinds"] = [rule.kind for rule in rules]
            for rule in rules:
                if rule.kind == AlertKind.NODE_UNHEALTHY:
                    self.initial["min_severity"] = rule.min_severity
                    self.initial["signature_prefix"] = rule.signature_prefix

    def clean_name(self):
        name = self.cleaned_data["name"]
        others = Channel.objects.filter(cluster=self.cluster, name=name)
        if self.instance.pk:
            others = others.exclude(pk=self.instance.pk)
        if others.exists():
            raise forms.ValidationError("This cluster has a channel of that name.")
        return name

    def clean(self):
        cleaned = super().clean()
        url, kind = cleaned.get("url", ""), cleaned.get("kind")
        if not url:
            if not self.instance.pk:
                self.add_error("url", "A channel needs a URL.")
            return cleaned
        if kind == Channel.Kind.WEBHOOK:
            try:
                URLValidator(schemes=["http", "https"])(url)
            except forms.ValidationError:
                self.add_error("url", "A webhook URL is an http:// or https:// URL.")
        elif kind == Channel.Kind.APPRISE and not apprise.Apprise().add(url):
            self.add_error("url", "Apprise does not understand this URL (see the Apprise "
                                  "documentation for the service's URL form).")
        return cleaned

    def rules(self):
        """The rules as notifications.services takes them."""
        return rules_for(self.cleaned_data["kinds"], self.cleaned_data["min_severity"],
                         self.cleaned_data["signature_prefix"])

    @classmethod
    def default_rules(cls):
        """The rules of a channel whose form was left as it opens."""
        fields = cls.base_fields
        return rules_for(fields["kinds"].initial, fields["min_severity"].initial, "")

    def timing(self):
        return {field: self.cleaned_data[field] for field in TIMING_FIELDS}
