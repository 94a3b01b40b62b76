"""Secret inputs (SPEC P5): references to values that are never stored, only read when needed.

A :class:`Secret` names where a value lives (``env:NAME``, ``setting:NAME``). The journal keeps
the reference in a JSON form that user data cannot take: ``{"$secret": "env:NAME"}``; a user dict
that has exactly that shape (one key ``"$secret"``), or the escape's own shape (one key
``"$literal"``), is stored wrapped as ``{"$literal": {...}}`` and read back as the user's dict.

A schedule whose stored values hold either form carries the option :data:`SECRETS_OPTION`;
values without it are read as plain data, so everything stored before secrets existed (where
such dicts meant nothing special) reads as it always did (SPEC §9).

Pure: resolving takes the lookup as an argument (the worker or beat hands in one that reads its
environment and settings).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

from celery_durable.core.codec import MAX_NESTING
from celery_durable.errors import InvalidSchedule, SecretUnavailable

SCHEMES = ("env", "setting")
"""Where a secret may be read from: the process environment, or a Celery or Django setting."""
MAX_NAME_LENGTH = 200
"""Longer names are refused: a reference is shown on every read, so it stays short."""
REFERENCE_KEY = "$secret"
"""The one key of a stored reference."""
LITERAL_KEY = "$literal"
"""The one key of an escaped user dict that looked like a reference (or like an escape)."""
SECRETS_OPTION = "$secrets"
"""Schedule option (stored, never sent) marking values stored with references or escapes."""

Lookup = Callable[[str, str], Any]
"""``lookup(scheme, name)``: the value, or ``KeyError`` when there is none."""


class Secret(dict[str, str]):
    """A reference to a secret value: ``Secret("env:API_TOKEN")`` or ``Secret("setting:NAME")``.

    Stands anywhere in a schedule's input, args or kwargs. The journal stores the reference,
    every read (``repr``, views, CLI, admin, logs) shows it, and the value is read only when a
    run's message is built (plain tasks, by beat) or at ``run.input`` (durable tasks, in the
    worker). Raises ``InvalidSchedule`` for a reference that is not text, has an unknown
    scheme, or an empty or unprintable name.

    It is a read-only dict holding its stored form, ``{"$secret": "env:NAME"}``, so that
    whatever writes a schedule's input as JSON (the CLI, the admin, a project's own code)
    writes the reference.
    """

    __slots__ = ()

    def __init__(self, reference: str) -> None:
        scheme, name = parse_reference(reference)
        super().__init__({REFERENCE_KEY: f"{scheme}:{name}"})

    @property
    def reference(self) -> str:
        """``scheme:name``."""
        return self[REFERENCE_KEY]

    @property
    def scheme(self) -> str:
        return self.reference.partition(":")[0]

    @property
    def name(self) -> str:
        return self.reference.partition(":")[2]

    def __repr__(self) -> str:
        return f"Secret({self.reference!r})"

    __str__ = __repr__

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a Secret is read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return (Secret, (self.reference,))

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: Any) -> Secret:
        return self

    def to_json(self) -> dict[str, str]:
        """The stored form, ``{"$secret": "env:NAME"}`` (a plain dict)."""
        return {REFERENCE_KEY: self.reference}


def parse_reference(reference: object) -> tuple[str, str]:
    """``(scheme, name)`` of a reference text; ``InvalidSchedule`` says what is wrong."""
    if not isinstance(reference, str):
        raise InvalidSchedule(
            f"a Secret takes a reference text such as 'env:NAME', not {type(reference).__name__}",
            field="input",
        )
    scheme, sep, name = reference.partition(":")
    if not sep or scheme not in SCHEMES:
        raise InvalidSchedule(
            f"a Secret reference must start with {' or '.join(s + ':' for s in SCHEMES)} "
            f"(given {_shown(scheme) if sep else 'no scheme'})",
            field="input",
        )
    if not name:
        raise InvalidSchedule(f"the Secret reference {scheme}: has an empty name", field="input")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidSchedule(
            f"a Secret name has at most {MAX_NAME_LENGTH} characters (given {len(name)})",
            field="input",
        )
    if name != name.strip() or any(
        unicodedata.category(c) in ("Cc", "Cf", "Zs", "Zl", "Zp") for c in name
    ):
        raise InvalidSchedule(
            f"the Secret name {_shown(name)} holds spaces or control characters", field="input"
        )
    return scheme, name


def _shown(text: str) -> str:
    """Text for an error message: bounded, control characters escaped."""
    return ascii(text[:40]) + ("…" if len(text) > 40 else "")


def _special(value: dict[Any, Any]) -> bool:
    return len(value) == 1 and (REFERENCE_KEY in value or LITERAL_KEY in value)


def encode_secrets(value: Any) -> tuple[Any, bool]:
    """``(stored form, marked)``: Secrets become references and lookalike dicts are escaped.

    ``marked`` says whether anything was (the schedule then needs :data:`SECRETS_OPTION`).
    Tuples stay tuples and other values are left as they are, for the JSON checks that follow.
    Below ``MAX_NESTING`` levels the value is left as it is too: the nesting check that follows
    refuses it in words, where walking on would exhaust Python's recursion limit.
    """
    marked = False

    def walk(item: Any, depth: int) -> Any:
        nonlocal marked
        if depth > MAX_NESTING:
            return item
        if isinstance(item, Secret):
            marked = True
            return item.to_json()
        if isinstance(item, dict):
            out = {k: walk(v, depth + 1) for k, v in item.items()}
            if _special(out):
                marked = True
                return {LITERAL_KEY: out}
            return out
        if isinstance(item, list):
            return [walk(v, depth + 1) for v in item]
        if isinstance(item, tuple):
            return tuple(walk(v, depth + 1) for v in item)
        return item

    return walk(value, 0), marked


def _decode(value: Any, leaf: Callable[[str], Any]) -> Any:
    if isinstance(value, list):
        return [_decode(v, leaf) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and isinstance(value.get(REFERENCE_KEY), str):
            return leaf(value[REFERENCE_KEY])
        if len(value) == 1 and isinstance(value.get(LITERAL_KEY), dict):
            return {k: _decode(v, leaf) for k, v in value[LITERAL_KEY].items()}
        return {k: _decode(v, leaf) for k, v in value.items()}
    return value


def decode_secrets(stored: Any) -> Any:
    """The stored form with :class:`Secret` objects for references (what reads show)."""
    return _decode(stored, Secret)


def resolve_secrets(stored: Any, lookup: Lookup) -> Any:
    """The stored form with each reference replaced by its value.

    Raises :class:`SecretUnavailable` naming the first reference that cannot be read; the
    message never holds a value.
    """

    def leaf(reference: str) -> Any:
        scheme, name = parse_reference(reference)
        try:
            return lookup(scheme, name)
        except KeyError:
            raise SecretUnavailable(
                f"secret {scheme}:{name} cannot be resolved: "
                + ("no such environment variable" if scheme == "env" else "no such setting"),
                reference=f"{scheme}:{name}",
            ) from None

    return _decode(stored, leaf)


def resolve_value(value: Any, lookup: Lookup) -> Any:
    """``value`` (which may hold :class:`Secret` objects) with each Secret's value."""
    stored, marked = encode_secrets(value)
    return resolve_secrets(stored, lookup) if marked else value


