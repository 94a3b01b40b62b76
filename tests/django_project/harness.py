"""Start the test project in the pytest process (no pytest-django).

Django's settings can be configured once per process, so the project is set up once: its own
tables (users, sessions) in an SQLite file of the session, while each test points the admin at
its own Celery app and journal (SQLite or PostgreSQL) through ``CELERY_DURABLE_APP``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent


def setup_django(db_path: Path) -> None:
    """Configure Django from ``durable_site.settings`` with its database at ``db_path``."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    if str(PROJECT_DIR) not in sys.path:
        sys.path.insert(0, str(PROJECT_DIR))
    saved = {k: os.environ.get(k) for k in ("DJANGO_SETTINGS_MODULE", "DURABLE_SITE_DB")}
    os.environ["DURABLE_SITE_DB"] = str(db_path)
    try:
        import durable_site.settings as site
    finally:
        # durable_site/celery.py sets DJANGO_SETTINGS_MODULE, as Celery's Django layout does.
        # Left in the environment it would reach every Celery app and worker subprocess that
        # other tests start: put the environment back as it was.
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    settings.configure(**{name: getattr(site, name) for name in dir(site) if name.isupper()})
    django.setup()
    from django.test.utils import setup_test_environment

    setup_test_environment()  # the test client records templates and contexts

    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    get_user_model().objects.create_superuser("admin", "admin@example.com", "pw")
