"""CSV downloads: every export of the console is written here, formula-safe (DESIGN.md
"Security": a node an agent named "=HYPERLINK(...)" must not run in a spreadsheet)."""

import csv

from django.http import HttpResponse

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value):
    """Text a spreadsheet would run as a formula gets a leading apostrophe, as OWASP advises
    for CSV exports. Numbers are left as they are."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def csv_response(filename, header, rows):
    """An attachment named `filename`: the header, then each row, every cell made safe."""
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    writer = csv.writer(response)
    writer.writerow(header)
    for row in rows:
        writer.writerow([spreadsheet_safe(value) for value in row])
    return response


def invalid_filters_response(errors):
    """400 for an export asked with filters its form refused, saying which."""
    return HttpResponse("Invalid filters: " + errors.as_text(), status=400,
                        content_type="text/plain; charset=utf-8")
