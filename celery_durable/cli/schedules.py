"""``celery durable schedules …``: list, show, create, change, pause, resume, delete,
trigger and backfill durable schedules."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from celery_durable.cli import parse
from celery_durable.cli.audit import audit, history, reason_option
from celery_durable.cli.common import (
    DurableGroup,
    creates_journal,
    display_zone,
    echo,
    emit_json,
    fields,
    invalid,
    json_option,
    not_found,
    option,
    session,
    shown,
    table,
)
from celery_durable.cli.views import is_overdue, schedule_json, upcoming
from celery_durable.message import describe_origin, origin_label
from celery_durable.presentation import local_json, local_text, status_of, utc_json, utc_text

F = Callable[..., Any]


@click.group(cls=DurableGroup, name="schedules")
def schedules() -> None:
    """Create, change and inspect durable schedules."""


def require(schedule_id: str) -> Any:
    """The schedule's view; exit 3 when it was never created."""
    view = session().durable.schedules.state(schedule_id)
    if view is None:
        raise not_found(f"schedule {shown(schedule_id)} not found")
    return view


def _print_changed(verb: str, schedule_id: str, changed: bool, view: Any) -> None:
    current = session()
    if current.json:
        emit_json(
            {
                "action": verb,
                "changed": changed,
                "schedule": None
                if view is None
                else schedule_json(view, current.app, current.durable.now()),
            }
        )
        return
    done = {"create": "created", "change": "changed", "pause": "paused", "resume": "resumed"}
    if not changed:
        echo(f"schedule {shown(schedule_id)} unchanged (already {_already(verb, view)})")
    else:
        echo(f"schedule {shown(schedule_id)} {done.get(verb, verb + 'd')}")
    if view is not None and view.next_due is not None:
        zone = display_zone(view, current.app)
        echo(f"next due {utc_text(view.next_due)} ({local_text(view.next_due, zone)})")


def _already(verb: str, view: Any) -> str:
    if verb == "pause":
        return "paused"
    if verb == "delete":
        return "deleted"
    return "so"


# -- list and show -------------------------------------------------------------------------------


@schedules.command(name="list")
@option("--all", "show_all", is_flag=True, help="Include deleted schedules.")
@json_option
def list_(show_all: bool) -> None:
    """List schedules: where each came from, its last run (due time of the newest decided
    run, UTC), next due time in UTC and in the schedule's zone, marked "(overdue)" when
    it has passed and the run is not decided yet, and the next run that will really be sent
    (blackout windows and jitter considered, P4, P2)."""
    current = session()
    views = current.durable.schedules.list(include_deleted=show_all)
    now = current.durable.now()
    if current.json:
        emit_json([schedule_json(v, current.app, now) for v in views])
        return
    if not views:
        echo("No schedules.")
        return
    rows = []
    for view in views:
        zone = display_zone(view, current.app)
        mark = " (overdue)" if is_overdue(view, now) else ""
        rows.append(
            (
                view.id,
                view.task,
                view.rule.describe(),
                status_of(view),
                utc_text(view.last_due),
                utc_text(view.next_due) + mark,
                local_text(view.next_due, zone),
                utc_text(view.next_run),
                origin_label(view.task, view.options),
            )
        )
    headers = (
        "ID",
        "TASK",
        "RULE",
        "STATUS",
        "LAST RUN (UTC)",
        "NEXT DUE (UTC)",
        "NEXT DUE (LOCAL)",
        "NEXT RUN (UTC)",
        "ORIGIN",
    )
    echo(table(headers, rows))


