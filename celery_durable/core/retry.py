"""Retry policies of durable steps (W3): one frozen value and a pure decision function.

A policy never sleeps and never reads the clock: :func:`decide_retry` is given the attempt
number, the stored start of the step's first attempt and the current time, and says whether to
fail the step or when to try again. The step runner stores that decision in the journal, so a
worker restart neither resets the attempt count nor extends the deadline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

Seconds = float | int | timedelta

DEFAULT_INITIAL = 1.0
DEFAULT_MULTIPLIER = 2.0
DEFAULT_CAP = 60.0


def seconds(value: Seconds | None, what: str) -> float | None:
    """A duration as float seconds (``None`` stays ``None``); negative or NaN: ``ValueError``."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        number = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        raise TypeError(f"{what} must be seconds or a timedelta, not {type(value).__name__}")
    if math.isnan(number) or number < 0:
        raise ValueError(f"{what} must be >= 0, not {value!r}")
    return number


def type_name(kind: type) -> str:
    """The stored name of an exception type: ``module.QualName`` (builtins without module)."""
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Retry:
    """How often and how long a step is tried again after an exception (W3).

    * ``attempts`` -- the most attempts in all (``None``: no limit; then set ``deadline``).
    * ``initial``, ``multiplier``, ``cap`` -- the wait before attempt *n + 1* is
      ``min(cap, initial * multiplier ** (n - 1))`` seconds (1 s, 2 s, 4 s … 60 s by default).
    * ``deadline`` -- no attempt starts later than this many seconds after the stored start of
      the step's first attempt (a worker restart does not extend it).
    * ``timeout`` -- seconds one attempt may take; a slower attempt fails with kind ``timeout``.
    * ``retry_on`` -- only these exception types are retried (default: every ``Exception``).
    * ``dont_retry_on`` -- these fail the step at once (kind ``not_retryable``).

    ``Retry.none()``, ``Retry.times(n)`` and ``Retry.forever(deadline)`` cover the usual cases::

        @durable.step(retry=Retry.times(5, dont_retry_on=(PermissionError,)))
        def upload(path: str) -> str: ...
    """

    attempts: int | None = 1
    initial: float = DEFAULT_INITIAL
    multiplier: float = DEFAULT_MULTIPLIER
    cap: float = DEFAULT_CAP
    deadline: float | None = None
    timeout: float | None = None
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    dont_retry_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if self.attempts is not None:
            if not isinstance(self.attempts, int) or isinstance(self.attempts, bool):
                raise TypeError(f"attempts must be an int or None, not {self.attempts!r}")
            if self.attempts < 1:
                raise ValueError(f"attempts must be >= 1, not {self.attempts}")
        elif self.deadline is None:
            raise ValueError("a policy without an attempt limit needs a deadline")
        for name in ("initial", "cap", "deadline", "timeout"):
            object.__setattr__(self, name, seconds(getattr(self, name), name))
        if not self.multiplier >= 1:
            raise ValueError(f"multiplier must be >= 1, not {self.multiplier!r}")
        if self.timeout is not None and self.timeout <= 0:
            raise ValueError("timeout must be positive")
        for name in ("retry_on", "dont_retry_on"):
            kinds = getattr(self, name)
            if isinstance(kinds, type):
                kinds = (kinds,)
            kinds = tuple(kinds)
            for kind in kinds:
                if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                    raise TypeError(f"{name} must hold exception types, not {kind!r}")
            object.__setattr__(self, name, kinds)

    @classmethod
    def none(cls) -> Retry:
        """One attempt: the first exception fails the step."""
        return cls(attempts=1)

    @classmethod
    def times(cls, attempts: int, **options: Any) -> Retry:
        """At most ``attempts`` attempts with the default backoff (other fields as keywords)."""
        return cls(attempts=attempts, **options)

    @classmethod
    def forever(cls, deadline: Seconds, **options: Any) -> Retry:
        """No attempt limit; no attempt starts ``deadline`` after the first one started."""
        return cls(attempts=None, deadline=seconds(deadline, "deadline"), **options)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based) before the next one."""
        exponent = min(attempt - 1, 1000)
        try:
            wait = self.initial * self.multiplier**exponent
        except OverflowError:
            wait = math.inf
        return min(self.cap, wait)

    def retryable(self, error: BaseException) -> bool:
        """Whether ``error`` may be retried at all under this policy (ignores limits)."""
        if self.dont_retry_on and isinstance(error, self.dont_retry_on):
            return False
        return isinstance(error, self.retry_on)


@dataclass(frozen=True, slots=True)
class RetryAt:
    """Try again at ``at`` (attempt number ``attempt``)."""

    at: datetime
    attempt: int


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Fail the step; ``kind`` is the ``StepFailed`` kind, ``reason`` says why."""

    kind: str
    reason: str


def decide_retry(
    policy: Retry,
    error: BaseException,
    *,
    attempt: int,
    first_started: datetime,
    now: datetime,
    kind: str = "error",
) -> RetryAt | GiveUp:
    """What to do after attempt ``attempt`` failed with ``error``. Pure.

    ``kind`` is ``"error"`` or ``"timeout"`` (an attempt that ran past ``policy.timeout``).
    Non-retryable errors give up with kind ``not_retryable``; an exhausted attempt limit or a
    next attempt that would start after the deadline gives up with ``kind``.
    """
    if not policy.retryable(error):
        return GiveUp("not_retryable", f"{type_name(type(error))} is not retryable")
    if policy.attempts is not None and attempt >= policy.attempts:
        return GiveUp(kind, f"gave up after {attempt} attempt(s)")
    at = now + timedelta(seconds=policy.delay(attempt))
    if policy.deadline is not None:
        limit = first_started + timedelta(seconds=policy.deadline)
        if at > limit:
            return GiveUp(kind, f"deadline of {policy.deadline:g} s from the first attempt passed")
    return RetryAt(at, attempt + 1)
