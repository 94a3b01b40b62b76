"""The admin section "Durable schedules": list, runs, actions and a form, over the journal.

Schedules are not Django rows, so :class:`ScheduleAdmin` replaces the ``ModelAdmin`` views of
the table-less :class:`~.models.Schedule` with views that call the library. Registering it
through the model keeps the admin's look, its index entry, its URL names
(``admin:celery_durable_schedule_changelist`` …) and its permissions: ``view`` to read,
``change`` to change, pause, resume and trigger, ``add`` to create, ``delete`` to delete.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, cast
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone as dj_timezone

from celery_durable.contrib.django import get_durable
from celery_durable.contrib.django.forms import ScheduleForm, zone_names
from celery_durable.contrib.django.models import Schedule
from celery_durable.core.ids import run_stream
from celery_durable.core.read_models import (
    ENDED,
    ENDING_EVENTS,
    RunView,
    ScheduleView,
    ending_of,
    ending_word,
)
from celery_durable.durable import Durable
from celery_durable.errors import DurableError
from celery_durable.message import describe_origin, origin_label
from celery_durable.presentation import (
    STATUSES,
    ending_text,
    format_duration,
    local_label,
    run_detail,
    short,
    status_of,
    utc_label,
)
from celery_durable.store.journal.urls import redact

RUNS_SHOWN = 25
"""Runs listed on a schedule's page (``?runs=all`` lists every one)."""

PER_PAGE = 100


def local_text(moment: datetime | None) -> str:
    """A time in the project's current time zone (``TIME_ZONE`` or the activated one)."""
    return local_label(moment, dj_timezone.get_current_timezone())


def user_of(request: HttpRequest) -> str | None:
    """The logged-in user's name, the author stored with a command (O5)."""
    user = getattr(request, "user", None)
    name = user.get_username() if user is not None and user.is_authenticated else ""
    return name or None


def audit_of(request: HttpRequest) -> dict[str, str | None]:
    """``by`` and ``reason`` of a command made from a list action or a button (O5)."""
    reason = request.POST.get("reason", "").strip()
    return {"by": user_of(request), "reason": reason or None}


def late_text(view: ScheduleView, now: datetime, late_after: float) -> str | None:
    """ "due 95 s ago" when a due time has waited longer than ``durable_late_after`` (O4)."""
    since = view.waiting_since(now)
    if since is None:
        return None
    waited = (now - since).total_seconds()
    return f"due {waited:.0f} s ago" if waited > late_after else None


def _no_run(view: ScheduleView) -> str:
    """Why a schedule shows no next run: over, or every coming due time skipped (P4)."""
    return "—" if view.next_due is None else "none (blackout windows skip the coming due times)"


@dataclass(frozen=True, slots=True)
class RunRow:
    """One line of a schedule's run history as the admin shows it."""

    run: RunView
    state: str
    outcome: str
    detail: str
    url: str = ""
    """The durable run's own page (with its parent and children, W13); empty for plain runs."""

    @property
    def due_utc(self) -> str:
        return utc_label(self.run.due)

    @property
    def due_local(self) -> str:
        return local_text(self.run.due)


TIMING_LABELS = ("Start deadline", "Jitter", "Catch-up window")


def timing_parts(view: ScheduleView) -> tuple[str, ...]:
    """The timing policies (P1–P3) as the admin writes them: ``5m``, ``—`` where off."""
    spans = (view.start_deadline, view.jitter, view.catch_up_window)
    return tuple("—" if s is None else format_duration(s) for s in spans)


def timing_text(view: ScheduleView) -> str:
    """The timing policies in one line: ``5m / — / 1h``."""
    return " / ".join(timing_parts(view))


def run_rows(durable: Durable, runs: Sequence[RunView]) -> list[RunRow]:
    """The runs with their durable-run state and outcome, read for all of them at once (the
    run table in one query, the endings of the runs that ended in one more).

    A run the schedule still holds as ``decided`` whose durable run has begun was enqueued:
    the dispatcher stored the decision and sent the message but not yet (or, after a crash,
    never) recorded the start (A6). It is shown as ``started`` (``RunStatus.stage``), so that
    no page says "not yet enqueued" next to the outcome of a run a worker has already executed.
    """
    return [
        RunRow(run=s.run, state=s.stage, outcome=s.outcome, detail=run_detail(s))
        for s in durable.schedules.run_statuses(runs, endings=True)
    ]


UTC_ZONES = frozenset({"UTC", "Etc/UTC", "Etc/Universal", "Universal", "Etc/Zulu", "Zulu", "GMT"})
"""Names of UTC: with such a ``TIME_ZONE`` the pages show one time, not UTC twice."""


def shows_local_time() -> bool:
    """Whether the current Django time zone differs from UTC by name (``TIME_ZONE``)."""
    return dj_timezone.get_current_timezone_name() not in UTC_ZONES