@schedules.command()
@click.argument("schedule_id")
@option(
    "--next",
    "count",
    type=click.IntRange(0, 1000),
    default=5,
    show_default=True,
    help="How many coming due times to show.",
)
@option(
    "--runs",
    "run_count",
    type=click.IntRange(0, 1000),
    default=5,
    show_default=True,
    help="How many recent runs to show.",
)
@json_option
def show(schedule_id: str, count: int, run_count: int) -> None:
    """Show one schedule: its content, status, the blackout windows that apply to it (its own
    and the global ones), its next run, coming due times (each one a window skips or moves is
    marked) and recent runs."""
    from celery_durable.cli.views import fates, run_json, run_rows

    current = session()
    view = require(schedule_id)
    zone = display_zone(view, current.app)
    coming = upcoming(view, count)
    global_windows = current.durable.blackouts.get()
    fated = fates(view, coming, global_windows)
    api: Any = current.durable.schedules  # its ``list`` method confuses mypy's view of list[]
    recent = list(api.runs(schedule_id, limit=run_count or None))[:run_count]
    statuses = {s.run.run_id: s.state for s in api.run_statuses(recent)}
    if current.json:
        data = schedule_json(view, current.app, current.durable.now())
        data["global_blackouts"] = [w.describe() for w in global_windows]
        data["upcoming"] = [
            {
                "due": utc_json(f.due),
                "due_local": local_json(f.due, zone),
                "runs": f.starts is not None,
                "starts": utc_json(f.starts),
                "blackout": f.blackout,
            }
            for f in fated
        ]
        data["recent_runs"] = [run_json(r, statuses[r.run_id], zone) for r in recent]
        emit_json(data)
        return
    options = ", ".join(f"{k}={_json_text(v)}" for k, v in sorted(view.options.items())) or None
    echo(
        fields(
            [
                ("ID", view.id),
                ("Task", view.task),
                ("Rule", view.rule.describe()),
                ("Zone", zone),
                ("Status", status_of(view)),
                ("Origin", describe_origin(view.task, view.options)),
                ("Catch-up", view.catch_up.value),
                ("Overlap", view.overlap.value),
                ("Start deadline", _span(view.start_deadline)),
                ("Jitter", _span(view.jitter)),
                ("Catch-up window", _span(view.catch_up_window)),
                ("Blackouts", _windows_text(view.blackouts)),
                ("Global blackouts", _windows_text(global_windows)),
                ("On blackout", view.on_blackout.value),  # it governs the global windows too
                ("Next run", _next_run(view, zone)),
                ("Input", _json_text(view.input)),
                ("Options", options),
                ("Created", f"{utc_text(view.created_at)}  ({local_text(view.created_at, zone)})"),
                ("Anchor", f"{utc_text(view.anchor)}  ({local_text(view.anchor, zone)})"),
                ("Runs decided", view.runs_decided),
                ("Last run", utc_text(view.last_due) if view.last_due else None),
                ("Runs pending", view.pending or None),
            ]
        )
    )
    if coming:
        echo("\nNext due times")
        if any(f.moved for f in fated):  # P4: say which ones a window skips or moves
            marked = [(utc_text(f.due), local_text(f.due, zone), _fate_text(f)) for f in fated]
            echo(table(("UTC", "LOCAL", "BLACKOUT"), marked))
        else:
            echo(table(("UTC", "LOCAL"), [(utc_text(d), local_text(d, zone)) for d in coming]))
    if recent:
        echo("\nRecent runs")
        echo(run_rows(recent, statuses, {view.id: zone}, with_schedule=False))


def _next_run(view: Any, zone: str) -> str:
    """When the next run is really sent: blackout windows (P4) and jitter (P2) considered."""
    if view.next_run is None:
        if view.next_due is None:
            return "none"
        return "none within the next 1000 due times (blackout windows skip them)"
    return f"{utc_text(view.next_run)}  ({local_text(view.next_run, zone)})"


def _windows_text(windows: Any) -> str | None:
    return "; ".join(f"[{w.describe()}]" for w in windows) or None


def _fate_text(fate: Any) -> str:
    """What a blackout does to one coming due time (empty when it does nothing)."""
    if not fate.moved:
        return ""
    if fate.missed:
        return f"missed: moved past its start deadline by {fate.blackout}"
    if fate.starts is None:
        return f"skipped: {fate.blackout}"
    return f"runs {utc_text(fate.starts)}: {fate.blackout}"


def _span(value: Any) -> str | None:
    """A policy's duration as seconds (``None``, so not shown, when the policy is off)."""
    return None if value is None else f"{value.total_seconds():g}s"


