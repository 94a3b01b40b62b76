"""The run table: one queryable row per durable run, for the dispatcher (D8, W4).

The journal stream ``run/<run_id>`` is the truth about a run; the row in
``celery_durable_runs`` is a summary of it, written in the same transaction as the events that
change it (a claim, a suspension, an ending), never on an ordinary step. It answers the two
questions the dispatcher asks without reading any stream:

* :meth:`RunStore.stale` -- runs that were sent or claimed but show no progress: their lease
  passed (the worker died on a broker that does not redeliver, or the message was lost);
* :meth:`RunStore.wakeups` -- suspended runs (durable sleep, retry backoff, signal wait with a
  timeout) whose wake time has come.

Both return :class:`Resend` values, which send the run's message again with the same task id.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Integer,
    and_,
    bindparam,
    case,
    false,
    func,
    insert,
    literal,
    not_,
    null,
    select,
    update,
)
from sqlalchemy.engine import Connection

from celery_durable.core.codec import dumps
from celery_durable.core.journal import Append, category_of
from celery_durable.core.unit_of_work import (
    WAKE_AGAIN_AFTER,
    SentRun,
    check_run_values,
    countdown_left,
)
from celery_durable.message import Resend, message_json
from celery_durable.store.journal.database import Database, stream_insert_statement
from celery_durable.store.journal.errors import translating
from celery_durable.store.journal.schema import runs as runs_table
from celery_durable.store.journal.sql import SqlJournal

QUEUED = "queued"
RUNNING = "running"
SUSPENDED = "suspended"
FINISHED = "finished"
FAULTED = "faulted"
CANCELLED = "cancelled"
PARKED = "parked"
MISSED = "missed"
FAILED_TO_START = "failed_to_start"
"""A durable run whose start the worker refused: a secret input it cannot read (P5, D5)."""
"""Never started: its start deadline passed before a worker began it (P1)."""
STATUSES = (
    QUEUED,
    RUNNING,
    SUSPENDED,
    FINISHED,
    FAULTED,
    CANCELLED,
    PARKED,
    MISSED,
    FAILED_TO_START,
)
"""The values of the ``status`` column (a persistent contract)."""

ACTIVE = (QUEUED, RUNNING)
ENDED = (FINISHED, FAULTED, CANCELLED, PARKED)
"""The statuses of a run that has an outcome (or is parked): what a waiting parent counts."""


def _resend(row: Any) -> Resend:
    return Resend.from_json(row.run_id, row.task, json.loads(row.message) if row.message else {})


@translating
class RunStore:
    """Reads and writes ``celery_durable_runs``. Cheap to construct; safe to share."""

    def __init__(self, journal: SqlJournal) -> None:
        self.journal = journal

    # -- for the dispatcher --------------------------------------------------------------

    def record_sent(
        self,
        run_id: str,
        task: str,
        args: Any,
        kwargs: Any,
        *,
        now: datetime,
        lease: float,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Note that a run's message was sent: until a worker claims it within ``lease``
        seconds, :meth:`stale` reports it. A row that exists already is left alone."""
        with self.journal.transaction() as conn:
            found = conn.execute(
                select(runs_table.c.run_id).where(runs_table.c.run_id == run_id)
            ).first()
            if found is None:
                conn.execute(
                    insert(runs_table).values(
                        run_id=run_id,
                        task=task,
                        status=QUEUED,
                        owner=None,
                        lease_until=now + timedelta(seconds=lease),
                        wake_at=None,
                        updated_at=now,
                        message=dumps(message_json(args, kwargs, options)),
                    )
                )

    def stale(self, now: datetime, *, limit: int = 100) -> list[Resend]:
        """Runs sent or claimed whose lease has passed without progress (D8), oldest first."""
        query = (
            select(runs_table)
            .where(runs_table.c.status.in_(ACTIVE), runs_table.c.lease_until <= now)
            .order_by(runs_table.c.lease_until)
            .limit(limit)
        )
        with self.journal.engine.connect() as conn:
            self.journal.ensure_ready()
            return [_resend(row) for row in conn.execute(query)]

    def wakeups(self, now: datetime, *, limit: int = 100) -> list[Resend]:
        """Suspended runs whose wake time has come (W4), earliest first."""
        query = (
            select(runs_table)
            .where(runs_table.c.status == SUSPENDED, runs_table.c.wake_at <= now)
            .order_by(runs_table.c.wake_at)
            .limit(limit)
        )
        self.journal.ensure_ready()
        with self.journal.engine.connect() as conn:
            return [_resend(row) for row in conn.execute(query)]

    def next_wakeup(self) -> datetime | None:
        """The earliest wake time of a suspended run, or ``None`` (for the dispatcher's sleep)."""
        from sqlalchemy import func

        query = select(func.min(runs_table.c.wake_at)).where(runs_table.c.status == SUSPENDED)
        self.journal.ensure_ready()
        with self.journal.engine.connect() as conn:
            value = conn.execute(query).scalar()
        return value

    def next_resend(self) -> datetime | None:
        """The earliest moment the re-sender has something to do: a suspended run's wake time
        or an active run's lease end (D8, W4); ``None`` when there is none (for test clocks)."""
        from sqlalchemy import func

        queries = (
            select(func.min(runs_table.c.wake_at)).where(runs_table.c.status == SUSPENDED),
            select(func.min(runs_table.c.lease_until)).where(runs_table.c.status.in_(ACTIVE)),
        )
        self.journal.ensure_ready()
        with self.journal.engine.connect() as conn:
            found = [conn.execute(query).scalar() for query in queries]
        moments = [moment for moment in found if moment is not None]
        return min(moments) if moments else None

    def postpone(self, run_ids: Sequence[str], now: datetime, lease: float) -> None:
        """After re-sending runs: look at them again only if nothing happens for ``lease``.

        A re-sent active run gets a new lease; a re-sent suspended run a new fallback wake
        time (the worker reads the real wake time from the run's journal, so an early copy
        just goes back to sleep).
        """
        if not run_ids:
            return
        later = now + timedelta(seconds=lease)
        ids = list(run_ids)
        with self.journal.transaction() as conn:
            conn.execute(
                update(runs_table)
                .where(runs_table.c.run_id.in_(ids), runs_table.c.status.in_(ACTIVE))
                .values(lease_until=later, updated_at=now)
            )
            conn.execute(
                update(runs_table)
                .where(runs_table.c.run_id.in_(ids), runs_table.c.status == SUSPENDED)
                .values(wake_at=later, updated_at=now)
            )

    def mark_missed(self, run_id: str, task: str, now: datetime) -> bool:
        """A durable run that never started passed its start deadline (P1): end its row so
        that the stale-run check (D8) does not send it again.

        Returns ``True`` when this call ended the run: its row was queued, or there was none
        yet (the dispatcher records a sent run just after sending; its insert then leaves
        this row alone). ``False`` when the run had started or was ended already.
        """
        return self.mark_unstarted(run_id, task, now, MISSED)

    def mark_unstarted(self, run_id: str, task: str, now: datetime, status: str) -> bool:
        """End the row of a durable run that will never start with ``status`` (``missed``,
        P1; ``failed_to_start``, P5): as :meth:`mark_missed`, whose return it shares."""
        values = {"status": status, "owner": None, "lease_until": None, "wake_at": None}
        self.journal.ensure_ready()
        with self.journal.transaction() as conn:
            result = conn.execute(
                update(runs_table)
                .where(runs_table.c.run_id == run_id, runs_table.c.status == QUEUED)
                .values(**values, updated_at=now)
            )
            if result.rowcount:
                return True
            row = {
                **values,
                "run_id": run_id,
                "task": task,
                "updated_at": now,
                "message": dumps(message_json((), {})),
            }
            return self.journal.database.insert_new(conn, runs_table, "run_id", row)

    # -- reading ---------------------------------------------------------------------------

    def statuses(self, run_ids: Sequence[str]) -> dict[str, str]:
        """The ``status`` of each of these runs that has a row (durable runs only)."""
        found: dict[str, str] = {}
        if not run_ids:
            return found
        self.journal.ensure_ready()
        ids = list(run_ids)
        with self.journal.engine.connect() as conn:
            for start in range(0, len(ids), 500):
                query = select(runs_table.c.run_id, runs_table.c.status).where(
                    runs_table.c.run_id.in_(ids[start : start + 500])
                )
                found.update((r, s) for r, s in conn.execute(query))
        return found

    def queued(self, run_ids: Sequence[str]) -> builtins.list[Resend]:
        """The messages of those of ``run_ids`` that were sent and never claimed (status
        ``queued``), to send again (W10)."""
        if not run_ids:
            return []
        self.journal.ensure_ready()
        ids = builtins.list(run_ids)
        found: builtins.list[Resend] = []
        with self.journal.engine.connect() as conn:
            for start in range(0, len(ids), 500):
                query = select(runs_table).where(
                    runs_table.c.run_id.in_(ids[start : start + 500]),
                    runs_table.c.status == QUEUED,
                )
                found.extend(_resend(row) for row in conn.execute(query))
        return found

    def rows(self, run_ids: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """The rows of these runs (every row when ``run_ids`` is None) as dicts, by run ID."""
        self.journal.ensure_ready()
        query = select(runs_table)
        found: dict[str, dict[str, Any]] = {}
        with self.journal.engine.connect() as conn:
            if run_ids is None:
                chunks: builtins.list[Any] = [conn.execute(query)]
            else:
                ids = builtins.list(run_ids)
                chunks = [
                    conn.execute(query.where(runs_table.c.run_id.in_(ids[i : i + 500])))
                    for i in range(0, len(ids), 500)
                ]
            for result in chunks:
                for row in result:
                    found[row.run_id] = dict(row._mapping)
        return found

    def list(
        self, *, status: str | None = None, limit: int | None = None
    ) -> builtins.list[dict[str, Any]]:
        """Rows of durable runs, most recently updated first (optionally of one status)."""
        query = select(runs_table).order_by(runs_table.c.updated_at.desc())
        if status is not None:
            query = query.where(runs_table.c.status == status)
        if limit is not None:
            query = query.limit(limit)
        self.journal.ensure_ready()
        with self.journal.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(query)]

    def ended(
        self, *, since: datetime | None = None, limit: int | None = None
    ) -> builtins.list[tuple[str, str]]:
        """``(run ID, task)`` of runs that ended (finished, faulted, cancelled), last ended
        first; ``since``: only those that ended at or after it (the replay check, W6)."""
        query = (
            select(runs_table.c.run_id, runs_table.c.task)
            .where(runs_table.c.status.in_((FINISHED, FAULTED, CANCELLED)))
            .order_by(runs_table.c.updated_at.desc(), runs_table.c.run_id)
        )
        if since is not None:
            query = query.where(runs_table.c.updated_at >= since)
        if limit is not None:
            query = query.limit(limit)
        self.journal.ensure_ready()
        with self.journal.engine.connect() as conn:
            return [(row.run_id, row.task) for row in conn.execute(query)]

    def row(self, run_id: str) -> dict[str, Any] | None:
        """The row of one run as a dict, ``None`` when there is none."""
        self.journal.ensure_ready()
        with self.journal.engine.connect() as conn:
            found = conn.execute(select(runs_table).where(runs_table.c.run_id == run_id)).first()
        return None if found is None else dict(found._mapping)

    def resend_of(self, run_id: str) -> Resend | None:
        self.journal.ensure_ready()
        with self.journal.engine.connect() as conn:
            found = conn.execute(select(runs_table).where(runs_table.c.run_id == run_id)).first()
        return None if found is None else _resend(found)


