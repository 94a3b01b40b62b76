"""``ScheduleSpec``: one schedule for ``schedules.create_many`` (D13), the arguments of ``create``.

A spec holds what a call of ``schedules.create`` takes, field for field, so that a loop of
``create`` calls becomes one list of specs without renaming anything. ``create_many`` also
takes plain mappings with the same keys, where every key that is not one of ``create``'s
named arguments is an option, exactly as ``create(**mapping)`` would read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_durable.core.policies import CatchUp
from celery_durable.errors import InvalidSchedule

SPEC_FIELDS = ("id", "task", "input", "rule", "catch_up", "by", "reason")
"""The named arguments of ``schedules.create``, in order; other keys of a mapping are options."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """One schedule to create: ``create(id, task, input, rule, catch_up, by=, reason=, **options)``.

    >>> ScheduleSpec(id="report-7", task="reports.send", input={"customer": 7},
    ...              rule=Daily("06:00", "Europe/Oslo"), options={"queue": "reports"})
    """

    id: str
    task: Any
    input: Any = None
    rule: Any = None
    catch_up: CatchUp | str = CatchUp.LATEST
    by: str | None = None
    reason: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: ScheduleSpec | Mapping[str, Any], index: int) -> ScheduleSpec:
        """A spec as given, or built from a mapping of ``create``'s arguments.

        Raises ``InvalidSchedule`` naming the spec's index for anything else, or for a
        mapping without ``id`` or ``task``.
        """
        if isinstance(spec, ScheduleSpec):
            return spec
        if not isinstance(spec, Mapping):
            raise InvalidSchedule(
                f"specs[{index}] must be a ScheduleSpec or a mapping of create()'s "
                f"arguments, not {type(spec).__name__}",
                field="specs",
                index=index,
            )
        missing = [name for name in ("id", "task") if name not in spec]
        if missing:
            raise InvalidSchedule(
                f"specs[{index}] has no {missing[0]!r}", field=missing[0], index=index
            )
        named = {k: spec[k] for k in SPEC_FIELDS if k in spec}
        options = {k: v for k, v in spec.items() if k not in SPEC_FIELDS}
        return cls(**named, options=options)
