"""What every ``celery durable`` command shares: the session, errors and exit codes, output.

Exit codes (docs/cli.md): 0 ok, 1 any other error, 2 invalid input, 3 not found, 4 conflict,
5 the run ended without a value (faulted, cancelled, parked), 6 the run has not ended yet,
141 stdout was closed by its reader (`… | head`), quietly.
Every error is one line on stderr, ``Error: …``; a traceback only with ``--traceback``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, tzinfo
from functools import partial, wraps
from typing import TYPE_CHECKING, Any, TypeVar

import click

from celery_durable.core.ids import SHOWN_ID_LENGTH, printable, shown
from celery_durable.errors import InvalidSchedule

if TYPE_CHECKING:
    from celery_durable.core.read_models import ScheduleView
    from celery_durable.durable import Durable

OK = 0
FAILED = 1
INVALID = 2
NOT_FOUND = 3
CONFLICT = 4
RUN_NOT_OK = 5
NOT_ENDED = 6
BROKEN_PIPE = 141
"""The reader of stdout went away (``… | head``): the status a shell shows for SIGPIPE."""

_META = "celery_durable.cli"
_URL_VARIABLE = "CELERY_DURABLE_URL"
F = TypeVar("F", bound=Callable[..., Any])

option = partial(click.option, allow_from_autoenv=False)
"""``click.option`` without automatic environment variables.

