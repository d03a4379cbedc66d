from django.db import migrations


def hand_down_running_repair(apps, schema_editor):
    """Nodes keep the fact repairs owns (nodes.states.HANDED_DOWN): the repair running on
    them, as repairs.transitions hands it down."""
    Repair = apps.get_model("repairs", "Repair")
    Node = apps.get_model("nodes", "Node")
    for repair in Repair.objects.filter(status="running"):
        Node.objects.filter(pk=repair.node_id).update(
            running_repair=f"repair #{repair.pk} ({repair.action}) is running")


class Migration(migrations.Migration):

    dependencies = [
        ("repairs", "0001_initial"),
        ("nodes", "0011_handed_down_facts"),
    ]

    operations = [
        migrations.RunPython(hand_down_running_repair, migrations.RunPython.noop),
    ]