def _parent_of(durable: Durable, run_id: str, row: Any = None) -> str | None:
    """The parent's run ID named in a child run's ``RunStarted`` (W13), or, for a child no
    worker has taken yet, in the message its row keeps; else ``None``."""
    from celery_durable.core.ids import run_stream
    from celery_durable.core.run_aggregate import RUN_STARTED
    from celery_durable.message import sent_parent

    for event in durable.journal.read_stream(run_stream(run_id))[:2]:
        if event.type == RUN_STARTED:
            parent = event.data.get("parent")
            return parent if isinstance(parent, str) else None
    return sent_parent(None if row is None else row.get("message"))


def _outcome(durable: Durable, run_id: str, status: str) -> tuple[str, str]:
    """An ended durable run's outcome word and detail, from the ending its stream recorded
    (``status``, its run-table word, while none is found)."""
    stream = run_stream(run_id)
    ending = ending_of(durable.journal.read_streams([stream], types=ENDING_EVENTS).get(stream, ()))
    return (status, "") if ending is None else (ending_word(ending), ending_text(ending))


def breakable(text: str) -> str:
    """``text`` as HTML that may wrap after ``.``, ``_``, ``/`` and ``,``.

    Task names (``shop.send_monthly_report``) and zones (``America/Argentina/Buenos_Aires``)
    are single words to a browser; without these break points one long name widens its
    column until the columns after it leave the window.
    """
    from django.utils.html import escape
    from django.utils.safestring import mark_safe

    html = str(escape(text))
    for mark in (".", "_", "/", ","):
        html = html.replace(mark, mark + "<wbr>")
    return mark_safe(html)  # escaped above; only <wbr> is added


def _query(**params: str) -> str:
    given = {k: v for k, v in params.items() if v}
    return "?" + urlencode(given) if given else "?"


