"""The API's lists: one page of `limit` items from `offset`, and the query parameters each
list takes. A list with a FilterSet takes its filters from it: the FilterSet stays the one
place a filter is written (the page, its CSV export and the API share it), and the query
schema made from it here is what OpenAPI shows."""

import django_filters
from ninja import Field
from ninja.errors import HttpError
from pydantic import create_model

from .schemas import Paging

# How a time filter's lookup reads in its description.
TIME_LOOKUPS = {"gte": "at or after", "lte": "at or before"}


def filter_description(name, a_filter):
    """What a filter does, in words: its help text; a time filter says which time it
    compares and how; else its label or name."""
    if "help_text" in a_filter.extra:
        return str(a_filter.extra["help_text"])
    if isinstance(a_filter, django_filters.DateTimeFilter):
        compares = TIME_LOOKUPS.get(a_filter.lookup_expr, a_filter.lookup_expr)
        time = a_filter.field_name.removesuffix("_at").replace("_", " ")
        return f"{time} {compares} this time (ISO 8601, e.g. 2026-12-03T07:05:00Z)"
    return str(a_filter.label or name)


def filter_field(name, a_filter):
    """The query parameter of one filter: an optional string, its choices listed (the
    FilterSet checks the value, and a bad one is answered 400 naming the filter)."""
    description = filter_description(name, a_filter)
    choices = a_filter.extra.get("choices")
    if choices is None:
        return (str | None, Field(None, description=description))
    listed = ", ".join(value if str(label) == value else f"{value}: {label}"
                       for value, label in choices)
    return (str | None, Field(None, description=f"{description} ({listed})",
                              json_schema_extra={"enum": [value for value, _ in choices]}))


def query_of(filterset_class):
    """The query schema of a list filtered by `filterset_class`: each of its filters and
    limit and offset."""
    fields = {name: filter_field(name, a_filter)
              for name, a_filter in filterset_class.base_filters.items()}
    name = filterset_class.__name__.removesuffix("Filter") + "Query"
    return create_model(name, __base__=Paging, **fields)


def filtered(filterset_class, query, queryset):
    """The queryset through the FilterSet with the query's filters; a bad value is a 400
    naming its filter, as the page says it."""
    filters = query.model_dump(exclude=set(Paging.model_fields), exclude_none=True)
    found = filterset_class(filters, queryset=queryset)
    if not found.is_valid():
        raise HttpError(400, "; ".join(f"{field}: {' '.join(errors)}"
                                       for field, errors in found.errors.items()))
    return found.qs


def refuse_unknown_parameters(request, query):
    """A 400 naming any query parameter the list does not take (`page`, a misspelt filter)
    rather than an answer that silently ignores it."""
    known = type(query).model_fields
    unknown = [name for name in request.GET if name not in known]
    if unknown:
        raise HttpError(400, f"Unknown query parameter {', '.join(unknown)}: this list takes "
                             f"{', '.join(known)}.")


def page_of(queryset, request, query, item):
    """One page of a list, each row made into its JSON by `item`: `count` is every row that
    matches, `next_offset` the offset of the next page (null on the last). Every list
    answers through here, so every list refuses a query parameter it does not take."""
    refuse_unknown_parameters(request, query)
    count = queryset.count()
    rows = queryset[query.offset:query.offset + query.limit]
    next_offset = query.offset + query.limit
    return {"count": count, "limit": query.limit, "offset": query.offset,
            "next_offset": next_offset if next_offset < count else None,
            "items": [item(row) for row in rows]}
