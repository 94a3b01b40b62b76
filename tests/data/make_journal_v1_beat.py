"""Write ``tests/data/journal-v1-beat.sqlite``: a journal of schema version 1 whose schedules
came from ``beat_schedule``, from the API and from an importer, with the index projected, for
``tests/store/test_upgrade.py`` (SPEC §9; version 2 added the index's ``origin`` column, D13).

    python -m tests.data.make_journal_v1_beat      # with the version-1 code first on PYTHONPATH

It was written on 2026-12-04 by the code just before schema version 2 (git archive of that
commit on ``PYTHONPATH``). Do not regenerate it with newer code: the point of the file is that
it was written by the *previous* code.

What it holds (times from a fake clock starting at ``BASE``):

* ``keep`` and ``gone`` — ``beat_schedule`` entries, every 60 s (``options["beat_entry"]``);
* ``celery.backend_cleanup`` — the entry Celery's beat installs itself (B7);
* ``api-made`` — ``Every(60 s)`` created through the API;
* ``from-redbeat`` — created with the importer's marker option ``imported_from``;
* every index row written by a dispatcher tick, so the events hold nothing after its position.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from celery import Celery
from celery.schedules import crontab

from tests.data.make_journal_v1 import write_fixture

UTC = timezone.utc
BASE = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
FIXTURE = Path(__file__).with_name("journal-v1-beat.sqlite")
ENTRIES: dict[str, dict[str, Any]] = {
    "keep": {"task": "upgrade.report", "schedule": 60.0, "args": [1]},
    "gone": {"task": "upgrade.report", "schedule": 60.0, "args": [2]},
    "celery.backend_cleanup": {
        "task": "celery.backend_cleanup",
        "schedule": crontab("0", "4", "*"),
        "options": {"expires": 12 * 3600},
    },
}
ORIGINS = {
    "keep": "beat_schedule",
    "gone": "beat_schedule",
    "celery.backend_cleanup": "beat_schedule",
    "api-made": None,
    "from-redbeat": "redbeat",
}
"""What version 2's ``origin`` column must say of each row after the migration."""


def make(path: Path) -> None:
    from celery_durable import Durable, Every
    from celery_durable.importers.beat_schedule import import_beat_schedule

    now = [BASE]
    app = Celery("upgrade-beat", broker="memory://", set_as_current=False)
    app.conf.update(task_ignore_result=True)
    durable = Durable(app, f"sqlite:///{path}", clock=lambda: now[0])

    @app.task(name="upgrade.report", shared=False)
    def report(*args: Any, **kwargs: Any) -> None:
        return None

    report_ = import_beat_schedule(durable, ENTRIES)
    assert set(report_.imported) == set(ENTRIES), report_
    durable.schedules.create("api-made", "upgrade.report", None, Every(timedelta(seconds=60)))
    durable.schedules.create(
        "from-redbeat",
        "upgrade.report",
        None,
        Every(timedelta(minutes=5)),
        imported_from={"source": "redbeat", "name": "from-redbeat"},
    )
    dispatcher = durable.dispatcher()
    now[0] = BASE + timedelta(seconds=1)
    dispatcher.tick()
    dispatcher.close()
    durable.close()


def main() -> None:
    write_fixture(make, FIXTURE)


if __name__ == "__main__":
    main()
