"""Test-only helpers for celery_durable: service resolution and subprocess management.

* :mod:`tests.support.services` -- find the PostgreSQL / Redis / RabbitMQ servers the tests talk
  to, or start throwaway PostgreSQL / Redis servers from pip-installed wheels.
* :mod:`tests.support.processes` -- run a command (e.g. a Celery worker) in the background for an
  end-to-end test, with its output captured to a log file, and poll with :func:`wait_for`.
"""
