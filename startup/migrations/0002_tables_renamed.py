from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('startup', '0001_initial'),
    ]

    operations = [
        migrations.RenameIndex(
            model_name='scriptrun',
            new_name='startup_scr_node_id_ccbe54_idx',
            old_name='nodes_scrip_node_id_7ad370_idx',
        ),
        migrations.AlterModelTable(
            name='scriptrun',
            table=None,
        ),
        migrations.AlterModelTable(
            name='startupscript',
            table=None,
        ),
        migrations.AlterModelTable(
            name='startupscriptversion',
            table=None,
        ),
    ]
