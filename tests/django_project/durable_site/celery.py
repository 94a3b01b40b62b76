"""The project's Celery app, as in Celery's "First steps with Django"."""

import os

from celery import Celery

from celery_durable import Durable

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_site.settings")

app = Celery("durable_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# The journal URL comes from CELERY_DURABLE_URL, else from DATABASES["default"] (set by the
# celery_durable.contrib.django app when Django starts).
durable = Durable(app)
