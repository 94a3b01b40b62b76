"""The Prometheus metrics at their public path (docs/observability.md); defined in
:mod:`celery_durable.observability.metrics`."""

from celery_durable.observability.metrics import *  # noqa: F403
from celery_durable.observability.metrics import __all__ as __all__
