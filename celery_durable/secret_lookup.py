"""Where a :class:`~celery_durable.core.secrets.Secret` is read (P5): this process's
environment (``env:``) or its settings (``setting:``: the Celery app's configuration, then
Django's settings when Django is configured)."""

from __future__ import annotations

import os
import sys
from typing import Any

from celery_durable.core.secrets import Lookup


def secret_lookup(app: Any) -> Lookup:
    """The lookup that reads secrets for ``app`` in this process; ``KeyError`` when missing."""

    def lookup(scheme: str, name: str) -> Any:
        if scheme == "env":
            return os.environ[name]
        conf = getattr(app, "conf", None)
        if conf is not None and name in conf:
            return conf[name]
        return _django_setting(name)

    return lookup


def _django_setting(name: str) -> Any:
    conf = sys.modules.get("django.conf")  # only when the project loaded Django itself
    settings = getattr(conf, "settings", None)
    if settings is None or not getattr(settings, "configured", False):
        raise KeyError(name)
    missing = object()
    value = getattr(settings, name, missing)
    if value is missing:
        raise KeyError(name)
    return value
