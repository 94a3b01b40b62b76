"""The unmanaged admin model: no table is created (schedules live in the journal)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Schedule",
            fields=[("id", models.CharField(max_length=200, primary_key=True, serialize=False))],
            options={
                "verbose_name": "schedule",
                "verbose_name_plural": "schedules",
                "db_table": "celery_durable_admin_schedule",
                "managed": False,
            },
        ),
    ]