def record_sent_rows(
    conn: Connection,
    database: Database,
    sent: Sequence[SentRun],
    *,
    now: datetime,
    lease: float,
) -> None:
    """Rows for runs whose message was just sent, in the caller's transaction; existing rows
    stay (the unit of work's ``record_sent``)."""
    if not sent:
        return
    rows = [
        {
            "run_id": r.run_id,
            "task": r.task,
            "status": QUEUED,
            "owner": None,
            "lease_until": now + timedelta(seconds=lease),
            "wake_at": None,
            "updated_at": now,
            "message": dumps(r.to_json()),
        }
        for r in sent
    ]
    statement = database.insert_or_ignore(runs_table, "run_id")
    for start in range(0, len(rows), 1000):
        conn.execute(statement, rows[start : start + 1000])


def save_run_row(
    conn: Connection,
    journal: SqlJournal,
    run_id: str,
    values: Mapping[str, Any],
    *,
    now: datetime,
) -> None:
    """Update (or create) the row of ``run_id`` in the caller's transaction (the unit of
    work's ``save_run``). The ``UPDATE`` of each set of columns is rendered once
    (:meth:`SqlJournal.prepared`): a run's claim, suspension and end write one each."""
    database = journal.database
    changed, row = _row_values(run_id, values, now)
    if _write_row(conn, journal, run_id, changed) == 0:
        # The dispatcher may be inserting this row at the same moment (it records a sent run
        # after the send, and a fast worker can get there first): insert-or-update.
        conn.execute(database.insert_or_update(runs_table, "run_id", changed).values(**row))


