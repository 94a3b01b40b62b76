"""The Django app of celery_durable."""

from __future__ import annotations

import logging

from django.apps import AppConfig

log = logging.getLogger("celery_durable.contrib.django")


class CeleryDurableConfig(AppConfig):
    """``celery_durable.contrib.django``: admin pages, management commands, journal URL."""

    name = "celery_durable.contrib.django"
    label = "celery_durable"
    verbose_name = "Durable schedules"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        # Beat and workers of a Django project get the journal URL that Django resolves
        # (CELERY_DURABLE_URL, else the default database) before anything reads it.
        from celery_durable.config import register_app_hook
        from celery_durable.contrib.django import celery_app, configure

        # Any other app a process loads (the CLI's -A app) gets the same, once its task
        # modules are imported (config.import_task_modules).
        register_app_hook(configure)
        try:
            configure(celery_app())
        except Exception:
            # A broken setting must not stop `manage.py` from starting: the admin pages and
            # commands raise the error again, with its message, when they are used.
            log.warning("celery_durable: cannot configure the journal URL", exc_info=True)
