from django import forms

from .models import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S
from .services import normalize_body, validate_body


class StartupScriptForm(forms.Form):
    """A script body, validated on save: `bash -n` refuses a syntax error (with its line);
    shellcheck's warnings refuse the save until `accept_warnings` is ticked."""

    body = forms.CharField(widget=forms.Textarea(attrs={"rows": 20, "class": "mono",
                                                        "spellcheck": "false"}),
                           strip=False, max_length=64 * 1024)
    timeout_s = forms.IntegerField(min_value=1, max_value=MAX_TIMEOUT_S,
                                   initial=DEFAULT_TIMEOUT_S, label="Time limit (s)")
    accept_warnings = forms.BooleanField(required=False,
                                         label="Save with shellcheck's warnings")

    validation = None

    def clean(self):
        cleaned = super().clean()
        body = cleaned.get("body")
        if body is None:
            return cleaned
        cleaned["body"] = normalize_body(body)
        self.validation = validate_body(cleaned["body"])
        if self.validation.syntax_error:
            where = f"line {self.validation.syntax_line}: " if self.validation.syntax_line else ""
            self.add_error("body", f"bash -n: syntax error at {where}{self.validation.syntax_error}")
        elif self.validation.warnings and not cleaned.get("accept_warnings"):
            self.add_error("accept_warnings",
                           "shellcheck found warnings (below): fix them, or accept them to save.")
        return cleaned
