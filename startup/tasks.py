from celery import shared_task

from . import services


@shared_task
def end_overdue_boot_holds():
    """Beat, every 10 s: nodes whose boot scripts' results never came stop booting."""
    return services.do_end_overdue_boot_holds()
