"""Sun events for the Solar rule (SPEC B3), computed as Celery's ``solar`` computes them.

``ephem`` is imported when a time is first computed, never at import: the rule value stays
pure and readable without it (a web process listing schedules does not need it); the
dispatcher does (``pip install celery-durable[solar]``). Observer settings, horizons and the
search follow ``celery.schedules.solar`` (5.7), so the same event is found.

One thing differs on purpose. ephem's answer for an event depends a little on where its search
starts (up to about 0.1 s, measured), and a run ID is built from the due time (S2): the same
sunrise found from two instants must give the same due time, or it could be decided twice. So
every event is solved a second time from a *canonical* start that depends only on the day and
the longitude — half an hour before local mean midnight (rising events, which come after true
midnight), before local mean noon (setting events, after true noon), or local mean midnight
(solar noon). True midnight and noon lie within 17 minutes of the mean ones, so the canonical
start is never near the event and always finds the same one.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_durable.errors import SolarUnavailable

__all__ = ["EVENTS", "MAX_SEARCH_DAYS", "next_event", "require_ephem"]

UTC = timezone.utc

# event: (horizon, ephem method, use_center), as in celery.schedules.solar.
EVENTS: dict[str, tuple[str, str, bool]] = {
    "dawn_astronomical": ("-18", "next_rising", True),
    "dawn_nautical": ("-12", "next_rising", True),
    "dawn_civil": ("-6", "next_rising", True),
    "sunrise": ("-0:34", "next_rising", False),
    "solar_noon": ("0", "next_transit", False),
    "sunset": ("-0:34", "next_setting", False),
    "dusk_civil": ("-6", "next_setting", True),
    "dusk_nautical": ("-12", "next_setting", True),
    "dusk_astronomical": ("-18", "next_setting", True),
}

MAX_SEARCH_DAYS = 366 * 2
"""Days searched for an event that does not happen every day (polar day and night) before
answering that there is none. Celery searches 366; two years cover every place on Earth."""

# Where the canonical search starts, in hours after local mean midnight (see the module doc).
_CANONICAL = {"next_rising": -0.5, "next_setting": 11.5, "next_transit": 0.0}
_DAY = timedelta(days=1)
_MARGIN = timedelta(minutes=2)
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def require_ephem() -> Any:
    """The ``ephem`` module, or :class:`SolarUnavailable` saying how to install it."""
    try:
        import ephem
    except ImportError:
        raise SolarUnavailable(
            "Solar rules need the 'ephem' package: pip install 'celery-durable[solar]'"
        ) from None
    return ephem


def _observer(ephem: Any, event: str, latitude: float, longitude: float) -> Any:
    observer = ephem.Observer()
    observer.lat, observer.lon = str(latitude), str(longitude)
    observer.elev, observer.pressure = 0, 0
    observer.horizon = EVENTS[event][0]
    return observer


def _solve(ephem: Any, observer: Any, event: str, start: datetime) -> datetime | None:
    """The first ``event`` after ``start``, skipping days without it as Celery does."""
    _, method, use_center = EVENTS[event]
    sun, options = ephem.Sun(), ({"use_center": True} if use_center else {})
    moment = ephem.Date(start)
    for _ in range(MAX_SEARCH_DAYS):
        try:
            found = getattr(observer, method)(sun, start=moment, **options)
        except ephem.CircumpolarError:  # not today: go on from the next local midnight
            moment = observer.next_antitransit(sun, start=moment)
            continue
        when: datetime = found.datetime()
        return when.replace(tzinfo=UTC)
    return None


def _canonical_start(event: str, longitude: float, found: datetime) -> datetime:
    """The latest canonical start at or before ``found`` (local mean time of ``longitude``)."""
    offset = timedelta(hours=_CANONICAL[EVENTS[event][1]] - longitude / 15)
    days = math.floor((found - offset - _EPOCH) / _DAY)
    return _EPOCH + offset + days * _DAY


def _canonical(
    ephem: Any, observer: Any, event: str, longitude: float, found: datetime
) -> datetime | None:
    """The event's time solved from its day's canonical start.

    On the first or last day an event happens at all (the sun only grazes its horizon) ephem
    may report it from one start and not from another; the canonical solve then lands on a
    later day, whose own canonical time is taken, so every start gives the same answer.
    """
    start = _canonical_start(event, longitude, found)
    for _ in range(4):
        solved = _solve(ephem, observer, event, start)
        if solved is None:
            return None
        again = _canonical_start(event, longitude, solved)
        if again == start:
            return solved
        start = again
    return solved  # pragma: no cover - a day's canonical solve stays on that day


def next_event(event: str, latitude: float, longitude: float, after: datetime) -> datetime | None:
    """The first ``event`` strictly after ``after`` (aware UTC), or ``None`` within two years.

    ``after`` is an aware datetime. Raises :class:`SolarUnavailable` without ``ephem``.
    """
    ephem = require_ephem()
    observer = _observer(ephem, event, latitude, longitude)
    # Start a little early: ephem may place an event just after ``after`` a fraction of a
    # second before it, and would then answer with the next day's.
    start = after - _MARGIN
    for _ in range(3):
        found = _solve(ephem, observer, event, start)
        if found is None:
            return None
        canonical = _canonical(ephem, observer, event, longitude, found)
        if canonical is None:
            return None
        if canonical > after:
            return canonical
        # This event is at or before ``after`` (a due time asked again): look past it.
        start = max(found, canonical) + _MARGIN
    return None  # pragma: no cover - the second search always moves past ``after``
