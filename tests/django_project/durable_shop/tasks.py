"""Tasks found by ``app.autodiscover_tasks()``: one plain, one durable."""

from celery import shared_task
from durable_site.celery import durable

from celery_durable import ScheduledRun


@shared_task(name="shop.send_report")
def send_report(customer: str) -> str:
    return f"report for {customer}"


@durable.task(name="shop.nightly_backup")
def nightly_backup(run: ScheduledRun) -> str:
    return f"backed up {run.input}"
