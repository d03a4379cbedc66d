from django import forms


class PauseNodeForm(forms.Form):
    reason = forms.CharField(max_length=200, help_text="Why: shown on the node and the timeline.")