def _json_text(value: Any) -> str:
    import json

    from celery_durable.core.secrets import encode_secrets

    return json.dumps(encode_secrets(value)[0], ensure_ascii=False)


# -- create and change ----------------------------------------------------------------------


def _content_options(fun: F) -> F:
    """The options ``create`` and ``change`` share (rule, policies, Celery options)."""
    decorators = [
        option("--daily", metavar="HH:MM", help="Every day at this local time (needs --zone)."),
        option("--weekly", metavar="DAYS@HH:MM",
               help="On these days at this local time, e.g. mon,thu@08:00 (needs --zone)."),
        option("--every", metavar="DURATION", help="At a fixed interval: 30s, 5m, 1h30m, 2d."),
        option("--cron", metavar="EXPR", help='A five-field cron expression, e.g. "0 2 * * *".'),
        option("--once", metavar="TIME", help="Once, at an ISO 8601 time (2026-12-24T18:00Z)."),
        option("--zone", metavar="IANA", help="Time zone of the rule and of times without offset."),
        option("--end-at", metavar="TIME", help="No due time after this instant."),
        option("--max-runs", metavar="N", help="Complete after N decided runs."),
        option("--catch-up", type=click.Choice(["latest", "all", "none"], case_sensitive=False),
               help="Which missed due times run after downtime [default: latest]."),
        option("--overlap",
               type=click.Choice(["allow", "skip", "buffer_one"], case_sensitive=False),
               help="A due time while the previous run goes on [default: allow]."),
        option("--start-deadline", metavar="DURATION",
               help="A run not started this long after its due time never starts (P1)."),
        option("--jitter", metavar="DURATION",
               help="Send each run up to this long after its due time, spread by run ID (P2)."),
        option("--catch-up-window", metavar="DURATION",
               help="After downtime, only due times this recent run (latest/all) (P3)."),
        option("--blackout", "blackout_texts", multiple=True, metavar="WINDOW",
               help="A blackout window (repeatable; on change it replaces the list): "
                    "'NAME;cron EXPR;DURATION;ZONE', 'NAME;daily HH:MM;DURATION;ZONE', "
                    "'NAME;weekly DAYS@HH:MM;DURATION;ZONE' or 'NAME;FROM;UNTIL' (P4)."),
        option("--no-blackouts", is_flag=True, help="Remove the schedule's blackout windows."),
        option("--on-blackout", type=click.Choice(["skip", "defer"], case_sensitive=False),
               help="A due time inside a blackout window: skip it, or run once when it "
                    "ends [default: skip]."),
        option("--input", "input_json", metavar="JSON", help="Input handed to a durable task."),
        option("--queue", metavar="NAME", help="Celery queue of each run's message."),
        option("--priority", type=click.IntRange(0, 255), metavar="0-255", help="Celery priority."),
        option("--args", "args_json", metavar="JSON", help="Positional arguments (a JSON list)."),
        option("--kwargs", "kwargs_json", metavar="JSON",
               help="Keyword arguments (a JSON object)."),
    ]  # fmt: skip
    for decorator in reversed(decorators):
        fun = decorator(fun)
    return fun


def _bounds(values: dict[str, Any], *, keep: bool) -> tuple[Any, Any]:
    """``--end-at`` and ``--max-runs``; with ``keep``, absent means ``...`` (keep current)."""
    absent = ... if keep else None
    end_text, max_text = values.get("end_at"), values.get("max_runs")
    zone = values.get("zone")
    if end_text is None:
        end_at: Any = absent
    elif keep and end_text.strip().lower() == "none":
        end_at = None
    else:
        end_at = parse.instant(end_text, "--end-at", zone)
    if max_text is None:
        max_runs: Any = absent
    elif keep and max_text.strip().lower() == "none":
        max_runs = None
    else:
        try:
            max_runs = int(max_text)
        except ValueError:
            raise invalid(f"--max-runs: {max_text!r} is not a whole number") from None
        if max_runs < 1:
            raise invalid("--max-runs must be at least 1")
    return end_at, max_runs


POLICY_FLAGS = {
    "start_deadline": "--start-deadline",
    "jitter": "--jitter",
    "catch_up_window": "--catch-up-window",
}


