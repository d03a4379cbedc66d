"""Many rows in one statement with one parameter: for the paths that run per batch of agent
events or per hello. There, building the ORM's expressions, and psycopg's parsing of a
statement with a `%s` for every value, cost more than the database's work.

The rows travel as one JSON document, and the statement's text depends only on the
columns, so drivers and databases see the same statement again. PostgreSQL reads the
document with json_populate_recordset (typed by the table's own row type), SQLite with
json_each (3.38 and later: `->>`, RETURNING). Everything else uses the ORM.
"""

import orjson
from django.db import connection


def table(model):
    return connection.ops.quote_name(model._meta.db_table)


def column(model, field_name):
    return connection.ops.quote_name(model._meta.get_field(field_name).column)


def qualified(model, field_name):
    """The column with its table's name: unambiguous beside the rows' document."""
    return f"{table(model)}.{column(model, field_name)}"


# Fields whose Python values JSON cannot carry as the database reads them; the others go
# as they are.
_PREPARED_TYPES = {"DateTimeField", "DateField", "TimeField", "UUIDField", "JSONField",
                   "DecimalField", "DurationField"}


def _document(model, field_names, rows):
    """[{column: value}] as JSON text, each value as its column takes it from JSON. For
    PostgreSQL the Python values as they are (orjson writes datetimes and UUIDs as it reads
    them); for SQLite the ORM's database values of datetimes, UUIDs and JSON (its text)."""
    fields = [model._meta.get_field(name) for name in field_names]
    columns = [field.column for field in fields]
    if connection.vendor != "postgresql" and any(
            field.get_internal_type() in _PREPARED_TYPES for field in fields):
        prepare = [(lambda value, field=field: field.get_db_prep_save(value, connection))
                   if field.get_internal_type() in _PREPARED_TYPES else None
                   for field in fields]
        rows = [[value if prep is None else prep(value) for prep, value in zip(prepare, row)]
                for row in rows]
    return orjson.dumps([dict(zip(columns, row)) for row in rows],
                        option=orjson.OPT_NON_STR_KEYS).decode()


def _rows_source(model, field_names):
    """(FROM clause reading the document as `v`, {field name: SQL of its value in a row})."""
    if connection.vendor == "postgresql":
        source = f"json_populate_recordset(NULL::{table(model)}, %s::json) AS v"
        values = {name: f"v.{column(model, name)}" for name in field_names}
    else:
        source = "json_each(%s) AS v"
        values = {name: f"v.value ->> '{model._meta.get_field(name).column}'"
                  for name in field_names}
    return source, values


def insert_rows(model, field_names, rows, *, returning=(), conflict_do_nothing=False):
    """INSERT one row per tuple of `rows` (values in field_names' order), in that order. With
    `returning` (field names), the inserted rows' values of those fields, in that order too
    (as the ORM's bulk_create takes them). With conflict_do_nothing, a row that would break
    a unique constraint (a partial one too) is left out and is not returned."""
    if not rows:
        return []
    source, values = _rows_source(model, field_names)
    sql = (f"INSERT INTO {table(model)} ({', '.join(column(model, n) for n in field_names)}) "
           f"SELECT {', '.join(values[name] for name in field_names)} FROM {source}")
    if conflict_do_nothing:
        # "WHERE true": SQLite's parser needs it before an upsert clause.
        sql += " WHERE true ON CONFLICT DO NOTHING"
    if returning:
        sql += " RETURNING " + ", ".join(column(model, name) for name in returning)
    with connection.cursor() as cursor:
        cursor.execute(sql, [_document(model, field_names, rows)])
        return cursor.fetchall() if returning else []


def update_rows(model, field_names, rows, *, combine=None, where="", where_params=(),
                returning=False):
    """UPDATE each row, (pk, *values in field_names' order), with its own values, in one
    statement. `combine`: {field name: SQL with {old} and {new}} for a field whose new value
    is computed from both (a count added to). `where` (SQL, its columns qualified()) narrows
    it further. With `returning`, the pks updated."""
    if not rows:
        return []
    combine = combine or {}
    names = ("id", *field_names)
    source, values = _rows_source(model, names)
    sets = []
    for name in field_names:
        new = values[name]
        if name in combine:
            new = combine[name].format(old=qualified(model, name), new=new)
        sets.append(f"{column(model, name)} = {new}")
    sql = (f"UPDATE {table(model)} SET {', '.join(sets)} FROM {source} "
           f"WHERE {qualified(model, 'id')} = {values['id']}")
    if where:
        sql += f" AND ({where})"
    if returning:
        # SQLite's RETURNING names the target's columns unqualified (they are unambiguous
        # there: json_each has no such columns).
        pk = qualified(model, "id") if connection.vendor == "postgresql" else column(model, "id")
        sql += f" RETURNING {pk}"
    with connection.cursor() as cursor:
        cursor.execute(sql, [_document(model, names, rows), *where_params])
        return [pk for (pk,) in cursor.fetchall()] if returning else []


def one_of(model, field_name, values, *, alias=""):
    """(SQL true when the field's column holds one of `values`, its parameters): one
    parameter however many values, so the statement's text stays the same."""
    field = model._meta.get_field(field_name)
    name = f"{alias}.{column(model, field_name)}" if alias else qualified(model, field_name)
    if connection.vendor == "postgresql":
        return f"{name} = ANY(%s)", [[field.get_prep_value(value) for value in values]]
    return (f"{name} IN (SELECT value FROM json_each(%s))",
            [orjson.dumps([field.get_db_prep_value(value, connection) for value in values])
             .decode()])


def select(sql, params):
    """The rows of a SELECT."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
