"""The public names of ``celery_durable`` (SPEC §8) are pinned here.

A name added to or removed from the package's exports fails :func:`test_the_exports_are_pinned`
until this list changes with it, so a change of the public API is always a decision. The package
writes its exports twice: the ``TYPE_CHECKING`` imports (``import A as A``) for type checkers,
and the module of each lazily loaded name, from which ``__all__`` is made; the other tests hold
the two to one another.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import celery_durable

PUBLIC = [
    "FRIDAY", "MAX_ID_LENGTH", "MONDAY", "SATURDAY", "SUNDAY", "THURSDAY", "TUESDAY", "WEDNESDAY",
    "AttemptTimeout", "Blackout", "Cancelled", "CatchUp", "ChildHandle", "Cron", "Crontab",
    "Daily", "Durable", "DurableError", "Every", "Faulted", "Finished", "InvalidSchedule",
    "OnBlackout", "Once", "Overlap", "Retry",
    "RunCancelled", "RunEnded", "RunFaulted", "RunParked", "RunView", "ScheduleConflict",
    "ScheduleNotFound", "ScheduleSpec", "ScheduleView", "ScheduledRun", "Secret",
    "SecretUnavailable", "Solar", "StepFailed", "UnknownTask", "Weekday", "Weekly", "gather",
    "now", "parallel", "parse_run_id", "patched", "race", "random", "rule_from_json", "run_id",
    "sleep", "step_context", "uuid4", "wait_signal",
]  # fmt: skip

SPEC_8 = [
    "Durable",
    "ScheduledRun",
    "CatchUp",
    "Overlap",
    "Daily",
    "Weekly",
    "Every",
    "Cron",
    "Once",
    "Solar",
    "MONDAY",
    "TUESDAY",
    "WEDNESDAY",
    "THURSDAY",
    "FRIDAY",
    "SATURDAY",
    "SUNDAY",
    "Retry",
    "Finished",
    "Faulted",
    "Cancelled",
    "run_id",
    "parse_run_id",
    "now",
    "uuid4",
    "random",
    "sleep",
    "wait_signal",
    "step_context",
    "DurableError",
    "InvalidSchedule",
    "ScheduleConflict",
    "UnknownTask",
    "StepFailed",
    "RunFaulted",
    "RunCancelled",
    "MAX_ID_LENGTH",
    "ChildHandle",
    "parallel",
    "race",
    "gather",
    "patched",
]
"""The names SPEC §8 lists for the features this version has."""


def type_checking_imports() -> dict[str, str]:
    """Name → module of the ``from … import …`` lines under ``if TYPE_CHECKING:``."""
    tree = ast.parse(Path(celery_durable.__file__).read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for child in node.body:
                assert isinstance(child, ast.ImportFrom) and child.module is not None
                # ``import A as A``: an explicit re-export for type checkers.
                assert all(alias.asname == alias.name for alias in child.names), child.lineno
                found.update({alias.name: child.module for alias in child.names})
    return found


def test_the_exports_are_pinned() -> None:
    assert sorted(celery_durable.__all__) == sorted(PUBLIC)
    assert len(set(PUBLIC)) == len(PUBLIC)


def test_every_name_spec_8_lists_is_exported() -> None:
    assert [name for name in SPEC_8 if name not in celery_durable.__all__] == []


def test_the_two_lists_of_exports_agree() -> None:
    lazy = celery_durable._MODULE_OF
    assert set(lazy) == set(celery_durable.__all__)
    assert type_checking_imports() == lazy


def test_every_export_loads_from_its_module() -> None:
    for name, module in celery_durable._MODULE_OF.items():
        assert getattr(celery_durable, name) is getattr(importlib.import_module(module), name)
    assert set(celery_durable.__all__) <= set(dir(celery_durable))


def test_the_module_paths_the_docs_give_users_import() -> None:
    """docs/observability.md imports ``celery_durable.signals`` and ``celery_durable.metrics``;
    the code lives in ``observability/`` and the public paths re-export the same objects."""
    from celery_durable import metrics, signals
    from celery_durable.observability import metrics as defined_metrics
    from celery_durable.observability import signals as defined_signals

    assert signals.run_started is defined_signals.run_started
    assert set(signals.__all__) == set(defined_signals.__all__)
    assert metrics.install_metrics is defined_metrics.install_metrics
