"""Importers: schedules of django-celery-beat and RedBeat brought into the journal (SPEC I1, I2).

``plan`` holds what both share (checking every entry before storing any, the ID mapping, the
comparison with what an earlier import stored, the report); ``django_beat`` and ``redbeat``
read their source. Adapters: they import Celery, kombu and SQLAlchemy (or Django) lazily, so
this package's ``__init__`` loads nothing.
"""
