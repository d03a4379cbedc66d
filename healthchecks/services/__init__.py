"""Writes for health events and active checks. Each change that matters to a node's state
hands the node its health facts (refresh_health_facts); each change others react to appends
a change row (the publisher pushes "health.changed", the recommender reads it).

Its modules, by concern (callers import from healthchecks.services):

- facts.py: a node's health facts, handed down to it
- events.py: passive events (signals from agents and the server) and operators' actions on them
- check_runs.py: active checks and acceptance: asking for runs, their results, judging a node
"""

from .facts import (  # noqa: F401
    open_problem_events,
    open_problem_events_of,
    describe_open_problems,
    acceptance_detail,
    health_facts_of,
    refresh_health_facts,
    refresh_health_facts_of,
    latest_runs,
)
from .events import (  # noqa: F401
    announce_health_change,
    do_record_health_event,
    do_close_health_event,
    Signal,
    do_record_signals,
    open_event_ids,
    NOTICE_CLOSED_REASON,
    do_acknowledge_event,
    do_resolve_event,
    do_silence_signature,
    QUIET_XID_CLOSES_AFTER,
    close_quiet_events,
    prune_closed_events,
    refresh_ended_silences,
)
from .check_runs import (  # noqa: F401
    check_signature,
    run_check_frame,
    CHECK_RUNS,
    announce_run_change,
    do_request_check,
    do_request_checks,
    do_record_check_result,
    do_bulk_request_checks,
    judge_acceptance,
    edge_events_open,
    edge_events_a_reboot_settles,
    judge_after_reboot,
    start_checks_after_hello,
)
