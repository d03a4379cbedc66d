
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils import timezone

# As healthchecks.check_catalog and .choices had them when this migration was written.
ACCEPTANCE_CHECKS = ("nvml_sanity", "gpu_compute", "gpu_memory_bandwidth", "storage")
NODE_AFFECTING = ("warning", "critical")
UNFINISHED = ("queued", "running")
STATUS_LABELS = {"passed": "passed", "failed": "failed", "error": "error",
                 "timed_out": "timed out"}


def hand_down_health_facts(apps, schema_editor):
    """Nodes keep the facts healthchecks owns (nodes.states.HANDED_DOWN): fill them in for
    the nodes there are, as healthchecks.services.health_facts computes them."""
    Node = apps.get_model("nodes", "Node")
    HealthEvent = apps.get_model("healthchecks", "HealthEvent")
    Silence = apps.get_model("healthchecks", "Silence")
    CheckRun = apps.get_model("healthchecks", "CheckRun")
    now = timezone.now()
    for node in Node.objects.all().iterator():
        silenced = Silence.objects.filter(node=node, until__gt=now).values("signature")
        events = list(HealthEvent.objects.filter(
            node=node, closed_at__isnull=True, severity__in=NODE_AFFECTING)
            .exclude(signature__in=silenced).select_related("gpu")
            .order_by("severity", "first_seen", "id"))
        problem = ""
        if events:
            problem = events[0].signature
            if events[0].gpu is not None:
                problem += f" on GPU {events[0].gpu.index}"
            if len(events) > 1:
                problem += f" (+{len(events) - 1} more)"
        detail = ""
        if node.acceptance_required:
            latest = {run.check_name: run for run in CheckRun.objects.filter(
                node=node, purpose="acceptance", check_name__in=ACCEPTANCE_CHECKS,
                requested_at__gte=node.joined_at).order_by("requested_at", "id")}
            if not latest:
                detail = "acceptance tests have not started"
            elif any(run.status in UNFINISHED for run in latest.values()):
                detail = "running acceptance tests"
            else:
                failed = [f"{name} {STATUS_LABELS.get(latest[name].status, latest[name].status)}"
                          for name in ACCEPTANCE_CHECKS
                          if name in latest and latest[name].status != "passed"]
                detail = "acceptance tests did not pass: " + ", ".join(failed) if failed else ""
        checks_running = CheckRun.objects.filter(
            node=node, purpose="after_reboot", boot_id=node.boot_id,
            status__in=UNFINISHED).exists()
        Node.objects.filter(pk=node.pk).update(
            open_problem=problem[:255], acceptance_detail=detail[:255],
            checks_running_for_boot=node.boot_id if checks_running else "")


class Migration(migrations.Migration):

    dependencies = [
        ('healthchecks', '0004_checkrun'),
        ('nodes', '0011_handed_down_facts'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RemoveField(
            model_name='checkrun',
            name='dispatched_at',
        ),
        migrations.AlterField(
            model_name='checkrun',
            name='requested_by',
            field=models.ForeignKey(blank=True, help_text='empty: the system (a repair, a hello)', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.RunPython(hand_down_health_facts, migrations.RunPython.noop),
    ]