def has_secrets(value: Any, _depth: int = 0) -> bool:
    """Whether a value (not stored yet) holds a :class:`Secret` (nested up to ``MAX_NESTING``)."""
    if isinstance(value, Secret):
        return True
    if _depth > MAX_NESTING:
        return False
    if isinstance(value, dict):
        return any(has_secrets(v, _depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_secrets(v, _depth + 1) for v in value)
    return False


def holds_references(stored: Any) -> bool:
    """Whether a stored form holds a reference or an escape (it then needs the mark)."""
    if isinstance(stored, dict):
        if len(stored) == 1 and (
            isinstance(stored.get(REFERENCE_KEY), str) or isinstance(stored.get(LITERAL_KEY), dict)
        ):
            return True
        return any(holds_references(v) for v in stored.values())
    if isinstance(stored, list):
        return any(holds_references(v) for v in stored)
    return False


def shown_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A schedule's options as reads show them: references as Secrets, no mark (P5)."""
    if SECRETS_OPTION not in options:
        return dict(options)
    return {
        k: decode_secrets(v) if k in ("args", "kwargs") else v
        for k, v in options.items()
        if k != SECRETS_OPTION
    }


def shown_input(stored: Any, options: Mapping[str, Any]) -> Any:
    """A schedule's or run's stored input as reads show it: references as Secrets (P5)."""
    return decode_secrets(stored) if SECRETS_OPTION in options else stored
