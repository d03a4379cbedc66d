from django import forms

from nodes.choices import NodeState


class TimelineFilterForm(forms.Form):
    node = forms.CharField(required=False, max_length=63)
    state = forms.ChoiceField(
        required=False, choices=[("", "any state"), *NodeState.choices], label="to state"
    )
    routine = forms.BooleanField(required=False, label="routine too",
                                 help_text="registrations, first boots, boot windows ending")
    page = forms.IntegerField(required=False, min_value=1)
