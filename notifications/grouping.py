"""Which messages to send: alerts grouped per channel, as Alertmanager groups them.

A channel's alerts fall into groups: one per kind, and for unhealthy nodes one per
signature (a storm of 200 throttling nodes is one message listing them; an Xid 79 among
them is a message of its own). For each group, every tick:

- a group not notified yet sends once its oldest alert has waited group_wait (more alerts
  join it meanwhile);
- a notified group whose alerts changed (some opened, some resolved) sends what changed,
  group_interval after its last message; when all have resolved, a resolved message (if
  the channel sends those);
- a notified group still firing, unchanged, sends again after repeat_interval.

A channel sends at most max_per_hour messages (test messages aside): past that a message
waits, and its group goes on gathering alerts, so the message that goes out later says
where things stand then. One-off alerts (a failed repair) are sent once by each channel
(NotificationGroup.one_offs_sent_through).

An alert about a node in a maintenance window (or any alert of a cluster in a whole-cluster
window) is held, not grouped. Once the window no longer covers it, the channel sends one
summary per window of what is still open, and those alerts count as notified in their
groups from then on.
"""

from collections import defaultdict
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from healthchecks.choices import Severity
from nodes import maintenance

from .choices import ONE_OFF_KINDS, AlertKind
from .deliveries import create_delivery
from .messages import alert_message, maintenance_summary
from .models import Alert, Channel, Delivery, HeldAlert, NotificationGroup

SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


def group_key(alert):
    if alert.kind == AlertKind.NODE_UNHEALTHY:
        return f"{alert.kind}:{alert.signature}"
    return alert.kind


def rule_matches(rule, alert):
    if rule.kind != alert.kind:
        return False
    if alert.kind != AlertKind.NODE_UNHEALTHY:
        return True
    return (SEVERITY_RANK.get(alert.severity, 0) >= SEVERITY_RANK[rule.min_severity]
            and alert.signature.startswith(rule.signature_prefix))


def plan_deliveries(now=None):
    """Every enabled channel's due messages. Returns how many were planned."""
    now = now or timezone.now()
    planned = 0
    for channel_id in Channel.objects.filter(enabled=True).values_list("pk", flat=True):
        with transaction.atomic():
            planned += plan_channel(channel_id, now)
    return planned


def sent_in_the_last_hour(channel, now):
    return (Delivery.objects.filter(channel=channel, created_at__gt=now - timedelta(hours=1))
            .exclude(event_type="test").count())


def plan_channel(channel_id, now):
    # The channel's row lock (its row only: not the cluster's, which every write in the
    # cluster references): two planners at once plan each message once.
    channel = (Channel.objects.select_for_update(of=("self",)).select_related("cluster")
               .filter(pk=channel_id, enabled=True).first())
    if channel is None:
        return 0
    rules = list(channel.rules.all())
    groups = {group.key: group for group in channel.groups.all()}
    occurrences = maintenance.current([channel.cluster_id], now).get(channel.cluster_id, [])
    firing, held = defaultdict(list), {}
    for alert in candidates(channel, rules, groups):
        holding = holding_occurrence(alert, occurrences)
        if holding is not None:
            held[alert.pk] = HeldAlert(channel=channel, alert=alert, window=holding.window)
        else:
            firing[group_key(alert)].append(alert)
    HeldAlert.objects.bulk_create(held.values(), ignore_conflicts=True)
    budget = channel.max_per_hour - sent_in_the_last_hour(channel, now)
    planned = send_maintenance_summaries(channel, groups, set(held), budget, now)
    budget -= planned
    keys = set(firing) | {key for key, group in groups.items() if group.notified_alert_ids}
    for key in sorted(keys):
        if budget <= 0:
            break
        group = groups.get(key) or NotificationGroup(channel=channel, key=key)
        if plan_group(channel, group, firing.get(key, []), now, held_ids=set(held)):
            planned += 1
            budget -= 1
    return planned


