from django.db import migrations


class Migration(migrations.Migration):
    """Startup scripts moved to the startup app, tables and all: only Django's idea of which
    app owns them changes here (startup's 0001 takes them over, its 0002 renames them)."""

    dependencies = [
        ('nodes', '0011_handed_down_facts'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(state_operations=[
            migrations.RemoveField(
                model_name='startupscript',
                name='cluster',
            ),
            migrations.RemoveField(
                model_name='startupscript',
                name='current_version',
            ),
            migrations.RemoveField(
                model_name='startupscriptversion',
                name='script',
            ),
            migrations.RemoveField(
                model_name='startupscriptversion',
                name='created_by',
            ),
            migrations.DeleteModel(
                name='ScriptRun',
            ),
            migrations.DeleteModel(
                name='StartupScript',
            ),
            migrations.DeleteModel(
                name='StartupScriptVersion',
            ),
    ]),
    ]
