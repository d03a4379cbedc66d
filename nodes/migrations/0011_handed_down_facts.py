
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('nodes', '0010_alter_node_role'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='node',
            name='acceptance_detail',
            field=models.CharField(blank=True, help_text='where its acceptance battery stands, while pending (healthchecks)', max_length=255),
        ),
        migrations.AddField(
            model_name='node',
            name='checks_running_for_boot',
            field=models.CharField(blank=True, help_text='the boot id whose checks after a reboot are still running (healthchecks)', max_length=64),
        ),
        migrations.AddField(
            model_name='node',
            name='open_problem',
            field=models.CharField(blank=True, help_text='its open warning/critical health events, worst first (healthchecks)', max_length=255),
        ),
        migrations.AddField(
            model_name='node',
            name='running_repair',
            field=models.CharField(blank=True, help_text='the repair running on it (repairs)', max_length=255),
        ),
        migrations.AlterField(
            model_name='agentcommand',
            name='requested_by',
            field=models.ForeignKey(blank=True, help_text='empty: the system (a repair, a hello)', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
    ]
