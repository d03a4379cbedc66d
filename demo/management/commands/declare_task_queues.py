from django.core.management.base import BaseCommand

from celery import current_app


class Command(BaseCommand):
    help = ("Create the broker's task queues (CELERY_TASK_QUEUES) before the Celery processes "
            "start. On the embedded SQLite broker, beat and the workers creating them at the "
            "same moment can leave beat unable to send any task for the rest of its run: "
            "kombu's SQLAlchemy transport does not roll back the failed insert.")

    def handle(self, **options):
        app = current_app  # the project's (clusterui/celery.py), loaded with the settings
        with app.connection_for_write() as connection:
            channel = connection.default_channel
            for queue in app.amqp.queues.values():
                queue(channel).declare()
                self.stdout.write(f"queue {queue.name} ready")
