import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    """The startup scripts' tables as nodes made them (nodes 0008): this app takes them over
    without touching the database."""

    initial = True

    dependencies = [
        ('clusterui', '0008_change_feed'),
        ('nodes', '0012_startup_scripts_moved_to_startup'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.CreateModel(
                name='StartupScript',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('event', models.CharField(choices=[('node_boot', 'node boot'), ('job_start', 'job start'), ('job_end', 'job end')], max_length=16)),
                    ('role', models.CharField(choices=[('worker', 'worker'), ('login', 'login'), ('controller', 'controller')], max_length=16)),
                    ('timeout_s', models.PositiveIntegerField(default=300)),
                    ('cluster', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='startup_scripts', to='clusterui.cluster')),
                ],
                options={
                    'db_table': 'nodes_startupscript',
                    'ordering': ['cluster', 'event', 'role'],
                },
            ),
            migrations.CreateModel(
                name='StartupScriptVersion',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('number', models.PositiveIntegerField()),
                    ('body', models.TextField()),
                    ('created_at', models.DateTimeField()),
                    ('shellcheck_warnings', models.TextField(blank=True, help_text='what shellcheck said at save (or that it was not installed)')),
                    ('warnings_accepted', models.BooleanField(default=False)),
                    ('rolled_back_from', models.PositiveIntegerField(blank=True, help_text='the version whose body this one restored', null=True)),
                    ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                    ('script', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='versions', to='startup.startupscript')),
                ],
                options={
                    'db_table': 'nodes_startupscriptversion',
                    'ordering': ['script', '-number'],
                },
            ),
            migrations.AddField(
                model_name='startupscript',
                name='current_version',
                field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='startup.startupscriptversion'),
            ),
            migrations.CreateModel(
                name='ScriptRun',
                fields=[
                    ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                    ('version_number', models.PositiveIntegerField(blank=True, null=True)),
                    ('event', models.CharField(choices=[('node_boot', 'node boot'), ('job_start', 'job start'), ('job_end', 'job end')], max_length=16)),
                    ('job_id', models.CharField(blank=True, max_length=64)),
                    ('exit_code', models.IntegerField(blank=True, null=True)),
                    ('timed_out', models.BooleanField(default=False)),
                    ('duration_s', models.FloatField()),
                    ('output_tail', models.TextField(blank=True)),
                    ('received_at', models.DateTimeField()),
                    ('node', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='script_runs', to='nodes.node')),
                    ('script', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='runs', to='startup.startupscript')),
                    ('version', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='runs', to='startup.startupscriptversion')),
                ],
                options={
                    'db_table': 'nodes_scriptrun',
                    'ordering': ['-received_at', '-id'],
                },
            ),
            migrations.AddConstraint(
                model_name='startupscriptversion',
                constraint=models.UniqueConstraint(fields=('script', 'number'), name='startup_script_version_unique_number'),
            ),
            migrations.AddConstraint(
                model_name='startupscript',
                constraint=models.UniqueConstraint(fields=('cluster', 'event', 'role'), name='startup_script_unique_event_role'),
            ),
            migrations.AddIndex(
                model_name='scriptrun',
                index=models.Index(fields=['node', '-received_at'], name='nodes_scrip_node_id_7ad370_idx'),
            ),
    ]),
    ]