def candidates(channel, rules, groups):
    """The channel's alerts to group: those firing that its rules match, and the one-offs
    its groups have not sent yet (since the channel was made)."""
    kinds = {rule.kind for rule in rules}
    ongoing = Alert.objects.firing().filter(cluster_id=channel.cluster_id, kind__in=kinds)
    one_off_kinds = kinds & set(ONE_OFF_KINDS)
    sent_through = min((groups[kind].one_offs_sent_through if kind in groups else 0)
                       for kind in one_off_kinds) if one_off_kinds else 0
    one_offs = (Alert.objects.filter(cluster_id=channel.cluster_id, kind__in=one_off_kinds,
                                     opened_at__gte=channel.created_at, pk__gt=sent_through)
                if one_off_kinds else Alert.objects.none())
    for alert in [*ongoing.exclude(kind__in=ONE_OFF_KINDS), *one_offs]:
        group = groups.get(group_key(alert))
        if alert.kind in ONE_OFF_KINDS and group and alert.pk <= group.one_offs_sent_through:
            continue
        if any(rule_matches(rule, alert) for rule in rules):
            yield alert


def holding_occurrence(alert, occurrences):
    """The maintenance occurrence that holds the alert's notification back, or None."""
    for occurrence in occurrences:
        if occurrence.whole_cluster or (alert.node_id is not None
                                        and occurrence.covers(alert.node_id)):
            return occurrence
    return None


def send_maintenance_summaries(channel, groups, still_held, budget, now):
    """One message per window that no longer holds some of the channel's alerts: those of
    them still open (and the one-offs that happened meanwhile). They count as sent in their
    groups from now on. Returns how many messages (at most `budget`)."""
    released = (HeldAlert.objects.filter(channel=channel).exclude(alert_id__in=still_held)
                .select_related("alert", "window").order_by("alert__opened_at"))
    by_window = defaultdict(list)
    for hold in released:
        by_window[hold.window].append(hold)
    sent = 0
    for window, holds in by_window.items():
        if sent >= budget:
            break  # the rest wait for the rate limit, still held
        alerts = [hold.alert for hold in holds]
        still_open = [alert for alert in alerts
                      if alert.kind in ONE_OFF_KINDS or alert.resolved_at is None]
        if still_open:
            create_delivery(channel, maintenance_summary(channel, window, still_open, now),
                            group_key=f"maintenance:{window.pk}", now=now)
            sent += 1
        mark_sent(channel, groups, still_open, now)
        HeldAlert.objects.filter(pk__in=[hold.pk for hold in holds]).delete()
    return sent


def mark_sent(channel, groups, alerts, now):
    """Count the alerts as sent in their groups (one save a group)."""
    by_group = defaultdict(list)
    for alert in alerts:
        by_group[group_key(alert)].append(alert)
    for key, members in by_group.items():
        group = groups.setdefault(key, NotificationGroup(channel=channel, key=key))
        ongoing = {alert.pk for alert in members if alert.kind not in ONE_OFF_KINDS}
        group.notified_alert_ids = sorted(set(group.notified_alert_ids) | ongoing)
        group.one_offs_sent_through = max(
            [group.one_offs_sent_through,
             *(alert.pk for alert in members if alert.kind in ONE_OFF_KINDS)])
        group.last_planned_at = now
        group.save()


def plan_group(channel, group, firing, now, held_ids=frozenset()):
    """Plan the group's message if one is due; True when it did. An alert it has sent that
    a maintenance window now holds stays in it, neither firing anew nor resolved."""
    notified = set(group.notified_alert_ids)
    kept = notified & held_ids
    firing_ids = {alert.pk for alert in firing} | kept
    last = group.last_planned_at
    if not notified:
        if not firing:
            return False
        due = min(alert.opened_at for alert in firing) + timedelta(seconds=channel.group_wait_s)
    elif firing_ids != notified:
        due = last + timedelta(seconds=channel.group_interval_s)
    elif firing:
        due = last + timedelta(seconds=channel.repeat_interval_s)
    else:
        return False
    if now < due:
        return False
    resolved = list(Alert.objects.filter(pk__in=notified - firing_ids)) if notified else []
    group.notified_alert_ids = sorted({alert.pk for alert in firing
                                       if alert.kind not in ONE_OFF_KINDS} | kept)
    group.one_offs_sent_through = max([group.one_offs_sent_through,
                                       *(a.pk for a in firing if a.kind in ONE_OFF_KINDS)])
    group.last_planned_at = now
    group.save()
    if not firing and not channel.send_resolved:
        return False
    shown_resolved = resolved if channel.send_resolved else []
    create_delivery(channel, alert_message(channel, group.key, firing, shown_resolved, now),
                    group_key=group.key, now=now)
    return True
