"""``durable.schedules``: create, change, pause, resume, delete and read schedules (SPEC §3, §7).

Every command reads the schedule's state, asks the aggregate, and appends the resulting events
at the version it read. When another process appended first, the command reads again and asks
again (A8): the journal's unique ``(stream, version)`` makes the loser see the winner's events.
"""

from __future__ import annotations

import builtins
import inspect
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from celery_durable.blackouts import GlobalBlackouts
from celery_durable.core import sun
from celery_durable.core.audit import HistoryEntry, check_audit, history_of
from celery_durable.core.backfill import (
    MAX_BACKFILL,
    Backfilled,
    backfill_due_times,
    why_nothing,
)
from celery_durable.core.blackouts import Blackout, OnBlackout, check_windows
from celery_durable.core.codec import check_json_value
from celery_durable.core.ids import (
    MAX_ID_LENGTH,
    SHOWN_ID_LENGTH,
    check_schedule_id,
    check_text,
    run_stream,
    schedule_stream,
    shown,
    to_utc,
)
from celery_durable.core.ids import run_id as make_run_id
from celery_durable.core.journal import Append
from celery_durable.core.limits import MAX_PERIOD_SECONDS, check_instant, check_rule_limits
from celery_durable.core.policies import POLICY_FIELDS, CatchUp, Overlap, Timing
from celery_durable.core.read_models import (
    ENDED,
    ENDING_EVENTS,
    NOT_STARTED,
    RunStatus,
    RunView,
    ScheduleView,
    ending_of,
    project_run,
    run_outcome,
)
from celery_durable.core.rules import (
    BeatEntry,
    Cron,
    Crontab,
    Daily,
    Every,
    LiveSchedules,
    Once,
    Rule,
    Solar,
    Weekly,
)
from celery_durable.core.schedule_aggregate import (
    Change,
    Command,
    Create,
    DecideRun,
    Delete,
    Pause,
    Resume,
    ScheduleState,
    decide,
    decide_all,
)
from celery_durable.core.schedule_events import (
    Content,
    RunDecided,
    RunEndReported,
    RunFailedToStart,
    RunMissed,
    RunSent,
    RunSkipped,
    ScheduleEvent,
    from_stored,
    to_new_event,
)
from celery_durable.core.secrets import (
    SECRETS_OPTION,
    encode_secrets,
    holds_references,
    shown_input,
    shown_options,
)
from celery_durable.core.specs import ScheduleSpec
from celery_durable.errors import DurableError, InvalidSchedule
from celery_durable.message import (
    IMPORTED,
    NUMBER_OPTIONS,
    SCHEDULE_OPTIONS,
    STR_OPTIONS,
    origin_of,
)
from celery_durable.observability import signals
from celery_durable.store.conflicts import retry_on_conflict
from celery_durable.store.index import UnreadableEntry, fold_stored, stream_schedule_id
from celery_durable.store.snapshots import fold_stream

if TYPE_CHECKING:
    from celery_durable.runtime import Runtime

_RULE_TYPES = (Daily, Weekly, Every, Cron, Crontab, Solar, Once)
_EPOCH = datetime(2000, 1, 1, tzinfo=timezone.utc)

log = logging.getLogger("celery_durable.schedules")


@contextmanager
def _naming(index: int, schedule_id: Any) -> Iterator[None]:
    """Raise an error of a spec of ``create_many`` again, its message naming the spec."""
    named = _shown_id(schedule_id)
    try:
        yield
    except DurableError as exc:
        fields = {**exc._fields, "index": index}
        raise type(exc)(f"specs[{index}] (id {named}): {exc.message}", **fields) from None
    except (TypeError, ValueError) as exc:
        raise InvalidSchedule(f"specs[{index}] (id {named}): {exc}", index=index) from exc


def _shown_id(schedule_id: Any) -> str:
    """The ID as an error names it: whole when S1 allows its length, else cut, with its length
    (bad input is named, not repeated without bound)."""
    if isinstance(schedule_id, str):
        return shown(schedule_id, whole_up_to=MAX_ID_LENGTH)
    text = repr(schedule_id)
    return text if len(text) <= SHOWN_ID_LENGTH else text[:SHOWN_ID_LENGTH] + "…"


