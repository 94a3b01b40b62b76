"""Test-only helpers for celery_durable: service resolution and subprocess management.

* :mod:`tests.support.services` -- find the PostgreSQL / Redis / RabbitMQ servers the tests talk
  to, or start throwaway PostgreSQL / Redis servers from pip-installed wheels.
* :mod:`tests.support.missing` -- what a test does when MariaDB/MySQL, RabbitMQ or Chromium is
  missing: skipped outside CI (and counted in the run's last line), failed under ``CI=true``.
* :mod:`tests.support.processes` -- run a command (e.g. a Celery worker) in the background for an
  end-to-end test, with its output captured to a log file, and poll with :func:`wait_for`.
"""
