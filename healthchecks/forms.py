from django import forms


class ResolveForm(forms.Form):
    comment = forms.CharField(max_length=200, help_text="What was done, or why it is over.")


class SilenceForm(forms.Form):
    hours = forms.FloatField(min_value=0.25, max_value=24 * 14, initial=4)
    reason = forms.CharField(max_length=200)
