"""The admin form that creates or changes a durable schedule.

The form only parses what a person types (times, durations, JSON); every rule of the
specification is checked by the library, and its errors (``InvalidSchedule``,
``UnknownTask``, ``ScheduleConflict``) are put on the field they concern.
"""

from __future__ import annotations

import json
import zoneinfo
from datetime import datetime, timedelta, timezone
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings

from celery_durable import presentation
from celery_durable.core import limits
from celery_durable.core.blackout_text import parse_window
from celery_durable.core.blackouts import Blackout, OnBlackout
from celery_durable.core.ids import check_schedule_id
from celery_durable.core.policies import POLICY_FIELDS, CatchUp, Overlap
from celery_durable.core.rules import Cron, Daily, Every, Once, Rule, Weekday, Weekly
from celery_durable.core.secrets import decode_secrets, encode_secrets
from celery_durable.errors import DurableError, InvalidSchedule, ScheduleConflict, UnknownTask
from celery_durable.presentation import format_duration

if TYPE_CHECKING:
    from celery_durable.core.read_models import ScheduleView
    from celery_durable.durable import Durable

KINDS = (
    ("daily", "Daily: every day at a local time"),
    ("weekly", "Weekly: on chosen days at a local time"),
    ("every", "Every: a fixed interval"),
    ("cron", "Cron: a five-field expression"),
    ("once", "Once: a single time"),
)
DAYS = tuple((day.short, day.name.capitalize()) for day in Weekday)


# Where a library error goes: the prefix of ``InvalidSchedule.field`` → the form field.
_FIELD_OF = {
    "at": "at",
    "zone": "zone",
    "days": "days",
    "interval": "every",
    "expr": "cron",
    "end_at": "end_at",
    "max_runs": "max_runs",
}


@lru_cache(maxsize=1)
def zone_names() -> tuple[str, ...]:
    """IANA zone names, for the zone field's suggestions."""
    return tuple(sorted(zoneinfo.available_timezones()))


def default_zone() -> str:
    """The zone new schedules start with: ``TIME_ZONE`` when it is an IANA name, else UTC."""
    name = str(getattr(settings, "TIME_ZONE", None) or "UTC")
    return name if name in zone_names() or name == "UTC" else "UTC"


def parse_duration(text: str) -> timedelta:
    """``30s``, ``5m``, ``1h30m``, ``2d``, ``1.5h``; a bare number is seconds."""
    try:
        return limits.parse_duration(text)
    except ValueError as exc:
        raise forms.ValidationError(str(exc)) from None


def parse_instant(text: str, zone: str | None) -> datetime:
    """An ISO 8601 time; with ``Z`` or an offset as written, else local time in ``zone``."""
    try:
        return presentation.parse_instant(text, zone)
    except presentation.NotATime as exc:
        if exc.reason == "offset":
            raise forms.ValidationError(
                "give a zone, or write the time with Z or an offset"
            ) from None
        raise forms.ValidationError(
            f"{text!r} is not a date and time (e.g. 2026-12-24 18:00, or 2026-12-24T17:00Z)"
        ) from None
    except InvalidSchedule:
        raise forms.ValidationError("the zone is unknown; write the time with Z") from None


def format_instant(moment: datetime | None, zone: str | None) -> str:
    """A time as the form shows it: local in ``zone`` (no offset), else UTC with ``Z``."""
    if moment is None:
        return ""
    if zone:
        try:
            local = limits.to_zone(moment, presentation.zone_of(zone))
        except ValueError:  # an unknown zone (InvalidSchedule)
            local = None
        if local is not None:
            return local.replace(tzinfo=None).isoformat(" ", "minutes")
    utc = moment.astimezone(timezone.utc).replace(tzinfo=None)
    return utc.isoformat("T", "minutes") + "Z"


def parse_json(text: str, what: str) -> Any:
    """The JSON of a field; ``{"$secret": "env:NAME"}`` in it is a Secret (P5)."""
    try:
        return decode_secrets(limits.parse_json(text, what)) if text.strip() else None
    except ValueError as exc:
        raise forms.ValidationError(str(exc)) from None


