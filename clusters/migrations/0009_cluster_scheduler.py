from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('clusterui', '0008_change_feed'),
    ]

    operations = [
        migrations.AddField(
            model_name='cluster',
            name='scheduler',
            field=models.CharField(choices=[('none', 'none (nothing to drain)'), ('slurm', 'Slurm'), ('kubernetes', 'Kubernetes')], default='none', help_text="What runs the cluster's jobs: repairs drain and resume nodes through it, and job accounting reads Slurm's.", max_length=16),
        ),
        migrations.AddField(
            model_name='cluster',
            name='scheduler_config',
            field=models.CharField(blank=True, help_text="Slurm: the slurm.conf the console's scontrol and sacct use (empty: the default). Kubernetes: a kubeconfig path (empty: in-cluster credentials).", max_length=255),
        ),
    ]
