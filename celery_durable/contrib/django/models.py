"""A model without a table, so that the admin lists durable schedules like any other model.

Schedules live in the journal. This unmanaged model gives the admin its app section, its URL
names and the usual permissions (``view``/``add``/``change``/``delete`` on "schedule"); the
admin views in :mod:`.admin` never query it.
"""

from __future__ import annotations

from django.db import models


class Schedule(models.Model):
    """A durable schedule as the admin names it (no table is ever created)."""

    id = models.CharField(primary_key=True, max_length=200)

    class Meta:
        managed = False
        db_table = "celery_durable_admin_schedule"
        verbose_name = "schedule"
        verbose_name_plural = "schedules"

    def __str__(self) -> str:
        return self.id