MAX_OPTION_SECONDS = MAX_PERIOD_SECONDS
"""The largest ``expires``, ``time_limit`` or ``soft_time_limit`` in seconds (100 years)."""


def check_options(options: Mapping[str, Any], max_bytes: int) -> dict[str, Any]:
    """Validate the Celery options of a schedule; ``InvalidSchedule`` names the bad one."""
    # An imported schedule keeps its marker when changed (I1, I2): it is stored, never sent.
    unknown = sorted(set(options) - SCHEDULE_OPTIONS - {IMPORTED})
    if unknown:
        raise InvalidSchedule(
            f"unknown option {unknown[0]!r}; known: {', '.join(sorted(SCHEDULE_OPTIONS))}",
            field=unknown[0],
        )
    checked: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key == IMPORTED and not isinstance(value, dict):
            raise InvalidSchedule(f"option {IMPORTED!r} must be a dict", field=key)
        if key == "args" and not isinstance(value, list):
            raise InvalidSchedule("option 'args' must be a list", field=key)
        if key in ("kwargs", "headers") and not isinstance(value, dict):
            raise InvalidSchedule(f"option {key!r} must be a dict", field=key)
        if key in STR_OPTIONS:
            check_text(value, f"option {key!r}")
        if key in NUMBER_OPTIONS and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
        ):
            raise InvalidSchedule(f"option {key!r} must be a positive number of seconds", field=key)
        if key in NUMBER_OPTIONS and not value <= MAX_OPTION_SECONDS:
            # Celery adds `expires` to the send time: a date must hold the sum.
            raise InvalidSchedule(
                f"option {key!r} must be at most {MAX_OPTION_SECONDS:,.0f} s (100 years), "
                f"not {value!r}",
                field=key,
            )
        if key == "priority" and (
            isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 255
        ):
            raise InvalidSchedule("option 'priority' must be an int from 0 to 255", field=key)
        checked[key] = check_json_value(value, f"option {key!r}", max_bytes=max_bytes)
    return checked


def check_call(
    runtime: Runtime,
    schedule_id: str,
    content: Content,
    *,
    args_from: str = "the schedule's args and kwargs options",
) -> None:
    """Refuse a schedule whose runs could never call their task (``InvalidSchedule``).

    The arguments its messages will carry (built as the dispatcher builds them,
    :func:`celery_durable.message.run_message`: a durable task gets the ``ScheduledRun``; a
    plain task ``args``/``kwargs`` options, else the input as its one argument) must fit the
    task's signature, checked the way Celery's ``apply_async`` checks it
    (``task.__header__``). A task known only by name, or with ``typing=False``, is not checked.
    ``create``/``change`` and both importers (I1, I2) share this one test; ``args_from`` names
    where the args came from in the message.

    Values a run would never send are refused too, whatever ``typing`` says: ``args`` or
    ``kwargs`` options for a durable task (its message is the ``ScheduledRun``; the values
    belong in the input), and an input beside them for a plain task (the message carries the
    args, so the input would reach no one).
    """
    is_durable = runtime.is_durable(content.task)
    check_sent(content, is_durable=is_durable)
    task = runtime.app.tasks.get(content.task)
    if task is None or getattr(task, "typing", True) is False:
        return
    from celery_durable.core.schedule_aggregate import PendingRun
    from celery_durable.message import run_message

    pending = PendingRun(
        due=_EPOCH, run_id="", task=content.task, input=content.input, options=content.options
    )
    message = run_message(schedule_id, pending, durable=is_durable)
    header = getattr(task, "__header__", None)
    try:
        if header is not None:
            header(*message.args, **message.kwargs)
        else:
            inspect.signature(task.run).bind(*message.args, **message.kwargs)
    except TypeError as exc:
        field = "input"
        if is_durable:
            given = "one argument, the ScheduledRun (schedule, due, input)"
        elif "args" in content.options or "kwargs" in content.options:
            given, field = args_from, "options"
        elif content.input is None:
            given = "no argument (the schedule has no input)"
        else:
            given = "one argument, the schedule's input"
        raise InvalidSchedule(
            f"task {content.task!r} cannot be called with {given}: {exc}", field=field
        ) from None


