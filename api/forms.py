from django import forms
from django.conf import settings


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What it is for, e.g. 'pagerduty bot'.")
    expires_in_days = forms.IntegerField(
        label="expires in (days)", min_value=1, initial=90,
        max_value=settings.CLUSTERUI_API_TOKEN_MAX_DAYS)
