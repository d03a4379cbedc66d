from celery import shared_task

from . import services


@shared_task
def end_overdue_boot_holds():
    """Beat, every 10 s: nodes whose boot scripts' results never came stop booting."""
    return services.do_end_overdue_boot_holds()


@shared_task
def prune_script_runs():
    """Beat, hourly: script runs older than CLUSTERUI_SCRIPT_RUN_RETENTION_DAYS go."""
    return services.prune_script_runs()
