"""The admin page of the global blackout windows (P4): show, set and clear them, with the
logged-in user and a reason stored with each change (O5), as ``celery durable blackouts``
does on the command line. Reached from the schedule list ("Blackout windows");
:class:`~.admin.ScheduleAdmin` routes it and its permissions: ``view`` to read, ``change``
to set or clear.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from celery_durable.contrib.django.forms import reason_field
from celery_durable.core.blackout_text import FORMS, parse_window
from celery_durable.errors import DurableError, InvalidSchedule

if TYPE_CHECKING:
    from celery_durable.contrib.django.admin import ScheduleAdmin

TEMPLATE = "celery_durable/admin/blackouts.html"
HISTORY_SHOWN = 20
"""Changes listed on the page, newest first."""


class GlobalBlackoutsForm(forms.Form):
    """The global windows, one per line in the text form the CLI reads and shows."""

    windows = forms.CharField(
        label="Windows",
        required=False,
        help_text=f"One per line: {FORMS}. Saving replaces the whole list.",
        widget=forms.Textarea(attrs={"rows": 6, "cols": 80, "class": "vLargeTextField"}),
    )
    reason = reason_field("the history of the global windows")

    def clean_windows(self) -> list[Any]:
        lines = (self.cleaned_data.get("windows") or "").split("\n")
        try:
            return [parse_window(line, "blackout window") for line in lines if line.strip()]
        except InvalidSchedule as exc:
            raise forms.ValidationError(str(exc)) from None


def blackouts_view(admin: ScheduleAdmin, request: HttpRequest) -> HttpResponse:
    """Show the global windows and their history; on POST, set them or (``_clear``) clear
    them. Refused input is shown on the form and nothing is stored."""
    from celery_durable.contrib.django.admin import local_text, user_of
    from celery_durable.presentation import utc_label

    if not admin.has_view_or_change_permission(request):
        raise PermissionDenied
    durable = admin.durable()
    api = durable.blackouts
    current = api.get()
    form = GlobalBlackoutsForm(initial={"windows": "\n".join(w.describe() for w in current)})
    if request.method == "POST":
        if not admin.has_change_permission(request):
            raise PermissionDenied
        form = GlobalBlackoutsForm(request.POST)
        clearing = "_clear" in request.POST  # the windows typed do not matter then
        if clearing or form.is_valid():
            reason = (request.POST.get("reason") or "").strip()
            audit = {"by": user_of(request), "reason": reason or None}
            try:
                if clearing:
                    changed = api.clear(**audit)
                else:
                    changed = api.set(form.cleaned_data["windows"], **audit)
            except DurableError as exc:
                form.add_error(None, str(exc))
            else:
                word = "cleared" if clearing else "set"
                admin.message_user(
                    request,
                    f"Global blackout windows {word}." if changed else "Nothing changed.",
                    messages.SUCCESS if changed else messages.INFO,
                )
                return HttpResponseRedirect(request.path)
    history = [
        {
            "change": change,
            "at_utc": utc_label(change.at),
            "at_local": local_text(change.at),
            "windows": [w.describe() for w in change.windows],
        }
        for change in api.history()[:HISTORY_SHOWN]
    ]
    context = admin._context(
        request,
        "Global blackout windows",
        form=form,
        windows=[(w.name, w.describe()) for w in current],
        history=history,
        editable=admin.has_change_permission(request),
    )
    return TemplateResponse(request, TEMPLATE, context)


__all__ = ["GlobalBlackoutsForm", "blackouts_view"]