``celery`` runs with ``auto_envvar_prefix="CELERY"``, which would turn ``CELERY_DURABLE_URL``
into ``--url`` and let it override ``app.conf.durable_url``, the reverse of SPEC §8's order.
"""


class CliError(click.ClickException):
    """An error reported as one ``Error: …`` line with a chosen exit code."""

    def __init__(self, message: str, code: int = FAILED) -> None:
        super().__init__(one_line(message))
        self.code = code

    @property  # click declares exit_code a class variable; each CliError chooses its own
    def exit_code(self) -> int:  # type: ignore[override]
        return self.code


def invalid(message: str) -> CliError:
    return CliError(message, INVALID)


def not_found(message: str) -> CliError:
    return CliError(message, NOT_FOUND)


def one_line(text: str) -> str:
    return printable(" ".join(str(text).split()))


_LONG_QUOTED = re.compile(rf"'([^']{{{SHOWN_ID_LENGTH + 1},}})'")


def _quoted_values_cut(message: str) -> str:
    """Click's messages quote the value given (``Invalid value for '--max-lag': 'x…'``): a
    long one is cut as :func:`shown` cuts an ID, so bad input is named, not echoed."""
    return _LONG_QUOTED.sub(lambda m: shown(m.group(1)), message)


def echo(text: str = "", *, err: bool = False) -> None:
    """``click.echo`` of a line (or lines) of output, control characters escaped."""
    click.echo(printable(text, keep="\n"), err=err)


# -- the session: app, Durable, output mode ------------------------------------------------


class Session:
    """Per-invocation state kept in ``ctx.meta``: the app, ``--url``, ``--json``."""

    def __init__(self, app: Any, url: str | None, *, app_given: bool = True) -> None:
        self.app = app
        self.url = url
        self.app_given = app_given
        self.json = False
        self.traceback = False
        self.may_create = False
        """Whether this command may create a missing journal (:func:`creates_journal`)."""
        self._durable: Durable | None = None
        self._own = False

    @property
    def durable(self) -> Durable:
        """``Durable.for_app(app)``, or a new ``Durable(app, url)`` when ``--url`` was given."""
        if self._durable is None:
            from celery_durable.durable import Durable

            if not self.app_given and self.url is None and not os.environ.get(_URL_VARIABLE):
                # Celery's default app knows no journal: reading "its" journal would create an
                # empty ./celery_durable.db and show nothing (docs/cli.md, "Which journal").
                raise invalid(
                    "no Celery app given: give -A/--app MODULE, as for the worker and beat "
                    f"(or name the journal with --url or ${_URL_VARIABLE})"
                )
            self._load_app()
            if self.url is not None:
                found, self._own = Durable(self.app, self.url), True
            else:
                found = Durable.for_app(self.app)
            if not self.may_create:
                _require_journal(found.config.url)
            self._durable = found
        return self._durable

    def _load_app(self) -> None:
        """What a worker does first: import the task modules (which sets Django up, and the
        Django app's hook gives the app the journal the admin, beat and workers use)."""
        from celery_durable.config import import_task_modules

        try:
            import_task_modules(self.app)
        except Exception as exc:
            raise CliError(
                f"cannot import the task modules of app {self.app.main!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from None

    def close(self) -> None:
        if self._durable is not None and self._own:
            self._durable.close()

    def secrets(self) -> list[str]:
        """Passwords of the journal URL, scrubbed from any error message."""
        from celery_durable.store.journal.urls import password_of

        configured = self.app.conf.get("durable_url") if self.app is not None else None
        urls = (self.url, configured, os.environ.get("CELERY_DURABLE_URL"))
        return [p for p in map(password_of, urls) if p]


def _require_journal(url: str) -> None:
    """Refuse a SQLite journal whose file does not exist, before anything opens it.

    Opening it would create the file and its directories: a mistyped ``--url`` given to a
    command that only reads would leave an empty journal behind and answer "No schedules."
    Other databases are not created by connecting, so only SQLite needs the check.
    """
    from celery_durable.errors import JournalError
    from celery_durable.store.journal.urls import normalize_url, sqlite_path

    try:
        path = sqlite_path(normalize_url(url))
    except JournalError:
        return  # the journal reports its own URL errors when it is used
    if path is not None and not os.path.exists(path):
        raise CliError(f"no journal at {path} (is the URL right? 'db init' creates it)")


def creates_journal(fun: F) -> F:
    """Mark a command that may create a missing journal (``schedules create``, ``import``,
    ``db init``): every other command refuses one that does not exist (docs/cli.md)."""

    @wraps(fun)
    def command(*args: Any, **kwargs: Any) -> Any:
        session().may_create = True
        return fun(*args, **kwargs)

    return command  # type: ignore[return-value]


def start_session(
    ctx: click.Context,
    app: Any,
    url: str | None,
    as_json: bool,
    tb: bool,
    *,
    app_given: bool = True,
) -> None:
    """Called by the ``durable`` group (and ``python -m celery_durable``) before a command."""
    if url is not None:
        from celery_durable.errors import JournalError
        from celery_durable.store.journal.urls import normalize_url

        try:
            normalize_url(url)
        except JournalError as exc:
            raise invalid(f"--url: {exc}") from None
    session = Session(app, url, app_given=app_given)
    session.json = as_json
    session.traceback = tb
    ctx.meta[_META] = session
    ctx.call_on_close(session.close)
    library = logging.getLogger("celery_durable")
    if not library.handlers:
        # Without a handler Python prints library warnings raw on stderr; the CLI reports
        # what matters itself. ``-v`` on celery's own logging setup still sees everything.
        library.addHandler(logging.NullHandler())


def session() -> Session:
    ctx = click.get_current_context()
    found = ctx.meta.get(_META)
    if found is None:  # pragma: no cover - the group always sets it
        raise CliError("the durable command group was not initialised")
    return found


def json_option(fun: F) -> F:
    """``--json`` on a command: machine-readable output (also accepted before the command)."""

    def remember(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
        if value and _META in ctx.meta:
            ctx.meta[_META].json = True
        return value

    return option(
        "--json",
        "as_json",
        is_flag=True,
        expose_value=False,
        callback=remember,
        help="Print JSON (stable keys, UTC times) instead of a table.",
    )(fun)


# -- errors -----------------------------------------------------------------------------------


def exit_code_of(exc: BaseException) -> int:
    """The exit code of a library exception."""
    from celery_durable.errors import (
        InvalidSchedule,
        RunCancelled,
        RunEnded,
        RunFaulted,
        ScheduleConflict,
        UnknownTask,
    )

    if isinstance(exc, (InvalidSchedule, json.JSONDecodeError)):
        return INVALID
    if isinstance(exc, (ScheduleConflict, RunEnded)):
        return CONFLICT
    if isinstance(exc, (UnknownTask, LookupError)):
        return NOT_FOUND
    if isinstance(exc, (RunFaulted, RunCancelled)):
        return RUN_NOT_OK
    if isinstance(exc, TimeoutError):
        return NOT_ENDED
    return FAILED


def describe_error(exc: BaseException) -> str:
    from celery_durable.errors import DurableError

    if isinstance(exc, (DurableError, LookupError, TimeoutError)):
        text = exc.args[0] if isinstance(exc, LookupError) and exc.args else str(exc)
        return str(text)
    return f"{type(exc).__name__}: {exc}"


def quiet_broken_pipe() -> int:
    """End quietly when stdout's reader has gone, as Unix tools do on SIGPIPE.

    Python ignores SIGPIPE, so a write to a closed pipe raises ``BrokenPipeError``; stdout is
    pointed at ``/dev/null`` so the interpreter's final flush cannot raise it again.
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (stdout replaced in tests)
        pass
    return BROKEN_PIPE


class DurableGroup(click.Group):
    """A group that turns every exception of its commands into one ``Error:`` line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """The group's own options (``celery durable --bogus``) are parsed before
        :meth:`invoke`: a usage error there is one ``Error:`` line too, its values cut."""
        try:
            return super().parse_args(ctx, args)
        except (click.exceptions.Exit, click.exceptions.NoArgsIsHelpError):
            raise
        except click.UsageError as exc:
            raise CliError(_usage_message(exc), INVALID) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.exceptions.NoArgsIsHelpError):
            raise
        except CliError:
            raise
        except BrokenPipeError:
            raise click.exceptions.Exit(quiet_broken_pipe()) from None
        except click.UsageError as exc:
            raise CliError(_usage_message(exc), INVALID) from None
        except click.ClickException:
            raise
        except Exception as exc:
            current = ctx.meta.get(_META)
            if current is not None and current.traceback:
                raise
            message = describe_error(exc)
            for secret in current.secrets() if current is not None else ():
                message = message.replace(secret, "***")
            raise CliError(message, exit_code_of(exc)) from None


def _usage_message(exc: click.UsageError) -> str:
    hint = f" (try '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
    return _quoted_values_cut(exc.format_message()) + hint


# -- output -------------------------------------------------------------------------------------


def emit_json(value: Any) -> None:
    """JSON on stdout; control and format characters stay JSON escapes (``\\u001b``)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=_json_default)
    if not text.isprintable():
        # Only characters inside strings can be non-printable here: ``\\uXXXX`` is the same
        # string to a JSON reader, and harmless to a terminal.
        text = "".join(
            json.dumps(c)[1:-1] if c != "\n" and unicodedata.category(c) in ("Cc", "Cf") else c
            for c in text
        )
    click.echo(text)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        from celery_durable.presentation import utc_json

        return utc_json(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Aligned columns, two spaces apart; the last column is not padded."""
    cells = [[str(h) for h in headers]] + [
        ["" if c is None else printable(str(c)) for c in r] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])] + [row[-1]]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def fields(pairs: Iterable[tuple[str, Any]]) -> str:
    """``Label   value`` lines for a detail view (``None`` values left out)."""
    present = [(k, printable(str(v))) for k, v in pairs if v is not None and v != ""]
    width = max((len(k) for k, _ in present), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in present)


def zone_info(name: str) -> tzinfo:
    """The zone named ``name``; an unknown one is an invalid-input error (exit code 2)."""
    from celery_durable.presentation import zone_of

    try:
        return zone_of(name)
    except InvalidSchedule as exc:
        raise invalid(str(exc)) from None


def display_zone(view: ScheduleView, app: Any) -> str:
    """The zone a schedule's times are shown in: the rule's, else the app's ``timezone``."""
    zone = getattr(view.rule, "zone", None)
    if isinstance(zone, str):
        return zone
    configured = app.conf.get("timezone")
    return str(configured) if configured else "UTC"