class ScheduleAdmin(admin.ModelAdmin):
    """Admin views for durable schedules, reading and writing the journal."""

    list_template = "celery_durable/admin/schedule_list.html"
    form_template = "celery_durable/admin/schedule_form.html"
    delete_template = "celery_durable/admin/schedule_delete.html"

    # The library, not Django, is the source of truth ---------------------------------------------

    def durable(self) -> Durable:
        """The ``Durable`` the views use (override to pick another app or journal)."""
        return get_durable()

    def get_urls(self) -> list[Any]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        view = self.admin_site.admin_view
        views = {
            "pause": self.pause_view,
            "resume": self.resume_view,
            "trigger": self.trigger_view,
            "delete": self.delete_view,
            "history": self.history_view,
            "change": self.change_view,
        }
        return [
            path("", view(self.changelist_view), name=f"{prefix}_changelist"),
            path("add/", view(self.add_view), name=f"{prefix}_add"),
            # The global blackout windows (P4): contrib/django/admin_blackouts.py.
            path("blackouts/", view(self.blackouts_view), name=f"{prefix}_blackouts"),
            # A durable run's page (W13): its parent and children, linked both ways.
            path("run/<path:run_id>/", view(self.run_view), name=f"{prefix}_run"),
            # IDs may hold "/": the admin's quote() escapes it, and <path:> takes the rest.
            *(
                path(f"<path:object_id>/{name}/", view(fun), name=f"{prefix}_{name}")
                for name, fun in views.items()
            ),
        ]

    def _url(self, name: str, *args: str) -> str:
        info = self.opts.app_label, self.opts.model_name
        return reverse(
            f"admin:{info[0]}_{info[1]}_{name}",
            args=[quote(a) for a in args],
            current_app=self.admin_site.name,
        )

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "title": title,
            "has_view_permission": self.has_view_permission(request),
            "has_add_permission": self.has_add_permission(request),
            "has_change_permission": self.has_change_permission(request),
            "has_delete_permission": self.has_delete_permission(request),
            "local_zone": dj_timezone.get_current_timezone_name(),
            "show_local": shows_local_time(),
            **extra,
        }

    def _load(self, durable: Durable, object_id: str) -> ScheduleView:
        try:
            view = durable.schedules.state(unquote(object_id))
        except DurableError:
            view = None
        if view is None:
            raise Http404(f"no durable schedule {unquote(object_id)!r}")
        return view

    # The list ------------------------------------------------------------------------------------

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        durable = self.durable()
        if request.method == "POST":
            return self._run_action(request, durable)
        status = request.GET.get("status", "")
        query = request.GET.get("q", "").strip()
        views = durable.schedules.list(include_deleted=status in ("deleted", "all"))
        if status in STATUSES:
            views = [v for v in views if status_of(v) == status]
        if query:
            needle = query.lower()
            views = [v for v in views if needle in v.id.lower() or needle in v.task.lower()]
        page = Paginator(views, PER_PAGE).get_page(request.GET.get("p"))
        now, late_after = durable.now(), durable.config.late_after
        rows = [
            {
                "view": v,
                "status": status_of(v),
                "late": late_text(v, now, late_after),
                "url": self._url("change", v.id),
                "origin": origin_label(v.task, v.options),
                "origin_text": describe_origin(v.task, v.options),
                "rule": breakable(v.rule.describe()),
                "task": breakable(v.task),
                # The next run that really starts: blackouts and jitter considered (P4, P2).
                "next_utc": utc_label(v.next_run),
                "next_local": local_text(v.next_run),
            }
            for v in page.object_list
        ]
        filters = [
            ("", "Not deleted"),
            *((s, s.capitalize()) for s in STATUSES),
            ("all", "All"),
        ]
        context = self._context(
            request,
            "Durable schedules",
            rows=rows,
            page=page,
            total=len(views),
            query=query,
            status=status,
            filters=[(value, label, _query(status=value, q=query)) for value, label in filters],
            actions=self._actions(request),
            journal=redact(durable.config.url),
            **(extra_context or {}),
        )
        return TemplateResponse(request, self.list_template, context)

    def _actions(self, request: HttpRequest) -> list[tuple[str, str]]:
        actions = []
        if self.has_change_permission(request):
            actions += [
                ("pause", "Pause selected schedules"),
                ("resume", "Resume selected schedules"),
                ("trigger", "Trigger a run now for selected schedules"),
            ]
        if self.has_delete_permission(request):
            actions.append(("delete", "Delete selected schedules"))
        return actions

    def _run_action(self, request: HttpRequest, durable: Durable) -> HttpResponse:
        action = request.POST.get("action", "")
        selected = request.POST.getlist("_selected_action")
        back = request.get_full_path()
        if action not in dict(self._actions(request)):
            self.message_user(request, "No action selected.", messages.WARNING)
            return HttpResponseRedirect(back)
        if not selected:
            self.message_user(
                request,
                "Items must be selected in order to perform actions on them.",
                messages.WARNING,
            )
            return HttpResponseRedirect(back)
        if action == "delete" and request.POST.get("post") != "yes":
            return self._confirm_delete(request, durable, selected)
        self._apply(request, durable, action, selected)
        return HttpResponseRedirect(back)

    def _apply(self, request: HttpRequest, durable: Durable, action: str, ids: list[str]) -> None:
        command: Callable[..., Any] = getattr(durable.schedules, action)
        done, verb = [], {"pause": "Paused", "resume": "Resumed", "delete": "Deleted"}
        audit = audit_of(request)  # O5: the logged-in user and the optional reason
        for sid in ids:
            try:
                result = command(sid, **audit)
            except DurableError as exc:
                self.message_user(request, f"Could not {action} {sid}: {exc}", messages.ERROR)
                continue
            if action == "trigger":
                self.message_user(request, f"Triggered run {result}.", messages.SUCCESS)
            else:
                done.append(sid)
        if done:
            self.message_user(
                request,
                f"{verb[action]} {len(done)} schedule{'s' if len(done) != 1 else ''}: "
                + ", ".join(done),
                messages.SUCCESS,
            )

    # One schedule --------------------------------------------------------------------------------

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_add_permission(request):
            raise PermissionDenied
        durable = self.durable()
        form = ScheduleForm(request.POST or None, creating=True)
        if request.method == "POST" and form.is_valid() and form.save(durable, by=user_of(request)):
            sid = form.cleaned_data["id"]
            self.message_user(request, f"Created schedule {sid}.", messages.SUCCESS)
            if "_addanother" in request.POST:
                return HttpResponseRedirect(self._url("add"))
            return HttpResponseRedirect(self._url("change", sid))
        context = self._context(
            request, "Add durable schedule", form=form, adding=True, **self._choices(durable)
        )
        return TemplateResponse(request, self.form_template, context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        durable = self.durable()
        view = self._load(durable, object_id)
        editable = self.has_change_permission(request) and not view.deleted
        if request.method == "POST":
            if not editable:
                raise PermissionDenied
            form = ScheduleForm(request.POST, initial=ScheduleForm.initial_of(view), creating=False)
            if form.is_valid() and form.save(durable, by=user_of(request)):
                self.message_user(request, f"Changed schedule {view.id}.", messages.SUCCESS)
                if "_continue" in request.POST:
                    return HttpResponseRedirect(self._url("change", view.id))
                return HttpResponseRedirect(self._url("changelist"))
        else:
            form = ScheduleForm(initial=ScheduleForm.initial_of(view), creating=False)
        all_runs = request.GET.get("runs") == "all"
        # cast: inside Schedules, ``list[...]`` in its annotations names its own list() method.
        runs = cast(
            "list[RunView]",
            durable.schedules.runs(view.id, limit=None if all_runs else RUNS_SHOWN + 1),
        )
        shown_runs = [
            replace(r, url=self._url("run", r.run.run_id)) if r.state == "started" else r
            for r in run_rows(durable, runs[: None if all_runs else RUNS_SHOWN])
        ]
        context = self._context(
            request,
            f"Schedule {view.id}",
            form=form,
            adding=False,
            editable=editable,
            view=view,
            status=status_of(view),
            origin=describe_origin(view.task, view.options),
            rule=view.rule.describe(),
            next_utc=utc_label(view.next_due),
            next_local=local_text(view.next_due),
            next_run_utc=utc_label(view.next_run) if view.next_run else _no_run(view),
            next_run_local=local_text(view.next_run) if view.next_run else "—",
            global_blackouts=[w.describe() for w in durable.blackouts.get()],
            anchor_utc=utc_label(view.anchor),
            timing=timing_text(view),
            created_utc=utc_label(view.created_at),
            runs=shown_runs,
            not_enqueued=sum(1 for row in shown_runs if row.state == "decided"),
            more_runs=not all_runs and len(runs) > RUNS_SHOWN,
            urls={
                name: self._url(name, view.id)
                for name in ("pause", "resume", "trigger", "delete", "history")
            },
            **self._choices(durable),
        )
        return TemplateResponse(request, self.form_template, context)

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_delete_permission(request):
            raise PermissionDenied
        durable = self.durable()
        view = self._load(durable, object_id)
        if request.method == "POST":
            self._apply(request, durable, "delete", [view.id])
            return HttpResponseRedirect(self._url("changelist"))
        return self._confirm_delete(request, durable, [view.id], single=True)

    def _confirm_delete(
        self, request: HttpRequest, durable: Durable, ids: list[str], *, single: bool = False
    ) -> HttpResponse:
        context = self._context(
            request,
            "Are you sure?",
            ids=ids,
            single=single,
            change_url=self._url("change", ids[0]) if single else None,
        )
        return TemplateResponse(request, self.delete_template, context)

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """The admin's "History" page: the schedule's commands from the journal (O5)."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        durable = self.durable()
        view = self._load(durable, object_id)
        entries = [
            {
                "entry": e,
                "at_utc": utc_label(e.at),
                "at_local": local_text(e.at),
                "changes": [
                    (name, short(before), short(after))
                    for name, (before, after) in e.changes.items()
                ],
            }
            for e in durable.schedules.history(view.id)
        ]
        context = self._context(
            request,
            f"History of schedule {view.id}",
            view=view,
            entries=entries,
            change_url=self._url("change", view.id),
            **(extra_context or {}),
        )
        return TemplateResponse(request, "celery_durable/admin/schedule_history.html", context)

    def run_view(self, request: HttpRequest, run_id: str) -> HttpResponse:
        """A durable run: task, status, outcome, its parent and its children, each a link
        to its own page (W13)."""
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        durable = self.durable()
        run_id = unquote(run_id)
        row = durable.runs.row(run_id)
        try:
            children = durable.children(run_id)
        except LookupError:
            raise Http404(f"no durable run {run_id!r}") from None
        parent = _parent_of(durable, run_id, row)
        status = str(row["status"]) if row is not None else "queued"
        outcome, detail = _outcome(durable, run_id, status) if status in ENDED else (status, "")
        context = self._context(
            request,
            f"Durable run {run_id}",
            run_id=run_id,
            task=row["task"] if row is not None else "",
            status=status,
            outcome=outcome,
            detail=detail,
            parent=parent,
            parent_url=self._url("run", parent) if parent else None,
            children=[(rid, state, self._url("run", rid)) for rid, state in children],
        )
        return TemplateResponse(request, "celery_durable/admin/run.html", context)

    def _object_action(self, request: HttpRequest, object_id: str, action: str) -> HttpResponse:
        if request.method != "POST":  # these change state: never on a GET
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        durable = self.durable()
        view = self._load(durable, object_id)
        self._apply(request, durable, action, [view.id])
        return HttpResponseRedirect(self._url("change", view.id))

    @staticmethod
    def _choices(durable: Durable) -> dict[str, Any]:
        tasks = sorted(name for name in durable.app.tasks if not name.startswith("celery."))
        return {"task_names": tasks, "zone_names": zone_names()}

    def blackouts_view(self, request: HttpRequest) -> HttpResponse:
        """The global blackout windows: show, set, clear (P4, O5)."""
        from celery_durable.contrib.django.admin_blackouts import blackouts_view

        return blackouts_view(self, request)

    def pause_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._object_action(request, object_id, "pause")

    def resume_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._object_action(request, object_id, "resume")

    def trigger_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._object_action(request, object_id, "trigger")


admin.site.register(Schedule, ScheduleAdmin)