def _row_values(
    run_id: str, values: Mapping[str, Any], now: datetime
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The columns a save of ``values`` changes on an existing row, and the whole row it
    inserts when there is none (a running run of an unknown task and message, with them)."""
    check_run_values(values)
    changed = dict(values)
    changed["updated_at"] = now
    message = changed.pop("message", None)
    if message is not None:
        changed["message"] = dumps(dict(message))
    task = changed.pop("task", None)
    if task is not None:
        changed["task"] = task
    row = {
        "status": RUNNING,
        "task": task or "",
        "message": dumps(message_json((), {})),
        **changed,
        "run_id": run_id,
    }
    return changed, row


def _update_by_id(columns: Sequence[str]) -> Any:
    """``UPDATE`` of ``columns`` (bound by their names) of the row whose ``run_id`` is bound
    as ``run_id_``."""
    table = runs_table
    return (
        update(table)
        .where(table.c.run_id == bindparam("run_id_"))
        .values({name: bindparam(name, type_=table.c[name].type) for name in columns})
    )


def _locked_row() -> Any:
    """The row a child's end wakes (or counts down), read with its lock (``wake_row``);
    ``marked``: whether a wake-up sent after ``stale`` is in flight (compared by the database,
    which also reads the stored time: a driver's statement gets no type conversion back)."""
    table = runs_table
    marked = case((table.c.lease_until > bindparam("stale", type_=table.c.lease_until.type), 1),
                  else_=0)  # fmt: skip
    return (
        select(table.c.status, marked.label("marked"), table.c.wake_after, table.c.task,
               table.c.message)
        .where(table.c.run_id == bindparam("run_id_"))
        .with_for_update()
    )  # fmt: skip


def wake_row(
    conn: Connection,
    journal: SqlJournal,
    run_id: str,
    *,
    now: datetime,
    lease: float,
    at_once: bool = False,
) -> Resend | None:
    """The unit of work's ``wake``: in the caller's transaction, mark the suspended row of
    ``run_id`` as woken (``lease_until``) unless it was marked less than
    ``WAKE_AGAIN_AFTER`` seconds ago; its message when this call marked it. A parent counting
    down its children's ends (``wake_after`` above 1, W11) is only counted down, unless
    ``at_once``.

    The row is read with its lock (``SELECT … FOR UPDATE``; SQLite has one writer anyway),
    whatever its status: of two children ending at once only one sees it unmarked, and a
    child ending while its parent suspends either ends before the suspension's look at the
    children (which then sees it ended) or after the suspension committed (and then counts
    down or wakes): its end is never missed by both."""
    stale = now + timedelta(seconds=lease - WAKE_AGAIN_AFTER)
    if journal.database.updates_returning:
        return _wake_in_one(conn, journal, run_id, stale, now + timedelta(seconds=lease), at_once)
    read = journal.prepared("wake_row", _locked_row, conn)
    row = read.execute(conn, {"run_id_": run_id, "stale": stale}).first()
    if row is None or row.status != SUSPENDED or row.marked:
        return None  # not waiting, or another wake-up is in flight
    if not at_once and (row.wake_after or 0) > 1:
        _write_row(conn, journal, run_id, {"wake_after": row.wake_after - 1})
        return None
    _write_row(
        conn, journal, run_id, {"lease_until": now + timedelta(seconds=lease), "wake_after": None}
    )
    return Resend.from_json(run_id, row.task, json.loads(row.message or "{}"))


def _woken_row(at_once: bool) -> Any:
    """:func:`wake_row`'s locking read and write as one ``UPDATE … FROM (SELECT … FOR
    UPDATE) … RETURNING`` (one round trip; on a database that has it,
    :attr:`~.journal.database.Database.updates_returning`).

    The subquery ``was`` reads the row with its lock, as :func:`_locked_row` does: under
    ``READ COMMITTED`` it waits for a suspension being stored and then reads the row that
    suspension committed. Nothing but the run ID selects the row, whatever its status (a
    condition on the status could be checked on the row as it was before that suspension,
    and pass over it without waiting). The ``SET`` changes a suspended row not marked woken
    (counted down: ``wake_after`` above 1 and not ``at_once``; else marked woken:
    ``lease_until`` set to ``woken``, no countdown) and writes any other row's own values
    back. It answers the row as it was: :func:`_woke` tells what it did."""
    table = runs_table
    stale = bindparam("stale", type_=table.c.lease_until.type)
    was = (
        select(table.c.run_id, table.c.status, table.c.lease_until, table.c.wake_after)
        .where(table.c.run_id == bindparam("run_id_"))
        .with_for_update()
        .subquery("was")
    )
    marked = func.coalesce(was.c.lease_until > stale, false())
    waiting = and_(was.c.status == SUSPENDED, not_(marked))
    counting = false() if at_once else func.coalesce(was.c.wake_after, 0) > 1
    return (
        update(table)
        .where(table.c.run_id == was.c.run_id)
        .values(
            wake_after=case(
                (and_(waiting, counting), was.c.wake_after - 1),
                (waiting, null()),
                else_=was.c.wake_after,
            ),
            lease_until=case(
                (and_(waiting, not_(counting)), bindparam("woken", type_=table.c.lease_until.type)),
                else_=was.c.lease_until,
            ),
        )
        .returning(
            was.c.status.label("was_status"), marked.label("marked"),
            was.c.wake_after.label("counted"), table.c.task, table.c.message,
        )
    )  # fmt: skip


def _wake_in_one(
    conn: Connection,
    journal: SqlJournal,
    run_id: str,
    stale: datetime,
    woken: datetime,
    at_once: bool,
) -> Resend | None:
    """:func:`wake_row` in one statement (:func:`_woken_row`)."""
    write = journal.prepared(("wake_row_returning", at_once), lambda: _woken_row(at_once), conn)
    row = write.execute(conn, {"run_id_": run_id, "stale": stale, "woken": woken}).first()
    if row is None or not _woke(row.was_status, row.marked, row.counted, at_once):
        return None  # not waiting, another wake-up in flight, or counted down
    return Resend.from_json(run_id, row.task, json.loads(row.message or "{}"))


def _woke(status: str | None, marked: bool | None, wake_after: int | None, at_once: bool) -> bool:
    """Whether :func:`_woken_row` marked a row woken that was as given (``status``, marked
    woken already, ``wake_after``), rather than counting it down or leaving it."""
    if status != SUSPENDED or marked:
        return False
    return at_once or (wake_after or 0) <= 1


def run_write_statement(
    database: Database, count: int, columns: Sequence[str], wake: bool, at_once: bool
) -> Any:
    """A run's write in one statement, on a database with :attr:`~.journal.database.Database.
    writes_in_one_statement` (PostgreSQL): ``count`` events of the run's stream (named as in
    :func:`~.journal.database.stream_insert_statement`), the run's row (an upsert of
    ``columns``, bound as ``row_<column>``) and, with ``wake``, its parent's countdown or
    wake-up (:func:`_woken_row`, its run ID bound as ``run_id_``).

    The row and the parent are written only when every event went in (``rows``: their
    count); a refused event (its previous version missing) leaves nothing, a version taken by
    another writer fails the whole statement (the unique constraint). The statement answers
    one row: how many events it ``added`` and, with ``wake``, the parent's row as it was
    (``was_status``, ``marked``, ``counted``: :func:`_woke`), its ``task`` and ``message``."""
    table = runs_table
    added = stream_insert_statement(count).returning(literal(1, Integer).label("one")).cte("added")
    complete = select(func.count()).select_from(added).scalar_subquery() == bindparam(
        "rows", type_=Integer
    )
    names = ["run_id", *(c for c in ("status", "task", "message") if c not in columns), *columns]
    given = select(*(bindparam(f"row_{c}", type_=table.c[c].type) for c in names)).where(complete)
    upsert = database.insert(table).from_select(names, given)
    upsert = upsert.on_conflict_do_update(
        index_elements=[table.c.run_id], set_={c: upsert.excluded[c] for c in columns}
    )
    saved = upsert.returning(table.c.run_id).cte("saved")
    answer = [
        select(func.count()).select_from(added).scalar_subquery().label("added"),
        select(func.count()).select_from(saved).scalar_subquery().label("saved"),
    ]
    if wake:
        parent = _woken_row(at_once).where(complete).cte("woke")
        answer += [
            select(parent.c[name]).scalar_subquery().label(name)
            for name in ("was_status", "marked", "counted", "task", "message")
        ]
    return select(*answer)


def write_run(
    journal: SqlJournal,
    append: Append,
    run_id: str,
    values: Mapping[str, Any],
    *,
    now: datetime,
    lease: float,
    wake: str | None = None,
    at_once: bool = False,
) -> tuple[int, Resend | None] | None:
    """The store's ``write_run``: ``append`` (one stream, at most three events), the row of
    ``run_id`` and the parent ``wake`` (:func:`wake_row`) in one statement of its own
    (:func:`run_write_statement`): atomic, one round trip, no ``BEGIN`` and ``COMMIT``
    (W11, measured 2026-12-06). ``None`` when this journal cannot (another database, more
    events, an ordered category): the caller then writes them in a unit of work."""
    if not journal.database.writes_in_one_statement or len(append.events) > 3:
        return None
    if category_of(append.stream) in journal.ordered_categories:
        return None
    changed, row = _row_values(run_id, values, now)
    columns = tuple(sorted(changed))
    params: dict[str, Any] = {f"row_{name}": value for name, value in row.items()}
    if wake is not None:
        params.update(
            run_id_=wake,
            stale=now + timedelta(seconds=lease - WAKE_AGAIN_AFTER),
            woken=now + timedelta(seconds=lease),
        )
    size, waking = len(append.events), wake is not None
    version, answer = journal.append_in_one(
        append,
        ("run_write", size, columns, waking, at_once),
        lambda: run_write_statement(journal.database, size, columns, waking, at_once),
        params,
    )
    if wake is None or not _woke(answer.was_status, answer.marked, answer.counted, at_once):
        return version, None
    return version, Resend.from_json(wake, answer.task, json.loads(answer.message or "{}"))


def wait_for_rows(
    conn: Connection,
    journal: SqlJournal,
    run_id: str,
    children: Sequence[str],
    *,
    wake_after: int,
    now: datetime,
    lease: float,
) -> Resend | None:
    """The unit of work's ``wait_for``: the suspended row of ``run_id`` (locked by the
    ``UPDATE`` of its suspension, earlier in the caller's transaction) waits for
    ``wake_after`` of ``children`` to end; marked woken at once when that many ended
    already or none is left running (its message returned; :func:`countdown_left`)."""
    table = runs_table
    ended = 0
    for start in range(0, len(children), 500):
        ended += conn.execute(
            select(func.count())
            .select_from(table)
            .where(
                table.c.run_id.in_(children[start : start + 500]),
                table.c.status.in_(ENDED),
            )
        ).scalar_one()
    countdown = countdown_left(len(children), ended, wake_after)
    values: dict[str, Any] = {"wake_after": countdown}
    if countdown is None:
        values["lease_until"] = now + timedelta(seconds=lease)
    _write_row(conn, journal, run_id, values)
    return _message_row(conn, run_id) if countdown is None else None


def _write_row(
    conn: Connection, journal: SqlJournal, run_id: str, values: Mapping[str, Any]
) -> int:
    """``UPDATE`` these columns of one run's row, as a statement rendered once per set of
    columns (:meth:`SqlJournal.prepared`); how many rows it changed."""
    columns = tuple(sorted(values))
    prepared = journal.prepared(("save_run", columns), lambda: _update_by_id(columns), conn)
    return int(prepared.execute(conn, {**values, "run_id_": run_id}).rowcount)


def _message_row(conn: Connection, run_id: str) -> Resend | None:
    found = conn.execute(
        select(runs_table.c.run_id, runs_table.c.task, runs_table.c.message).where(
            runs_table.c.run_id == run_id
        )
    ).first()
    return None if found is None else _resend(found)


def due_filter(now: datetime) -> Any:
    """The ``WHERE`` of :meth:`RunStore.wakeups` (exposed for tests and EXPLAIN)."""
    return and_(runs_table.c.status == SUSPENDED, runs_table.c.wake_at <= now)