def _policies(values: dict[str, Any], view: Any = None) -> dict[str, Any]:
    """``--start-deadline``, ``--jitter``, ``--catch-up-window``; on change, absent keeps the
    current value and ``none`` removes it."""
    found: dict[str, Any] = {}
    for name, flag in POLICY_FLAGS.items():
        text = values.get(name)
        if text is None:
            found[name] = None if view is None else getattr(view, name)
        elif view is not None and text.strip().lower() == "none":
            found[name] = None
        else:
            found[name] = parse.duration(text, flag)
    return found


def _blackouts(values: dict[str, Any], view: Any = None) -> dict[str, Any]:
    """``--blackout``, ``--no-blackouts``, ``--on-blackout`` (P4); on change, absent keeps."""
    texts = values.get("blackout_texts") or ()
    if texts and values.get("no_blackouts"):
        raise invalid("give --blackout or --no-blackouts, not both")
    windows: Any = () if view is None else view.blackouts
    if texts:
        windows = [parse.blackout(text) for text in texts]
    elif values.get("no_blackouts"):
        windows = ()
    chosen = values.get("on_blackout")
    on_blackout = chosen or ("skip" if view is None else view.on_blackout)
    return {"blackouts": list(windows), "on_blackout": on_blackout}


def _options(values: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    options = dict(current)
    if values.get("queue") is not None:
        options["queue"] = values["queue"]
    if values.get("priority") is not None:
        options["priority"] = values["priority"]
    if values.get("args_json") is not None:
        options["args"] = parse.json_value(values["args_json"], "--args")
    if values.get("kwargs_json") is not None:
        options["kwargs"] = parse.json_value(values["kwargs_json"], "--kwargs")
    return options


@schedules.command()
@click.argument("schedule_id")
@click.argument("task")
@_content_options
@reason_option
@json_option
@creates_journal
def create(schedule_id: str, task: str, reason: str | None, **values: Any) -> None:
    """Create SCHEDULE_ID starting TASK at each due time of one rule option.

    Creating again with the same content changes nothing; other content is a conflict (4).
    """
    current = session()
    kind = parse.chosen_rule(values)
    if kind is None:
        raise invalid("give one rule option: --daily, --weekly, --every, --cron or --once")
    end_at, max_runs = _bounds(values, keep=False)
    rule = parse.make_rule(
        kind, values[kind], zone=values.get("zone"), end_at=end_at, max_runs=max_runs
    )
    input_value = (
        None
        if values.get("input_json") is None
        else parse.json_value(values["input_json"], "--input")
    )
    api = current.durable.schedules
    before = api.state(schedule_id)
    api.create(
        schedule_id,
        task,
        input_value,
        rule,
        values.get("catch_up") or "latest",
        overlap=values.get("overlap") or "allow",
        **audit(reason),
        **_policies(values),
        **_blackouts(values),
        **_options(values, {}),
    )
    _print_changed("create", schedule_id, before is None, api.state(schedule_id))


@schedules.command()
@click.argument("schedule_id")
@option("--task", help="The task to start (default: keep the current one).")
@_content_options
@reason_option
@json_option
def change(schedule_id: str, task: str | None, reason: str | None, **values: Any) -> None:
    """Change SCHEDULE_ID; settings not given keep their current value (the zone too).

    Due times at or before the change never run; an --every interval counts from the change.
    Give 'none' to --end-at or --max-runs to remove the bound, and to --start-deadline,
    --jitter or --catch-up-window to turn the policy off.
    """
    current = session()
    view = require(schedule_id)
    kind = parse.chosen_rule(values)
    end_at, max_runs = _bounds(values, keep=True)
    if kind is None:
        rule = parse.with_bounds(
            view.rule, zone=values.get("zone"), end_at=end_at, max_runs=max_runs
        )
    else:
        rule = parse.make_rule(
            kind,
            values[kind],
            zone=values.get("zone") or getattr(view.rule, "zone", None),
            end_at=view.rule.end_at if end_at is ... else end_at,
            max_runs=view.rule.max_runs if max_runs is ... else max_runs,
        )
    input_value = (
        view.input
        if values.get("input_json") is None
        else parse.json_value(values["input_json"], "--input")
    )
    current.durable.schedules.change(
        schedule_id,
        task or view.task,
        input_value,
        rule,
        values.get("catch_up") or view.catch_up,
        overlap=values.get("overlap") or view.overlap,
        **audit(reason),
        **_policies(values, view),
        **_blackouts(values, view),
        **_options(values, dict(view.options)),
    )
    after = current.durable.schedules.state(schedule_id)
    _print_changed(
        "change", schedule_id, after is not None and after.version != view.version, after
    )


# -- pause, resume, delete ---------------------------------------------------------------------


@schedules.command()
@click.argument("schedule_id")
@reason_option
@json_option
def pause(schedule_id: str, reason: str | None) -> None:
    """Pause SCHEDULE_ID: no run starts until it is resumed."""
    api = session().durable.schedules
    before = require(schedule_id)
    api.pause(schedule_id, **audit(reason))
    after = api.state(schedule_id)
    _print_changed(
        "pause", schedule_id, after is not None and after.version != before.version, after
    )


@schedules.command()
@click.argument("schedule_id")
@reason_option
@json_option
def resume(schedule_id: str, reason: str | None) -> None:
    """Resume SCHEDULE_ID from the first due time after now (missed ones never run)."""
    api = session().durable.schedules
    require(schedule_id)
    api.resume(schedule_id, **audit(reason))
    _print_changed("resume", schedule_id, True, api.state(schedule_id))


@schedules.command()
@click.argument("schedule_id")
@option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@reason_option
@json_option
def delete(schedule_id: str, yes: bool, reason: str | None) -> None:
    """Delete SCHEDULE_ID for good: nothing more runs and the ID can never be used again."""
    api = session().durable.schedules
    before = require(schedule_id)
    if not yes and not before.deleted:
        if not sys.stdin.isatty():
            raise invalid("deleting is permanent: pass --yes to confirm")
        click.confirm(f"Delete schedule {shown(schedule_id)} for good?", abort=True, err=True)
    api.delete(schedule_id, **audit(reason))
    after = api.state(schedule_id)
    _print_changed("delete", schedule_id, not before.deleted, after)


# -- trigger and backfill ------------------------------------------------------------------------


@schedules.command()
@click.argument("schedule_id")
@reason_option
@json_option
def trigger(schedule_id: str, reason: str | None) -> None:
    """Decide one run of SCHEDULE_ID now, outside its rule; print its run ID.

    The dispatcher (beat) sends it; it does not count toward --max-runs.
    """
    current = session()
    require(schedule_id)
    run_id = current.durable.schedules.trigger(schedule_id, **audit(reason))
    if current.json:
        emit_json({"action": "trigger", "schedule_id": schedule_id, "run_id": run_id})
    else:
        echo(run_id)


@schedules.command()
@click.argument("schedule_id")
@option("--start", required=True, metavar="TIME", help="First instant of the range (ISO 8601).")
@option("--end", required=True, metavar="TIME", help="Last instant of the range (ISO 8601).")
@option("--zone", metavar="IANA", help="Zone of --start/--end when they have no offset.")
@reason_option
@json_option
def backfill(schedule_id: str, start: str, end: str, zone: str | None, reason: str | None) -> None:
    """Decide every due time of SCHEDULE_ID in [--start, --end] not decided yet.

    Run IDs are the usual ones, so repeating a backfill adds nothing. Prints the run IDs, and
    when there are none, why.
    """
    current = session()
    require(schedule_id)
    first = parse.instant(start, "--start", zone)
    last = parse.instant(end, "--end", zone)
    run_ids = current.durable.schedules.backfill(schedule_id, first, last, **audit(reason))
    if current.json:
        emit_json(
            {
                "action": "backfill",
                "schedule_id": schedule_id,
                "run_ids": list(run_ids),
                "reason": run_ids.reason,
            }
        )
        return
    for run_id in run_ids:
        echo(run_id)
    why = f": {run_ids.reason}" if run_ids.reason else ""
    echo(f"{len(run_ids)} run(s) decided{why}", err=True)


schedules.add_command(history)