def check_sent(content: Content, *, is_durable: bool) -> None:
    """Refuse ``args``/``kwargs`` options a run would drop (see :func:`check_call`)."""
    given = [k for k in ("args", "kwargs") if content.options.get(k) is not None]
    if not given:
        return
    named = " and ".join(repr(k) for k in given)
    if is_durable:
        raise InvalidSchedule(
            f"task {content.task!r} is a durable task: each run is sent one ScheduledRun "
            f"(schedule, due, input), never the option {named}; put those values in the input",
            field="options",
        )
    if content.input is not None:
        raise InvalidSchedule(
            f"task {content.task!r} would be sent the option {named} and never the input: "
            "a plain task gets either the input as its one argument or args and kwargs; "
            "give one of them",
            field="input",
        )


class Schedules:
    """Runtime management of durable schedules. Reach it as ``durable.schedules``."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self.store = ScheduleStore(runtime)

    # Commands ----------------------------------------------------------------------------

    def create(
        self,
        id: str,
        task: Any,
        input: Any = None,
        rule: Rule | None = None,
        catch_up: CatchUp | str = CatchUp.LATEST,
        *,
        by: str | None = None,
        reason: str | None = None,
        **options: Any,
    ) -> None:
        """Create schedule ``id`` starting ``task`` with ``input`` at each due time of ``rule``.

        ``options`` are Celery message options (``queue``, ``priority``, ``expires`` …) and the
        policies ``overlap`` (D7), ``start_deadline``, ``jitter`` and ``catch_up_window``
        (P1–P3: a ``timedelta`` or seconds), ``blackouts`` (a list of :class:`Blackout`) and
        ``on_blackout`` (``"skip"`` or ``"defer"``, P4). A second create with the content the
        schedule was first created with stores nothing (A1). Raises ``InvalidSchedule`` for bad
        arguments, ``UnknownTask`` when the task is not registered (A7), ``ScheduleConflict``
        for other content or a deleted ID. ``by`` and ``reason`` (who and why, O5) are stored
        with the event, as on every command, and shown by :meth:`history`.

        >>> durable.schedules.create("nightly", "backup", "/srv", Daily("02:00", "Europe/Oslo"))
        """
        check_audit(by, reason)
        content = self.check(id, task, input, rule, catch_up, options)
        self._execute(id, lambda now: Create(content=content, now=now, by=by, reason=reason))

    def create_many(self, specs: Iterable[ScheduleSpec | Mapping[str, Any]]) -> int:
        """Create many schedules at once, all or nothing (D13); return how many were new.

        Each spec is a :class:`ScheduleSpec` or a mapping of :meth:`create`'s arguments (keys
        other than ``id``, ``task``, ``input``, ``rule``, ``catch_up``, ``by``, ``reason`` are
        options). Every spec is checked as :meth:`create` checks it before anything is
        stored; the first failure is raised with its own type (``InvalidSchedule``,
        ``UnknownTask``, ``ScheduleConflict``), its message starting with ``specs[<index>]``
        and the schedule ID, and nothing is stored. A spec whose schedule already exists with
        the same content stores nothing (A1); an ID given twice is refused. The new
        schedules' events are appended in one transaction.

        >>> durable.schedules.create_many(
        ...     ScheduleSpec(id=f"report-{n}", task="reports.send", input=n, rule=Every(3600))
        ...     for n in range(10_000))
        """
        checked: builtins.list[tuple[int, str, Content, str | None, str | None]] = []
        seen: dict[str, int] = {}
        for index, given in enumerate(specs):
            spec = ScheduleSpec.of(given, index)
            with _naming(index, spec.id):
                if spec.id in seen:
                    raise InvalidSchedule(
                        f"schedule ID given twice (also specs[{seen[spec.id]}])", field="id"
                    )
                check_audit(spec.by, spec.reason)
                content = self.check(
                    spec.id, spec.task, spec.input, spec.rule, spec.catch_up, dict(spec.options)
                )
            seen[spec.id] = index
            checked.append((index, spec.id, content, spec.by, spec.reason))
        if not checked:
            return 0
        journal = self._runtime.journal

        def attempt() -> builtins.list[tuple[str, builtins.list[ScheduleEvent]]]:
            states = self.store.load_many([sid for _i, sid, *_rest in checked])
            now = self._runtime.now()
            made: builtins.list[tuple[str, builtins.list[ScheduleEvent]]] = []
            appends: builtins.list[Append] = []
            for index, sid, content, by, reason in checked:
                state = states[sid]
                with _naming(index, sid):
                    events = decide(state, Create(content=content, now=now, by=by, reason=reason))
                if events:
                    made.append((sid, events))
                    appends.append(
                        Append(
                            stream=schedule_stream(sid),
                            expected_version=state.version,
                            events=[to_new_event(e) for e in events],
                        )
                    )
            journal.append_many(appends)
            return made

        made = retry_on_conflict(attempt, what=f"{len(checked)} new schedules")
        for sid, events in made:
            for event in events:
                signals.announce(self, sid, event)
        return len(made)

    def change(
        self,
        id: str,
        task: Any,
        input: Any = None,
        rule: Rule | None = None,
        catch_up: CatchUp | str = CatchUp.LATEST,
        *,
        by: str | None = None,
        reason: str | None = None,
        **options: Any,
    ) -> None:
        """Replace everything a schedule starts (A2). Due times at or before the change never run.

        Raises ``ScheduleConflict`` for an unknown or deleted schedule.
        """
        check_audit(by, reason)
        content = self.check(id, task, input, rule, catch_up, options)
        self._execute(id, lambda now: Change(content=content, now=now, by=by, reason=reason))

    def pause(self, id: str, *, by: str | None = None, reason: str | None = None) -> None:
        """Stop starting runs (A3); pausing a paused schedule does nothing.

        ``by`` and ``reason`` are stored with the pause (O5; the import of ``beat_schedule``
        pauses a removed entry with "removed from beat_schedule", B6).
        """
        sid = check_schedule_id(id, stored=True)
        check_audit(by, reason)
        self._execute(sid, lambda now: Pause(now=now, by=by, reason=reason))

    def resume(self, id: str, *, by: str | None = None, reason: str | None = None) -> None:
        """Start runs again from the first due time after now (A3); ``by``, ``reason``: O5."""
        sid = check_schedule_id(id, stored=True)
        check_audit(by, reason)
        self._execute(sid, lambda now: Resume(now=now, by=by, reason=reason))

    def delete(self, id: str, *, by: str | None = None, reason: str | None = None) -> None:
        """End the schedule for good (A4): its ID is never used again. O5: ``by``, ``reason``."""
        sid = check_schedule_id(id, stored=True)
        check_audit(by, reason)
        self._execute(sid, lambda now: Delete(now=now, by=by, reason=reason))

    def trigger(self, id: str, *, by: str | None = None, reason: str | None = None) -> str:
        """Start one run now, outside the rule (D9); return its run ID.

        The run is decided like any other (it survives a crash and is enqueued with its run
        ID as task id) but does not count toward ``max_runs`` and moves no due time.
        Raises ``ScheduleConflict`` for an unknown or deleted schedule. ``by``, ``reason``: O5.
        """
        sid = check_schedule_id(id, stored=True)
        check_audit(by, reason)
        instants: builtins.list[datetime] = []

        def command(now: datetime) -> Command:
            instants.append(now)
            return DecideRun(due=now, now=now, reason="trigger", by=by, note=reason)

        self._execute(sid, command)
        # Nothing stored means a run was decided at this very instant already: it is that run.
        return make_run_id(sid, instants[-1])

    def backfill(
        self,
        id: str,
        start: datetime,
        end: datetime,
        *,
        by: str | None = None,
        reason: str | None = None,
    ) -> Backfilled:
        """Decide every due time of the rule in ``[start, end]`` not decided yet (D9).

        Run IDs are the usual ones, so repeating a backfill adds nothing. Only due times the
        rule has already passed are backfilled (up to the schedule's last decision, the moment
        of its last change or resume, and now): later ones are the dispatcher's. Returns the
        run IDs decided, oldest first, as a :class:`Backfilled` list whose ``reason`` says why
        none was decided (a future range, one before an ``Every`` schedule's first due time,
        every due time decided already …; ``None`` when some were). Raises
        ``InvalidSchedule`` for a bad range or more than ``MAX_BACKFILL`` due times,
        ``ScheduleConflict`` for an unknown or deleted schedule.
        ``by``, ``reason``: O5 (the backfill is one entry of :meth:`history`).
        """
        sid = check_schedule_id(id, stored=True)
        check_audit(by, reason)
        first = check_instant(to_utc(start, "backfill start"), "backfill start")
        last = check_instant(to_utc(end, "backfill end"), "backfill end")
        if last < first:
            raise InvalidSchedule("backfill end is before its start")
        store = self.store
        why: builtins.list[str] = []

        def commands(now: datetime) -> builtins.list[Command]:
            state = store.load(sid)
            if not state.exists or state.deleted:
                return [DecideRun(due=now, now=now, reason="backfill")]  # raises the conflict
            assert state.content is not None
            rule, anchor = state.content.rule, state.anchor
            until = min(last, now, state.cursor or now)
            decided = frozenset(e.due for e in store.events(sid) if isinstance(e, RunDecided))
            # Retention removed the records up to here: those due times stay settled (O1, A6).
            floor = self._runtime.index.snapshots.pruned_through(sid)
            dues = backfill_due_times(rule, first, until, anchor, MAX_BACKFILL)
            todo = [d for d in dues if d not in decided and (floor is None or d > floor)]
            why[:] = [] if todo else [
                why_nothing(
                    rule=rule, anchor=anchor, start=first, end=last, now=now, until=until,
                    found=dues, decided=decided, floor=floor,
                )
            ]  # fmt: skip
            return [
                DecideRun(
                    due=due,
                    now=now,
                    reason="backfill",
                    decided=decided,
                    decided_through=floor,
                    by=by,
                    note=reason,
                )
                for due in todo
            ]

        events = self._execute(sid, commands)
        run_ids = [e.run_id for e in events if isinstance(e, RunDecided)]
        return Backfilled(run_ids, reason=None if run_ids else (why or ["nothing to decide"])[0])

    # Reads --------------------------------------------------------------------------------

    def state(self, id: str) -> ScheduleView | None:
        """The schedule as the journal knows it, or ``None`` when it was never created (V1)."""
        state = self.store.load(check_schedule_id(id, stored=True))
        if not state.exists:
            return None
        return view_of(state, self._runtime.beat_objects, GlobalBlackouts(self._runtime).get())

    def show(self, id: str) -> ScheduleView | None:
        """What ``celery durable schedules show`` shows (P4): :meth:`state`, whose view holds
        the schedule's blackout windows (``blackouts``, ``on_blackout``) and the next due time
        that will really run (``next_run``)."""
        return self.state(id)

    def history(self, id: str) -> builtins.list[HistoryEntry]:
        """Every command on a schedule (create, change, pause, resume, delete, trigger,
        backfill), oldest first (O5).

        Each :class:`~celery_durable.core.audit.HistoryEntry` gives the time, the action,
        ``by`` and ``reason`` as the command gave them (``None`` when it did not) and the
        fields it changed (before, after). An unknown ID has an empty history.
        """
        sid = check_schedule_id(id, stored=True)
        return history_of(self.store.events(sid))

    def list(self, *, include_deleted: bool = False) -> builtins.list[ScheduleView]:
        """Every schedule, ordered by ID (deleted ones only when asked)."""
        live = self._runtime.beat_objects
        windows = GlobalBlackouts(self._runtime).get()
        views = [view_of(s, live, windows) for s in self.store.load_all() if s.exists]
        return [v for v in views if include_deleted or not v.deleted]

    def runs(self, id: str, *, limit: int | None = None) -> builtins.list[RunView]:
        """The decided runs of a schedule, newest first (V2); at most ``limit`` (an int ≥ 0)."""
        sid = check_schedule_id(id, stored=True)
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 0
        ):
            raise InvalidSchedule(
                f"limit must be a whole number of runs, 0 or more, not {limit!r}", field="limit"
            )
        runs = runs_of(sid, self.store.events(sid))[:limit]
        # Durable runs: their outcome (or progress) comes from the run table (one read).
        started = [r.run_id for r in runs if r.state == "started"]
        statuses = self._runtime.runs.statuses(started) if started else {}
        return [
            replace(r, outcome=run_outcome(r, statuses[r.run_id])) if r.run_id in statuses else r
            for r in runs
        ]

    def run_statuses(
        self, runs: Sequence[RunView], *, endings: bool = False
    ) -> builtins.list[RunStatus]:
        """The state users see of each of ``runs`` (:func:`~.core.read_models.project_run`):
        the run table read once for them all and, with ``endings``, the endings of the
        durable runs that ended read once more (a page's runs, not one read per run)."""
        runtime = self._runtime
        wanted = [r.run_id for r in runs if r.state not in NOT_STARTED]
        statuses = runtime.runs.statuses(wanted) if wanted else {}
        ended = [run_stream(i) for i, status in statuses.items() if status in ENDED]
        found = {}
        if endings and ended:
            found = runtime.journal.read_streams(ended, types=ENDING_EVENTS)
        return [
            project_run(
                r,
                statuses.get(r.run_id),
                ending_of(found.get(run_stream(r.run_id), ())),
            )
            for r in runs
        ]

    def check(
        self,
        id: str,
        task: Any,
        input: Any,
        rule: Rule | None,
        catch_up: CatchUp | str,
        options: dict[str, Any],
        *,
        from_beat: bool = False,
    ) -> Content:
        """Check a schedule's definition and return its content; nothing is stored.

        Raises what :meth:`create` raises for bad arguments (``InvalidSchedule``,
        ``UnknownTask``). ``options`` loses its ``overlap`` key. ``from_beat``: content
        imported from ``beat_schedule`` (B1–B8), whose options the import checked, whose task
        may be known only to the workers (B4) and whose rule may be a :class:`BeatEntry`.
        """
        runtime = self._runtime
        overlap = Overlap.parse(options.pop("overlap", Overlap.ALLOW))
        task_name = runtime.task_name(task)
        check_schedule_id(id, task_name)
        if rule is None:
            raise InvalidSchedule("rule is missing", field="rule")
        if not isinstance(rule, _RULE_TYPES) and not (from_beat and isinstance(rule, BeatEntry)):
            raise InvalidSchedule(
                "rule must be a Daily, Weekly, Every, Cron, Crontab, Solar or Once, "
                f"not {type(rule).__name__}"
            )
        check_rule_limits(rule)
        if isinstance(rule, Solar):
            sun.require_ephem()  # refuse before storing a rule this process cannot compute
        policy = CatchUp.parse(catch_up)
        windows = check_windows(options.pop("blackouts", None))
        on_blackout = OnBlackout.parse(options.pop("on_blackout", OnBlackout.SKIP))
        timing = Timing.parse(policy, **{k: options.pop(k) for k in POLICY_FIELDS if k in options})
        max_bytes = runtime.config.max_input_bytes
        input, marked = encode_secrets(input)
        check_json_value(input, "input", max_bytes=max_bytes)
        if from_beat:  # the import stored args and kwargs with their references already
            checked_options = dict(options)
            marked = marked or any(holds_references(options.get(k)) for k in ("args", "kwargs"))
        else:
            for key in ("args", "kwargs"):
                if key in options:
                    options[key], uses = encode_secrets(options[key])
                    marked = marked or uses
            checked_options = check_options(options, max_bytes)
            runtime.require_task(task_name)
        checked_options.pop(SECRETS_OPTION, None)
        if marked:  # P5: the stored values hold references (or escaped lookalikes)
            checked_options[SECRETS_OPTION] = 1
        content = Content(
            task=task_name,
            input=input,
            rule=rule,
            catch_up=policy,
            overlap=overlap,
            options=checked_options,
            timing=timing,
            blackouts=windows,
            on_blackout=on_blackout,
        )
        if not from_beat:  # stock beat sends whatever the entry says (B1)
            check_call(runtime, id, content)
        return content

    # Internals ----------------------------------------------------------------------------

    def _execute(
        self, id: str, make: Callable[[Any], Command | Sequence[Command]]
    ) -> builtins.list[ScheduleEvent]:
        return self.store.execute(id, make)


class ScheduleStore:
    """Loads schedule states from the journal and appends the aggregate's decisions."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def events(self, schedule_id: str) -> list[ScheduleEvent]:
        journal = self._runtime.journal
        return [from_stored(e) for e in journal.read_stream(schedule_stream(schedule_id))]

    def load(self, schedule_id: str) -> ScheduleState:
        """The current state of one schedule: its index row plus the events stored after it."""
        journal = self._runtime.journal
        try:
            state = self._runtime.index.load([schedule_id]).get(schedule_id)
        except UnreadableEntry as exc:
            log.warning("%s; reading the schedule's whole stream instead", exc)
            state = None
        state = state or ScheduleState(schedule_id=schedule_id)
        tail = journal.read_stream(schedule_stream(schedule_id), after_version=state.version)
        return fold_stream(state, tail, self._runtime.index.snapshots.state)

    def load_many(self, schedule_ids: Sequence[str]) -> dict[str, ScheduleState]:
        """The current states of these schedules (a fresh state for an unknown ID), by ID:
        their index rows plus the schedule events stored after the index's position."""
        index = self._runtime.index
        wanted = set(schedule_ids)
        try:
            position = index.position()
            states = index.load(sorted(wanted))
            tail = index.events_after(position)
            tail = [e for e in tail if stream_schedule_id(e.stream) in wanted]
        except UnreadableEntry as exc:
            log.warning("%s; reading the schedules' streams instead", exc)
            return {sid: self.load(sid) for sid in wanted}
        fold_stored(states, tail, index.snapshots.state)
        return {sid: states.get(sid) or ScheduleState(schedule_id=sid) for sid in wanted}

    def load_all(self) -> list[ScheduleState]:
        """Every schedule's current state, ordered by ID: the index rows plus newer events."""
        index = self._runtime.index
        try:
            states = index.load()
            position = index.position()
        except UnreadableEntry as exc:
            log.warning("%s; folding the journal instead", exc)
            states, position = {}, 0
        fold_stored(states, index.events_after(position), index.snapshots.state)
        return [states[sid] for sid in sorted(states)]

    def load_with_origin(self, origin: str, also: Iterable[str] = ()) -> dict[str, ScheduleState]:
        """The current states of the schedules that came from ``origin`` (``message.origin_of``)
        and of the IDs in ``also``, deleted ones included, by ID.

        Reads the index rows of those schedules only (the indexed ``origin`` column) and the
        events stored after the index's position: what beat's start-up needs to bring its
        ``beat_schedule`` over without reading every schedule (D13).
        """
        index = self._runtime.index
        named = set(also)
        try:
            position = index.position()
            tail = index.events_after(position)
            wanted = set(index.with_origin(origin)) | named
            wanted |= {stream_schedule_id(e.stream) for e in tail}
            states = index.load(sorted(wanted))
        except UnreadableEntry as exc:
            log.warning("%s; folding the journal instead", exc)
            states, tail = {}, index.events_after(0)
        fold_stored(states, tail, index.snapshots.state)
        found = {sid: st for sid, st in states.items() if st.exists and st.content is not None}
        return {
            sid: st
            for sid, st in found.items()
            if sid in named or origin_of(st.content.options) == origin  # type: ignore[union-attr]
        }

    def execute(
        self, schedule_id: str, make: Callable[[Any], Command | Sequence[Command]]
    ) -> list[ScheduleEvent]:
        """Decide commands on the latest state and append their events; re-decide on conflict.

        ``make`` receives the clock's time and returns one command or several, decided in turn
        and appended together (all or nothing).
        """
        journal = self._runtime.journal
        stream = schedule_stream(schedule_id)

        def attempt() -> list[ScheduleEvent]:
            state = self.load(schedule_id)
            made = make(self._runtime.now())
            events, _ = decide_all(state, made if isinstance(made, Sequence) else [made])
            if events:
                journal.append(stream, state.version, [to_new_event(e) for e in events])
            return events

        events = retry_on_conflict(attempt, what=f"schedule {schedule_id!r}")
        for event in events:  # a trigger or backfill decides runs here, not in the dispatcher
            signals.announce(self, schedule_id, event)
        return events


def view_of(
    state: ScheduleState,
    live: LiveSchedules | None = None,
    blackouts: tuple[Blackout, ...] = (),
) -> ScheduleView:
    """The user-facing view of a schedule state (``live``: a beat's schedule objects, B3;
    ``blackouts``: the global windows, P4)."""
    content = state.content
    assert content is not None
    return ScheduleView(
        id=state.schedule_id,
        task=content.task,
        input=shown_input(content.input, content.options),
        rule=content.rule,
        catch_up=content.catch_up,
        overlap=content.overlap,
        options=shown_options(content.options),
        start_deadline=content.timing.start_deadline,
        jitter=content.timing.jitter,
        catch_up_window=content.timing.catch_up_window,
        paused=state.paused,
        deleted=state.deleted,
        anchor=state.anchor,
        next_due=state.next_due(live),
        blackouts=content.blackouts,
        on_blackout=content.on_blackout,
        next_run=state.next_run(blackouts, live),
        created_at=state.created_at,
        runs_decided=state.runs_decided,
        pending=len(state.pending),
        version=state.version,
        last_due=state.last_decided,
    )


def runs_of(schedule_id: str, events: list[ScheduleEvent]) -> list[RunView]:
    """The runs recorded in a schedule's events, newest first."""
    runs: dict[Any, dict[str, Any]] = {}
    for event in events:
        if isinstance(event, RunDecided):
            runs[event.due] = {
                "run_id": event.run_id,
                "schedule_id": schedule_id,
                "due": event.due,
                "state": "decided",
                "task": event.task,
                "input": shown_input(event.input, event.options),
                "reason": event.reason,
                "decided_at": event.at,
            }
        elif isinstance(event, RunSent) and event.due in runs:
            runs[event.due].update(state="started", started_at=event.at)
        elif isinstance(event, RunFailedToStart) and event.due in runs:
            runs[event.due].update(state="failed_to_start", error=event.error)
        elif isinstance(event, RunMissed) and event.due in runs:
            runs[event.due].update(state="missed", error=event.reason, missed_at=event.at)
        elif isinstance(event, RunSkipped):
            runs[event.due] = {
                "run_id": make_run_id(schedule_id, event.due),
                "schedule_id": schedule_id,
                "due": event.due,
                "state": "skipped",
                "error": event.reason,
                "decided_at": event.at,
            }
        elif isinstance(event, RunEndReported) and event.due in runs:
            runs[event.due]["outcome"] = event.outcome
    return [RunView(**runs[due]) for due in sorted(runs, reverse=True)]


__all__ = [
    "MAX_BACKFILL",
    "Backfilled",
    "ScheduleStore",
    "Schedules",
    "backfill_due_times",
    "check_call",
    "check_options",
    "check_sent",
]
