"""Writes that change a node's facts. Each refreshes the node's state in its transaction.

Its modules, by concern (callers import from nodes.services):

- nodes.py: registering a node, its hellos, pausing, its role, removing it
- tokens.py: join and node tokens
- rejoin.py: opening a node or a cluster to re-join
- commands.py: commands to a node's agent
- windows.py: maintenance windows
"""

from .nodes import (  # noqa: F401
    do_register_node,
    do_record_hello,
    do_pause_node,
    do_resume_node,
    do_set_node_role,
    do_bulk_pause_nodes,
    do_bulk_resume_nodes,
    do_bulk_set_node_role,
    do_remove_node,
    prune_event_receipts,
)
from .tokens import (  # noqa: F401
    JOIN_TOKEN_PREFIX,
    NODE_TOKEN_PREFIX,
    hash_token,
    do_issue_join_token,
    do_revoke_agent_token,
    do_issue_node_token,
    use_join_token,
    find_usable_token,
)
from .rejoin import (  # noqa: F401
    REJOIN_MAX_HOURS,
    REPAIR_OPENER,
    opened_by_a_repair,
    rejoin_opening,
    do_open_rejoin,
    do_close_rejoin,
    do_open_cluster_rejoin,
    do_close_cluster_rejoin,
)
from .commands import (  # noqa: F401
    command_frame,
    finish_reboots_after_hello,
    COMMANDS,
    do_send_command,
    do_record_command_result,
)
from .windows import (  # noqa: F401
    do_create_maintenance_window,
    do_update_maintenance_window,
    do_end_maintenance_window,
)
