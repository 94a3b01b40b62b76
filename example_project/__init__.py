"""The celery_durable example project: two scheduled jobs in one Celery service.

* ``nightly-backup`` copies a folder into a backup store every night at 02:00 Europe/Oslo
  (``CatchUp.LATEST``: after downtime, only the most recent missed night runs);
* ``invoice-ada`` invoices the customer Ada every Monday at 08:00 Europe/Oslo
  (``CatchUp.ALL``: every missed Monday is invoiced, each under its own invoice number).

``python -m example_project`` creates the schedules, starts a worker and beat, runs a short
demo schedule and stops everything again. See ``docs/howto-scheduled-jobs.md``.
"""