def json_text(value: Any) -> str:
    """A value as its field shows it: Secrets as their references, lookalikes escaped (P5)."""
    return json.dumps(encode_secrets(value)[0], ensure_ascii=False)


def _span_field(label: str, help_text: str) -> forms.CharField:
    """An optional duration field of a timing policy (P1–P3)."""
    return forms.CharField(
        label=label,
        required=False,
        help_text=f"Optional: {help_text}",
        widget=forms.TextInput(attrs={"size": 10}),
    )


def _text_area(label: str, help_text: str, initial: str = "") -> forms.CharField:
    """An optional two-line text field (the options' JSON, the blackout windows)."""
    return forms.CharField(
        label=label,
        required=False,
        initial=initial,
        help_text=help_text,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60, "class": "vLargeTextField"}),
    )


def reason_field(kept_in: str) -> forms.CharField:
    """The optional reason of a command, stored with the user's name (O5)."""
    return forms.CharField(
        label="Reason",
        required=False,
        max_length=1000,
        help_text=f"Optional: why, kept in {kept_in} with your user name (O5).",
        widget=forms.TextInput(attrs={"size": 60}),
    )


class ScheduleForm(forms.Form):
    """Create (``creating=True``) or change a schedule; :meth:`save` calls the library."""

    id = forms.CharField(
        label="ID",
        max_length=200,
        help_text="Unique for ever: a deleted schedule's ID can never be used again.",
    )
    task = forms.CharField(
        max_length=255,
        help_text="A task name registered in the Celery app, e.g. proj.tasks.backup.",
        widget=forms.TextInput(attrs={"list": "durable-task-names", "size": 50}),
    )
    kind = forms.ChoiceField(label="Rule", choices=KINDS, initial="daily")
    at = forms.CharField(
        label="At (local time)",
        required=False,
        help_text="HH:MM or HH:MM:SS in the zone below (daily and weekly rules).",
        widget=forms.TextInput(attrs={"placeholder": "02:00", "size": 10}),
    )
    days = forms.MultipleChoiceField(
        choices=DAYS, required=False, widget=forms.CheckboxSelectMultiple, label="Days"
    )
    every = forms.CharField(
        label="Interval",
        required=False,
        help_text="30s, 5m, 1h30m, 2d (from 1 second to 366 days).",
        widget=forms.TextInput(attrs={"placeholder": "1h", "size": 10}),
    )
    cron = forms.CharField(
        label="Cron expression",
        required=False,
        help_text="minute hour day-of-month month day-of-week, or @daily, @hourly …",
        widget=forms.TextInput(attrs={"placeholder": "0 2 * * *", "size": 30}),
    )
    once_at = forms.CharField(
        label="Run once at",
        required=False,
        help_text="2026-12-24 18:00 in the zone below, or with Z / an offset.",
        widget=forms.TextInput(attrs={"placeholder": "2026-12-24 18:00", "size": 25}),
    )
    zone = forms.CharField(
        max_length=100,
        help_text="IANA time zone (Europe/Oslo, UTC). Local times of the rule are read in it.",
        widget=forms.TextInput(attrs={"list": "durable-zone-names", "size": 30}),
    )
    end_at = forms.CharField(
        label="End at",
        required=False,
        help_text="Optional: no run after this time (same format as 'Run once at').",
        widget=forms.TextInput(attrs={"size": 25}),
    )
    max_runs = forms.IntegerField(
        label="Max runs",
        required=False,
        help_text=f"Optional: complete after this many runs (1 to {limits.MAX_RUNS:,}).",
    )
    input = forms.CharField(
        label="Input (JSON)",
        required=False,
        initial="null",
        help_text="Handed to the task at each run (JSON; null for none).",
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "class": "vLargeTextField"}),
    )
    catch_up = forms.ChoiceField(
        label="Catch-up",
        choices=[(c.value, c.name) for c in CatchUp],
        initial=CatchUp.LATEST.value,
        help_text="After downtime: LATEST runs the most recent missed time, ALL runs each "
        "(oldest first, at most 1000), NONE runs none.",
    )
    overlap = forms.ChoiceField(
        choices=[(o.value, o.name) for o in Overlap],
        initial=Overlap.ALLOW.value,
        help_text="When a run is still going at the next due time: ALLOW starts another, "
        "SKIP records it as skipped, BUFFER_ONE lets one wait.",
    )
    start_deadline = _span_field(
        "Start deadline",
        "a run not started this long after its due time never starts; it is recorded as "
        "missed (30s, 5m, 1h).",
    )
    jitter = _span_field(
        "Jitter",
        "send each run up to this long after its due time, at an offset fixed by its run ID, "
        "to spread load.",
    )
    catch_up_window = _span_field(
        "Catch-up window",
        "(LATEST and ALL) after downtime, due times older than this are dropped.",
    )
    blackouts = _text_area(
        "Blackout windows",
        "Optional, one per line: no run starts inside (P4). NAME;cron EXPR;DURATION;ZONE, "
        "NAME;daily HH:MM;DURATION;ZONE, NAME;weekly sat,sun@08:00;DURATION;ZONE or "
        "NAME;FROM;UNTIL (ISO 8601 instants with Z).",
    )
    on_blackout = forms.ChoiceField(
        label="On blackout",
        required=False,
        choices=[(o.value, o.name) for o in OnBlackout],
        initial=OnBlackout.SKIP.value,
        help_text="A due time inside a window (this schedule's or a global one): SKIP records "
        "it as skipped, DEFER runs it once when the window ends.",
    )
    options = _text_area(
        "Celery options (JSON)",
        'Optional: {"queue": "…", "priority": 5, "expires": 60, …}; a plain task without '
        'input also takes "args": […] and "kwargs": {…} (a durable task gets its input only).',
        initial="{}",
    )
    reason = reason_field("the schedule's history")

    def __init__(self, *args: Any, creating: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.creating = creating
        if not creating:
            self.fields["id"].disabled = True
            self.fields["id"].help_text = ""
        if not self.is_bound and not self.initial.get("zone"):
            self.fields["zone"].initial = default_zone()
        self.rule: Rule | None = None

    @classmethod
    def initial_of(cls, view: ScheduleView) -> dict[str, Any]:
        """The form's values for an existing schedule."""
        rule = view.rule
        zone = getattr(rule, "zone", None) or "UTC"
        options = {k: v for k, v in view.options.items()}
        data: dict[str, Any] = {
            "id": view.id,
            "task": view.task,
            "kind": rule.tag,
            "zone": zone,
            "end_at": format_instant(rule.end_at, zone),
            "max_runs": rule.max_runs,
            "input": json_text(view.input),
            "catch_up": view.catch_up.value,
            "overlap": view.overlap.value,
            **{
                name: "" if getattr(view, name) is None else format_duration(getattr(view, name))
                for name in POLICY_FIELDS
            },
            "options": json_text(options) if options else "{}",
            "blackouts": "\n".join(w.describe() for w in view.blackouts),
            "on_blackout": view.on_blackout.value,
        }
        if isinstance(rule, (Daily, Weekly)):
            data["at"] = rule.at.isoformat("minutes" if not rule.at.second else "seconds")
        if isinstance(rule, Weekly):
            data["days"] = [day.short for day in rule.days]
        if isinstance(rule, Every):
            data["every"] = format_duration(rule.interval)
        if isinstance(rule, Cron):
            data["cron"] = rule.expr
        if isinstance(rule, Once):
            data["once_at"] = format_instant(rule.at, zone)
        return data

    # Parsing ---------------------------------------------------------------------------------

    def clean_id(self) -> str:
        value = str(self.cleaned_data["id"])
        try:
            return check_schedule_id(value)
        except InvalidSchedule as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_input(self) -> Any:
        return parse_json(self.cleaned_data.get("input") or "", "the input")

    def _span(self, name: str) -> timedelta | None:
        text = (self.cleaned_data.get(name) or "").strip()
        return parse_duration(text) if text else None

    def clean_start_deadline(self) -> timedelta | None:
        return self._span("start_deadline")

    def clean_jitter(self) -> timedelta | None:
        return self._span("jitter")

    def clean_catch_up_window(self) -> timedelta | None:
        return self._span("catch_up_window")

    def clean_blackouts(self) -> list[Blackout]:
        lines = (self.cleaned_data.get("blackouts") or "").splitlines()
        try:
            return [parse_window(line, "blackout window") for line in lines if line.strip()]
        except InvalidSchedule as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_options(self) -> dict[str, Any]:
        value = parse_json(self.cleaned_data.get("options") or "", "the options")
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError("the options must be a JSON object")
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        kind = data.get("kind")
        zone = (data.get("zone") or "").strip()
        if kind is None or "zone" in self.errors:
            return data
        try:
            end_at = parse_instant(data["end_at"], zone) if data.get("end_at") else None
        except forms.ValidationError as exc:
            self.add_error("end_at", exc)
            return data
        bounds: dict[str, Any] = {"end_at": end_at, "max_runs": data.get("max_runs")}
        needed = {"daily": ["at"], "weekly": ["at", "days"], "every": ["every"]}
        needed |= {"cron": ["cron"], "once": ["once_at"]}
        missing = [name for name in needed[kind] if not data.get(name)]
        for name in missing:
            self.add_error(name, f"A {kind} rule needs this field.")
        if missing:
            return data
        try:
            self.rule = self._rule(kind, data, zone, bounds)
        except forms.ValidationError as exc:
            self.add_error(needed[kind][-1], exc)
        except InvalidSchedule as exc:
            self.add_library_error(exc)
        return data

    @staticmethod
    def _rule(kind: str, data: dict[str, Any], zone: str, bounds: dict[str, Any]) -> Rule:
        if kind == "daily":
            return Daily(data["at"].strip(), zone, **bounds)
        if kind == "weekly":
            return Weekly(data["days"], data["at"].strip(), zone, **bounds)
        if kind == "every":
            return Every(parse_duration(data["every"]), **bounds)
        if kind == "cron":
            return Cron(data["cron"], zone, **bounds)
        if kind == "once":
            return Once(parse_instant(data["once_at"], zone), **bounds)
        raise InvalidSchedule(f"unknown rule kind {kind!r}")  # pragma: no cover - a choice

    # Saving ------------------------------------------------------------------------------------

    def save(self, durable: Durable, *, by: str | None = None) -> bool:
        """Create or change the schedule; ``False`` (with the error on the form) when refused.

        ``by`` (the logged-in user) and the form's reason are stored with the command (O5).
        """
        data = self.cleaned_data
        args = (data["id"], data["task"].strip(), data["input"], self.rule, data["catch_up"])
        options = dict(data["options"], overlap=data["overlap"])
        options.update({name: data.get(name) for name in POLICY_FIELDS})
        options.update(
            blackouts=data.get("blackouts") or [], on_blackout=data.get("on_blackout") or "skip"
        )
        command = durable.schedules.create if self.creating else durable.schedules.change
        try:
            command(*args, by=by, reason=data.get("reason") or None, **options)
        except DurableError as exc:
            self.add_library_error(exc)
            return False
        return True

    def add_library_error(self, exc: DurableError) -> None:
        """Put a library error on the field it concerns (the whole form when none)."""
        self.add_error(self.field_of(exc), str(exc))

    def field_of(self, exc: DurableError) -> str | None:
        if isinstance(exc, UnknownTask):
            return "task"
        if isinstance(exc, ScheduleConflict):
            return None
        if not isinstance(exc, InvalidSchedule):
            return None
        where = str(getattr(exc, "field", "") or "")
        if where.startswith("Once."):
            return "once_at" if where == "Once.at" else _FIELD_OF.get(where.split(".", 1)[1])
        if where.startswith("Cron."):
            return "cron" if where != "Cron.zone" else "zone"
        if "." in where:
            return _FIELD_OF.get(where.split(".", 1)[1].split(".")[0])
        if where.startswith("blackout") or where == "on_blackout":
            return "on_blackout" if where == "on_blackout" else "blackouts"
        if where in ("catch_up", "overlap", "task", "input", "options", "reason", *POLICY_FIELDS):
            return where
        if where == "by":  # the user name: not a field of the form
            return None
        message = str(exc)
        if where in self.cleaned_data.get("options", {}) or message.startswith(
            ("option", "unknown option")
        ):
            return "options"
        if message.startswith("input"):
            return "input"
        if getattr(exc, "rule", None) == "S1":
            return "id" if self.creating else None
        if message.startswith("task"):
            return "task"
        return None
