"""What a message says: its title and Markdown body (people, through Apprise) and its JSON
payload (automation, through the signed webhook). docs/notifications.md documents the
payload; a change here is a change to that contract.

Every alert links to the console page that acts on it (a recommendation's page has its
Approve button); approving stays in the console, behind sign-in.
"""

from django.conf import settings

from .choices import ONE_OFF_KINDS, AlertKind

# A message lists at most this many alerts of each part; the rest are counted, and the link
# to the cluster's page shows them all.
LISTED_MAX = 50
PAYLOAD_VERSION = 1


def absolute(path):
    return settings.CLUSTERUI_PUBLIC_URL.rstrip("/") + path


def alert_json(alert):
    return {
        "id": alert.pk, "kind": alert.kind, "key": alert.key,
        "status": "resolved" if alert.resolved_at and alert.kind not in ONE_OFF_KINDS
        else "firing",
        "node": alert.node_name or None, "signature": alert.signature or None,
        "severity": alert.severity or None, "summary": alert.summary,
        "url": absolute(alert.path), "opened_at": alert.opened_at.isoformat(),
        "resolved_at": alert.resolved_at.isoformat()
        if alert.resolved_at and alert.kind not in ONE_OFF_KINDS else None,
    }


def group_title(group_key):
    kind, _, signature = group_key.partition(":")
    label = AlertKind(kind).label if kind in AlertKind.values else kind
    return f"{label}: {signature}" if signature else label


def alert_message(channel, group_key, firing, resolved, now):
    """(event_type, title, body, payload) of one group's message."""
    cluster = channel.cluster
    status = "firing" if firing else "resolved"
    count = len(firing) if firing else len(resolved)
    title = f"[{cluster.name}] {status.upper()}:{count} {group_title(group_key)}"
    lines = []
    for heading, alerts in (("Firing", firing), ("Resolved", resolved)):
        if not alerts:
            continue
        lines.append(f"**{heading} ({len(alerts)})**")
        # Bare URLs: every service links them, and Apprise's Markdown-to-text (email's
        # plain part, SMS) would drop a Markdown link's target.
        lines += [f"- {alert.summary}: {absolute(alert.path)}" for alert in alerts[:LISTED_MAX]]
        if len(alerts) > LISTED_MAX:
            lines.append(f"- ... and {len(alerts) - LISTED_MAX} more")
        lines.append("")
    lines.append(f"Cluster: {absolute(cluster.get_absolute_url())}")
    payload = {
        "type": f"alert.{status}", "timestamp": now.isoformat(),
        "data": {
            "version": PAYLOAD_VERSION,
            "cluster": {"slug": cluster.slug, "name": cluster.name,
                        "url": absolute(cluster.get_absolute_url())},
            "channel": channel.name, "group": group_key, "status": status,
            "firing": [alert_json(alert) for alert in firing],
            "resolved": [alert_json(alert) for alert in resolved],
        },
    }
    return f"alert.{status}", title, "\n".join(lines).strip(), payload


def channel_test_message(channel, actor_name, now):
    cluster = channel.cluster
    title = f"[{cluster.name}] test message from clusterui"
    body = (f"{actor_name} sent this from channel {channel.name}'s page. Alerts will look like "
            f"this, each with a link to the console.\n\nCluster: "
            f"{absolute(cluster.get_absolute_url())}")
    payload = {"type": "test", "timestamp": now.isoformat(),
               "data": {"version": PAYLOAD_VERSION, "channel": channel.name,
                        "cluster": {"slug": cluster.slug, "name": cluster.name,
                                    "url": absolute(cluster.get_absolute_url())},
                        "sent_by": actor_name}}
    return "test", title, body, payload


def maintenance_summary(channel, window, still_open, now):
    """What a channel held back during a maintenance window, and is still open at its end."""
    cluster = channel.cluster
    title = (f"[{cluster.name}] maintenance window #{window.pk} ended: {len(still_open)} "
             f"alert{'s' if len(still_open) != 1 else ''} still open")
    lines = [f"Held during maintenance ({window.reason}); still open now:"]
    lines += [f"- {alert.summary}: {absolute(alert.path)}" for alert in still_open[:LISTED_MAX]]
    if len(still_open) > LISTED_MAX:
        lines.append(f"- ... and {len(still_open) - LISTED_MAX} more")
    lines.append(f"\nCluster: {absolute(cluster.get_absolute_url())}")
    payload = {"type": "maintenance.ended", "timestamp": now.isoformat(),
               "data": {"version": PAYLOAD_VERSION, "channel": channel.name,
                        "cluster": {"slug": cluster.slug, "name": cluster.name,
                                    "url": absolute(cluster.get_absolute_url())},
                        "window": {"id": window.pk, "reason": window.reason},
                        "firing": [alert_json(alert) for alert in still_open]}}
    return "maintenance.ended", title, "\n".join(lines), payload
