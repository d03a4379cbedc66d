from django.db import migrations


def copy_scheduler_to_cluster(apps, schema_editor):
    """The scheduler a cluster's repairs used is now the cluster's own (job accounting reads
    it too)."""
    RepairSettings = apps.get_model("repairs", "RepairSettings")
    Cluster = apps.get_model("clusterui", "Cluster")
    for row in RepairSettings.objects.all():
        Cluster.objects.filter(pk=row.cluster_id).update(
            scheduler=row.scheduler, scheduler_config=row.scheduler_config)


def copy_scheduler_back(apps, schema_editor):
    RepairSettings = apps.get_model("repairs", "RepairSettings")
    Cluster = apps.get_model("clusterui", "Cluster")
    for cluster in Cluster.objects.all():
        RepairSettings.objects.filter(cluster_id=cluster.pk).update(
            scheduler=cluster.scheduler, scheduler_config=cluster.scheduler_config)


class Migration(migrations.Migration):

    dependencies = [
        ("repairs", "0002_hand_down_running_repair"),
        ("clusterui", "0009_cluster_scheduler"),
    ]

    operations = [
        migrations.RunPython(copy_scheduler_to_cluster, copy_scheduler_back),
        migrations.RemoveField(model_name="repairsettings", name="scheduler"),
        migrations.RemoveField(model_name="repairsettings", name="scheduler_config"),
    ]
