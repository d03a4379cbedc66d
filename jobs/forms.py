from django import forms

# Slurm's job states; a state filter matches "CANCELLED by 0" too.
STATES = ["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
          "OUT_OF_MEMORY", "PREEMPTED", "REQUEUED", "SUSPENDED", "BOOT_FAIL", "DEADLINE"]
TIME_INPUT = forms.DateTimeInput(attrs={"type": "datetime-local", "step": "1"},
                                 format="%Y-%m-%dT%H:%M:%S")


class JobFilterForm(forms.Form):
    user = forms.CharField(required=False, max_length=64)
    account = forms.CharField(required=False, max_length=64)
    state = forms.ChoiceField(required=False, choices=[("", "any")] + [(s, s) for s in STATES])
    node = forms.CharField(required=False, max_length=255)
    start = forms.DateTimeField(required=False, label="from", widget=TIME_INPUT)
    end = forms.DateTimeField(required=False, label="to", widget=TIME_INPUT)
    page = forms.IntegerField(required=False, min_value=1, widget=forms.HiddenInput)

    def clean(self):
        data = super().clean()
        if data.get("start") and data.get("end") and data["start"] >= data["end"]:
            self.add_error("end", "The period must end after it starts.")
        return data
