"""The one CSV helper (issue 15, point 6): a cell a spreadsheet would run is made inert."""

import csv
import io

import pytest

from common.exports import csv_response, spreadsheet_safe


@pytest.mark.parametrize("text", ["=1+2", "+1", "-1 node", "@SUM(A1)", "\tcmd", "\rcmd",
                                  '=HYPERLINK("http://evil.example")'])
def test_a_cell_that_starts_a_formula_is_quoted(text):
    assert spreadsheet_safe(text) == "'" + text


@pytest.mark.parametrize("value", ["gpu-001", "", "a=b", 3, -1, 2.5, "1e5"])
def test_other_cells_and_numbers_are_left_alone(value):
    assert spreadsheet_safe(value) == value


def test_every_row_of_an_export_goes_through_it():
    response = csv_response("x.csv", ["name", "n"], [["=cmd", -4], ["ok", 1]])
    assert response["Content-Disposition"] == 'attachment; filename="x.csv"'
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows == [["name", "n"], ["'=cmd", "-4"], ["ok", "1"]]
