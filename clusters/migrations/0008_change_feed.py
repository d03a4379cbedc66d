
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('clusterui', '0007_failed_sign_in'),
    ]

    operations = [
        migrations.CreateModel(
            name='FeedCursor',
            fields=[
                ('reader', models.CharField(max_length=32, primary_key=True, serialize=False)),
                ('version', models.PositiveBigIntegerField(default=0, help_text='one more at every read: two readers of one name, one wins')),
                ('last_id', models.BigIntegerField(default=0)),
                ('gaps', models.JSONField(blank=True, default=dict, help_text='{id: unix time it was first missed}')),
                ('read_at', models.DateTimeField(blank=True, null=True)),
            ],
        ),
        migrations.CreateModel(
            name='Change',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('kind', models.CharField(choices=[('node_state', "a node's state"), ('health_event', 'a health event'), ('repair', 'a repair'), ('check_run', 'a check run'), ('script_run', 'a startup script run'), ('agent_work', "work queued for a node's agent"), ('agent_config', "a node's agent configuration")], max_length=16)),
                ('node_id', models.BigIntegerField(blank=True, null=True)),
                ('object_id', models.CharField(blank=True, help_text="what changed: a pk, or for agent work 'kind:pk'", max_length=64)),
                ('at', models.DateTimeField()),
                ('cluster', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='clusterui.cluster')),
            ],
            options={
                'ordering': ['id'],
                'indexes': [models.Index(fields=['at'], name='clusterui_c_at_3b44fe_idx')],
            },
        ),
    ]
