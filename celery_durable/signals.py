"""The run signals at their public path (docs/observability.md); defined, with the code that
sends them, in :mod:`celery_durable.observability.signals`."""

from celery_durable.observability.signals import *  # noqa: F403
from celery_durable.observability.signals import __all__ as __all__
