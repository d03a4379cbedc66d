"""What every reconnect does: the token check at connect, and a known node's hello.

After a server restart every agent of the fleet connects and says hello again within
seconds, and almost every one of those hellos changes nothing: same boot, same GPUs, same
agent, no work owed. Such a hello is two statements, raw SQL that runs on PostgreSQL and
SQLite alike:

1. one UPDATE of the node's last_hello_at and last_seen, guarded by everything that would
   make the hello change more (its token still usable and the node's, the same boot id and
   hello digest, no GPU missing, no acceptance pending, no work unfinished); and
2. one read of its config (startup.services.scripts_for).

When the UPDATE matches no row, nothing was written and the hello takes the full path
(gateway.ingest.accept_hello, the ORM), which decides what changed. So does every join.
The token check at connect is one SELECT; a node token's use shows as its node's
last_hello_at (join tokens note their last use when they register a node).
"""

from dataclasses import dataclass

from django.db import connection
from django.utils import timezone

from common.bulk_sql import column, table
from nodes.inventory import hello_digest
from nodes.models import AgentToken, Gpu, Node
from nodes.services import hash_token
from startup.services import config_frame_from

from .ingest import WORK_KINDS, TokenGrant, sample_interval_s


@dataclass(frozen=True)
class KnownHello:
    node_id: int
    cluster_id: int
    config: dict  # the config frame that follows the welcome


def _usable_token_sql(alias):
    """SQL true for a usable AgentToken row `alias` (AgentToken.objects.usable); %s: now."""
    revoked, expires = (f"{alias}.{column(AgentToken, name)}"
                        for name in ("revoked_at", "expires_at"))
    return f"{revoked} IS NULL AND ({expires} IS NULL OR {expires} > %s)"


def _datetime(value):
    return Node._meta.get_field("last_seen").get_db_prep_value(value, connection)


def authenticate(plaintext, now=None):
    """The TokenGrant of a usable agent token, or None: one SELECT."""
    if not plaintext:
        return None
    now = now or timezone.now()
    columns = ", ".join(f"t.{column(AgentToken, name)}"
                        for name in ("id", "kind", "cluster", "node"))
    sql = (f"SELECT {columns}, n.{column(Node, 'name')} FROM {table(AgentToken)} t "
           f"LEFT JOIN {table(Node)} n ON n.id = t.{column(AgentToken, 'node')} "
           f"WHERE t.{column(AgentToken, 'token_hash')} = %s AND {_usable_token_sql('t')}")
    with connection.cursor() as cursor:
        cursor.execute(sql, [hash_token(plaintext), _datetime(now)])
        row = cursor.fetchone()
    if row is None:
        return None
    token_id, kind, cluster_id, node_id, node_name = row
    return TokenGrant(token_id, kind, cluster_id, node_id, node_name or "")


def _unfinished_work_sql():
    """SQL true when node `n` has work of any kind unfinished (its statuses as parameters)."""
    clauses, params = [], []
    for kind in WORK_KINDS.values():
        marks = ", ".join(["%s"] * len(kind.unfinished))
        clauses.append(
            f"EXISTS (SELECT 1 FROM {table(kind.model)} w "
            f"WHERE w.{column(kind.model, 'node')} = n.id "
            f"AND w.{column(kind.model, 'status')} IN ({marks}))")
        params += list(kind.unfinished)
    return " OR ".join(clauses), params


def welcome_known_node(grant, frame, now=None):
    """A KnownHello when the hello changes nothing but the node's last hello (written here),
    else None: then nothing was written and the caller takes the full path."""
    if grant.kind != AgentToken.Kind.NODE or frame.get("outbox_dropped"):
        return None
    now = now or timezone.now()
    at = _datetime(now)
    digest = hello_digest(agent_version=frame["agent_version"], gpus=frame["gpus"],
                          slurm=frame.get("slurm"))
    node = {name: column(Node, name) for name in (
        "name", "boot_id", "hello_digest", "state", "acceptance_required",
        "acceptance_passed_at", "joined_at", "last_hello_at", "last_seen", "cluster", "role")}
    token = {name: column(AgentToken, name) for name in ("id", "node")}
    gpu = {name: column(Gpu, name) for name in ("node", "removed_at", "missing_since")}
    work, work_params = _unfinished_work_sql()
    sql = (
        f"UPDATE {table(Node)} AS n SET {node['last_hello_at']} = %s, {node['last_seen']} = %s "
        f"WHERE n.id = %s AND n.{node['name']} = %s AND n.{node['boot_id']} = %s "
        f"AND n.{node['hello_digest']} = %s AND n.{node['state']} <> '' "
        f"AND NOT (n.{node['acceptance_required']} AND (n.{node['acceptance_passed_at']} IS NULL "
        f"OR n.{node['acceptance_passed_at']} < n.{node['joined_at']})) "
        f"AND EXISTS (SELECT 1 FROM {table(AgentToken)} t WHERE t.{token['id']} = %s "
        f"AND t.{token['node']} = n.id AND {_usable_token_sql('t')}) "
        f"AND NOT EXISTS (SELECT 1 FROM {table(Gpu)} g WHERE g.{gpu['node']} = n.id "
        f"AND g.{gpu['removed_at']} IS NULL AND g.{gpu['missing_since']} IS NOT NULL) "
        f"AND NOT ({work}) "
        # Unqualified: SQLite's RETURNING does not know the table's alias.
        f"RETURNING {node['cluster']}, {node['role']}")
    params = [at, at, grant.node_id, frame["node"], frame["boot_id"], digest,
              grant.token_id, at, *work_params]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    cluster_id, role = row
    return KnownHello(grant.node_id, cluster_id,
                      config_frame_from(cluster_id, role, sample_interval_s()))
