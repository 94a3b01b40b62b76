"""The package's layers hold by construction (see docs/architecture.md).

* The pure core (``celery_durable.core``), the wire format, the errors, the settings and the
  package itself import without SQLAlchemy, Celery or kombu: proved in a subprocess where
  those packages cannot be imported at all.
* The import graph (module-level and type-level imports, read from the source with ``ast``)
  has no cycle, and no module imports one of a higher layer.
* The core holds no live state: no module of it keeps a context variable, a thread-local, a
  ``global`` it rebinds, or a module-level container it changes. What a process holds (the
  clock, a beat's schedule objects) is passed in; memos of pure functions use ``lru_cache``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "celery_durable"

PURE = [
    "celery_durable",
    "celery_durable.errors",
    "celery_durable.message",
    "celery_durable.config",
]
BLOCKED = ("sqlalchemy", "celery", "kombu", "psycopg", "django", "flask", "click")

#: Lower numbers are lower layers; a module may import its own layer and the ones below.
LAYERS = [
    ("errors",),
    ("core",),
    ("message", "signals", "tracing"),
    (
        "store",
        "config",
        "beat_objects",
        "secret_lookup",
    ),  # config redacts the URL with the store's parser
    ("runtime",),
    ("celery_schedules", "dispatch", "worker", "schedules", "control", "health", "blackouts"),
    (
        "beat",
        "beat_import",
        "importers",
        "metrics",
        "durable",
        "cli",
        "contrib",
        "testing",
        "__init__",
        "__main__",
    ),
]


def module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if "migrations" in parts:
            continue
        names.append(".".join(parts))
    return names


def core_modules() -> list[str]:
    return [
        n
        for n in module_names()
        if n == "celery_durable.core" or n.startswith("celery_durable.core.")
    ]


def import_blocked(
    modules: list[str], blocked: tuple[str, ...]
) -> subprocess.CompletedProcess[str]:
    """Import ``modules`` in a fresh interpreter where ``blocked`` packages cannot be imported."""
    script = textwrap.dedent(
        f"""
        import importlib, sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {blocked!r}:
                    raise ImportError(f"blocked: {{name}}")
                return None

        sys.meta_path.insert(0, Block())
        for name in {modules!r}:
            importlib.import_module(name)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r})
        assert not loaded, loaded
        print("ok")
        """
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_core_imports_with_sqlalchemy_and_celery_blocked() -> None:
    modules = core_modules() + PURE
    assert (
        "celery_durable.core.rules" in modules and "celery_durable.core.schedule_events" in modules
    )
    done = import_blocked(modules, BLOCKED)
    assert done.returncode == 0 and done.stdout.startswith("ok"), done.stderr


def test_the_blocker_does_block() -> None:
    """The check above can fail: a module that needs SQLAlchemy does not import under it."""
    done = import_blocked(["celery_durable.store.journal.sql"], ("sqlalchemy",))
    assert done.returncode != 0 and "blocked: sqlalchemy" in done.stderr


def _imports(tree: ast.Module, name: str, is_package: bool) -> Iterator[tuple[str, bool]]:
    """``(imported module, at module level or for types)`` for every import of the package."""

    def visit(node: ast.AST, top: bool) -> Iterator[tuple[str, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, top
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = name.split(".")
                    parent = parent[: len(parent) - child.level + (1 if is_package else 0)]
                    base = ".".join([*parent, *([base] if base else [])])
                for alias in child.names:
                    yield f"{base}.{alias.name}", top  # a submodule, or a name in ``base``
                    yield base, top
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(child, False)
            else:
                yield from visit(child, top)

    yield from visit(tree, True)


def import_graph() -> dict[str, dict[str, bool]]:
    """Module → {imported module: at module level (incl. ``TYPE_CHECKING``), not in a function}."""
    names = set(module_names())
    graph: dict[str, dict[str, bool]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        name = ".".join(parts)
        if name not in names:
            continue
        edges: dict[str, bool] = {}
        for target, top in _imports(ast.parse(path.read_text()), name, is_package):
            if target in names and target != name:
                edges[target] = edges.get(target, False) or top
        graph[name] = edges
    return graph


def layer_of(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "__init__"
    for rank, members in enumerate(LAYERS):
        if key in members:
            return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


def test_the_graph_sees_imports_of_every_kind() -> None:
    graph = import_graph()
    assert graph["celery_durable.dispatch.dispatcher"]["celery_durable.dispatch.state"] is True
    assert graph["celery_durable.durable"]["celery_durable.dispatch.dispatcher"] is True  # types
    assert graph["celery_durable.durable"]["celery_durable.worker.steps"] is False  # in a method
    assert graph["celery_durable.dispatch.dispatcher"]["celery_durable.signals"] is True  # from pkg


def test_no_module_imports_a_higher_layer() -> None:
    wrong = [
        f"{source} (layer {layer_of(source)}) imports {target} (layer {layer_of(target)})"
        for source, edges in import_graph().items()
        for target in edges
        if layer_of(target) > layer_of(source) and target != "celery_durable"
    ]
    assert not wrong, "\n".join(wrong)


def test_nothing_below_the_adapters_imports_the_facade() -> None:
    users = sorted(s for s, edges in import_graph().items() if "celery_durable.durable" in edges)
    allowed = (
        "celery_durable.cli",
        "celery_durable.contrib",
        "celery_durable.metrics",
        "celery_durable.testing",
    )
    assert [u for u in users if u != "celery_durable" and not u.startswith(allowed)] == []


def test_the_cli_imports_no_integration() -> None:
    """The CLI knows no integration: the Django app sets an app up through
    ``config.register_app_hook`` (its management commands may use the CLI's code)."""
    crossing = sorted(
        f"{source} imports {target}"
        for source, edges in import_graph().items()
        for target in edges
        if source.startswith("celery_durable.cli") and target.startswith("celery_durable.contrib")
    )
    assert crossing == []


def test_module_level_imports_have_no_cycle() -> None:
    graph = {s: [t for t, top in edges.items() if top] for s, edges in import_graph().items()}
    # A package's __init__ re-exporting its modules is not a cycle with them.
    for source in graph:
        graph[source] = [
            t for t in graph[source] if not source.startswith(t + ".") and t != "celery_durable"
        ]
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in graph.get(node, []):
            if state.get(target) == 1:
                cycle = [*stack[stack.index(target) :], target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if state.get(target) is None:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)


#: Calls that make a container or per-process state at module level.
_STATEFUL_CALLS = {"dict", "list", "set", "defaultdict", "deque", "OrderedDict", "Counter"}
_LIVE_CALLS = {"ContextVar", "local", "WeakKeyDictionary", "WeakValueDictionary", "WeakSet"}
_MUTATORS = {
    "append", "extend", "insert", "pop", "popitem", "remove", "clear", "update",
    "setdefault", "add", "discard", "appendleft", "extendleft", "sort", "reverse",
}  # fmt: skip


def live_state(source: str) -> list[str]:
    """Where a module's source keeps state at module level (see the module docstring)."""
    tree = ast.parse(source)
    containers: set[str] = set()
    found: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        names = [t.id for t in targets if isinstance(t, ast.Name) and t.id != "__all__"]
        called = value.func if isinstance(value, ast.Call) else None
        called_name = (
            called.id
            if isinstance(called, ast.Name)
            else called.attr
            if isinstance(called, ast.Attribute)
            else None
        )
        if called_name in _LIVE_CALLS:
            found += [f"line {node.lineno}: {n} = {called_name}(...)" for n in names]
        elif called_name in _STATEFUL_CALLS or isinstance(
            value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
        ):
            containers.update(names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.append(f"line {node.lineno}: global {', '.join(node.names)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in containers
            and node.func.attr in _MUTATORS
        ):
            found.append(f"line {node.lineno}: {node.func.value.id}.{node.func.attr}(...)")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if (
                    isinstance(target, ast.Subscript)
                    and isinstance(target.value, ast.Name)
                    and target.value.id in containers
                ):
                    found.append(f"line {node.lineno}: {target.value.id}[...] changed")
    return found


def test_the_core_holds_no_live_state() -> None:
    found = {
        name: live_state((PACKAGE.parent / (name.replace(".", "/"))).with_suffix(".py").read_text())
        if not (PACKAGE.parent / name.replace(".", "/")).is_dir()
        else live_state((PACKAGE.parent / name.replace(".", "/") / "__init__.py").read_text())
        for name in core_modules()
    }
    assert {name: where for name, where in found.items() if where} == {}


def test_the_live_state_check_sees_each_kind() -> None:
    source = textwrap.dedent(
        """
        from contextvars import ContextVar
        import threading
        TABLE = {"a": 1}
        _REGISTRY: dict[str, object] = {}
        _NOW = ContextVar("now", default=None)
        _LOCAL = threading.local()
        _SEEN = set()
        _COUNT = 0

        def bind(name, obj):
            _REGISTRY[name] = obj

        def forget(name):
            _SEEN.discard(name)

        def tick():
            global _COUNT
            _COUNT += 1

        def read():
            return TABLE["a"]
        """
    )
    assert sorted(live_state(source)) == [
        "line 12: _REGISTRY[...] changed",
        "line 15: _SEEN.discard(...)",
        "line 18: global _COUNT",
        "line 6: _NOW = ContextVar(...)",
        "line 7: _LOCAL = local(...)",
    ]


#: Modules outside ``store/`` that still import SQLAlchemy. The store is to be the only place
#: that speaks SQL to the journal: this set may only shrink.
SQL_OUTSIDE_STORE = {
    "celery_durable.contrib.django",  # a journal URL from Django's DATABASES
    "celery_durable.importers.django_beat",  # reads the peer's tables, not the journal
    "celery_durable.testing",  # creates the test journal's database
}


def sqlalchemy_users() -> set[str]:
    """Modules (migrations and the store excluded) that import SQLAlchemy, at any depth."""
    users = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if "migrations" in parts or parts[1:2] == ["store"]:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(n.split(".")[0] == "sqlalchemy" for n in names):
                users.add(".".join(parts))
    return users


def test_only_the_store_speaks_sql() -> None:
    assert sqlalchemy_users() == SQL_OUTSIDE_STORE
