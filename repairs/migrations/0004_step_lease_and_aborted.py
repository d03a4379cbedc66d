from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('repairs', '0003_scheduler_belongs_to_the_cluster'),
    ]

    operations = [
        migrations.AddField(
            model_name='repairstep',
            name='lease_holder',
            field=models.CharField(blank=True, help_text='the delivery (Celery task id) running it now', max_length=64),
        ),
        migrations.AddField(
            model_name='repairstep',
            name='lease_until',
            field=models.DateTimeField(blank=True, help_text='a running step whose worker died is run again after this (repairs.steps)', null=True),
        ),
        migrations.AlterField(
            model_name='repair',
            name='status',
            field=models.CharField(choices=[('proposed', 'proposed'), ('approved', 'approved'), ('waiting', 'waiting'), ('running', 'running'), ('succeeded', 'succeeded'), ('failed', 'failed'), ('rejected', 'rejected'), ('resolved', 'resolved'), ('superseded', 'superseded'), ('cancelled', 'cancelled'), ('aborted', 'aborted')], default='proposed', max_length=16),
        ),
        migrations.AlterField(
            model_name='repairtransition',
            name='from_status',
            field=models.CharField(blank=True, choices=[('proposed', 'proposed'), ('approved', 'approved'), ('waiting', 'waiting'), ('running', 'running'), ('succeeded', 'succeeded'), ('failed', 'failed'), ('rejected', 'rejected'), ('resolved', 'resolved'), ('superseded', 'superseded'), ('cancelled', 'cancelled'), ('aborted', 'aborted')], max_length=16),
        ),
        migrations.AlterField(
            model_name='repairtransition',
            name='to_status',
            field=models.CharField(choices=[('proposed', 'proposed'), ('approved', 'approved'), ('waiting', 'waiting'), ('running', 'running'), ('succeeded', 'succeeded'), ('failed', 'failed'), ('rejected', 'rejected'), ('resolved', 'resolved'), ('superseded', 'superseded'), ('cancelled', 'cancelled'), ('aborted', 'aborted')], max_length=16),
        ),
    ]
