import re
from datetime import timedelta

from django import forms

from .choices import ACTION_SIGNATURES, Action, AtDeadline, DrainMode
from .providers import ACTIONS as PROVIDER_ACTIONS
from .providers import validate_command_template
from .models import RepairSettings


class CommentForm(forms.Form):
    """Approve, reject or cancel: the comment is optional. Rejecting or cancelling also says
    how long no new recommendation comes for the same events (repairs.rejections);
    approving while the scheduler cannot be read needs confirm_unknown_jobs."""

    SNOOZES = {"events": None, "1h": timedelta(hours=1), "24h": timedelta(hours=24),
               "7d": timedelta(days=7)}
    SNOOZE_CHOICES = [("events", "until these events close"), ("1h", "for 1 h"),
                      ("24h", "for 24 h"), ("7d", "for 7 days")]

    comment = forms.CharField(max_length=500, required=False, error_messages={
        "max_length": "The comment is too long: 500 characters at most."})
    snooze = forms.ChoiceField(choices=SNOOZE_CHOICES, required=False)
    confirm_unknown_jobs = forms.BooleanField(required=False)
    # Approving: how the jobs are treated, when the approver changes it (empty: as proposed).
    drain_mode = forms.ChoiceField(choices=[("", "as proposed"), *DrainMode.choices],
                                   required=False)

    def snooze_for(self):
        """The chosen snooze for do_reject_repair / do_cancel_repair: None until the events
        close."""
        return self.SNOOZES[self.cleaned_data.get("snooze") or "events"]


class GoOnNowForm(forms.Form):
    """Ending a drain's wait for jobs: why (required)."""

    comment = forms.CharField(max_length=500, error_messages={
        "required": "Say why the jobs are stopped now."})


class AbortRepairForm(forms.Form):
    """Aborting a running repair: why (required), and what becomes of its node."""

    NODE_AFTER = [("paused", "keep the node paused"), ("resume", "resume the node")]

    comment = forms.CharField(max_length=500, error_messages={
        "required": "Say why the repair is aborted."})
    node_after = forms.ChoiceField(choices=NODE_AFTER, initial="paused")


class ProposeRepairForm(forms.Form):
    action = forms.ChoiceField(choices=Action.choices, initial=Action.REBOOT)
    reason = forms.CharField(max_length=300, help_text="Why this node needs it.")


class RepairSettingsForm(forms.ModelForm):
    """The cluster's RepairSettings; provider_commands is edited as one text field per
    provider action."""

    class Meta:
        model = RepairSettings
        fields = ["provider", "blast_radius_pct",
                  "boot_timeout_s", "window_mode", "window_action",
                  "xid_window_count", "xid_window_hours", "repair_window_count",
                  "repair_window_days"]
        labels = {"blast_radius_pct": "Blast radius (% of the cluster's nodes)",
                  "boot_timeout_s": "Boot timeout (s)",
                  "window_mode": "Count windows", "window_action": "A tripped window recommends",
                  "xid_window_count": "Fatal Xids on one GPU", "xid_window_hours": "in hours",
                  "repair_window_count": "Repairs of one node",
                  "repair_window_days": "in days"}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for action in PROVIDER_ACTIONS:
            self.fields[command_field(action)] = forms.CharField(
                label=f"{action.capitalize()} command", required=False, max_length=1000,
                initial=self.instance.provider_commands.get(action, ""),
                widget=forms.TextInput(attrs={"class": "mono", "size": 60}),
                help_text=f"What the shell commands provider runs for a {action} repair, "
                          f"with {{node}}, {{hostname}}, {{cluster}} and {{action}} inserted "
                          f"shell-quoted. Empty: a {action} repair fails at its act step.")

    def clean(self):
        cleaned = super().clean()
        for action in PROVIDER_ACTIONS:
            command = cleaned.get(command_field(action), "").strip()
            if command:
                try:
                    validate_command_template(command)
                except forms.ValidationError as error:
                    self.add_error(command_field(action), error)
        return cleaned

    def save(self, commit=True):
        self.instance.provider_commands = {
            action: self.cleaned_data[command_field(action)].strip()
            for action in PROVIDER_ACTIONS if self.cleaned_data[command_field(action)].strip()
        }
        return super().save(commit=commit)


def command_field(action):
    return f"{action}_command"


# Policy choices: "default" removes the cluster's row (repairs.policy decides), "none" keeps
# a row that asks for no repair.
DEFAULT, NONE = "default", "none"
SIGNATURE = re.compile(r"^[a-z0-9_.-]+(:[a-z0-9_.-]+)?$")


SIGNAL_NAME = re.compile(r"^[A-Z][A-Z0-9+]*$")


class RepairPolicyForm(forms.Form):
    signature = forms.CharField(max_length=64)
    action = forms.ChoiceField(choices=[(DEFAULT, "the default"), (NONE, "none: no repair"),
                                        *Action.choices])
    auto_approve = forms.BooleanField(required=False)
    drain_mode = forms.ChoiceField(
        choices=[("", "the default"), *((value, label) for value, label in DrainMode.choices
                                        if value != DrainMode.NO_DRAIN)], required=False)
    drain_deadline_min = forms.IntegerField(
        min_value=1, max_value=30 * 24 * 60, required=False,
        help_text="after the jobs end: how long to wait; signal, then wait: the grace period")
    drain_at_deadline = forms.ChoiceField(choices=[("", "the default"), *AtDeadline.choices],
                                          required=False)
    drain_signal = forms.CharField(max_length=16, required=False,
                                   help_text="signal, then wait: USR1, TERM, URG...")
    drain_signal_all_steps = forms.BooleanField(required=False)

    def clean_drain_signal(self):
        signal = self.cleaned_data["drain_signal"].strip().upper().removeprefix("SIG")
        if signal and not SIGNAL_NAME.match(signal):
            raise forms.ValidationError(f"{signal!r} is not a signal name: e.g. USR1, TERM.")
        return signal

    def drain_fields(self):
        """The row's drain fields for repairs.services.do_set_repair_policy."""
        minutes = self.cleaned_data.get("drain_deadline_min")
        return {"drain_mode": self.cleaned_data.get("drain_mode") or "",
                "drain_deadline_s": minutes * 60 if minutes else None,
                "drain_at_deadline": self.cleaned_data.get("drain_at_deadline") or "",
                "drain_signal": self.cleaned_data.get("drain_signal") or "",
                "drain_signal_all_steps": bool(self.cleaned_data.get("drain_signal_all_steps"))}

    def clean_signature(self):
        signature = self.cleaned_data["signature"].strip().lower()
        if not SIGNATURE.match(signature):
            raise forms.ValidationError(
                f"{signature!r} is not a signature: e.g. xid:79, gpu_lost, check:gpu_compute.")
        return signature

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("auto_approve") and cleaned.get("action") in (DEFAULT, NONE):
            self.add_error("auto_approve", "Auto-approve needs an action: choose the one that "
                                           "may start without a person.")
        allowed = ACTION_SIGNATURES.get(cleaned.get("action"))
        if allowed and cleaned.get("signature") not in allowed:
            self.add_error("action", f"{cleaned['action']} repairs {', '.join(allowed)} only.")
        return cleaned

    def policy_action(self):
        """The action for repairs.services.do_set_repair_policy: None for the default, ""
        for no repair."""
        action = self.cleaned_data["action"]
        return None if action == DEFAULT else "" if action == NONE else action
