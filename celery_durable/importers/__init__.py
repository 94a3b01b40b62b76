"""Importers: schedules from elsewhere brought into the journal.

``beat_schedule`` imports ``app.conf.beat_schedule`` at beat start-up (SPEC B1–B8), with
``celery_schedules`` turning Celery's schedule objects into rules; ``django_beat`` and
``redbeat`` import the rows of django-celery-beat and RedBeat (I1, I2). ``plan`` holds what
those two share (checking every entry before storing any, the ID mapping, the comparison with
what an earlier import stored, the report); ``django_beat`` and ``redbeat`` read their source.
Adapters: they import Celery, kombu and SQLAlchemy (or Django) lazily, so
this package's ``__init__`` loads nothing.
"""
