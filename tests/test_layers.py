"""The package's layers hold by construction (see docs/architecture.md).

* The pure core (``celery_durable.core``), the wire format, the errors, the settings and the
  package itself import without SQLAlchemy, Celery or kombu: proved in a subprocess where
  those packages cannot be imported at all.
* The import graph (read from the source with ``ast`` by tools/import_graph.py, whose
  functions these tests use) has no cycle of module-level imports, no module imports one of a
  higher layer, and only the store imports SQLAlchemy; the script itself says so.
* Only the store holds a connection: outside ``store/`` nothing opens a transaction, holds an
  engine or a connection, calls a store helper that takes one, or translates the database's
  errors (the services write through a unit of work).
* The core holds no live state: no module of it keeps a context variable, a thread-local, a
  ``global`` it rebinds, or a module-level container it changes. What a process holds (the
  clock, a beat's schedule objects) is passed in; memos of pure functions use ``lru_cache``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap

from tools.import_graph import (
    PACKAGE,
    import_cycles,
    import_graph,
    module_names,
    sql_outside_the_store,
    sqlalchemy_users,
    upward_imports,
)

PURE = [
    "celery_durable",
    "celery_durable.errors",
    "celery_durable.message",
    "celery_durable.config",
]
BLOCKED = ("sqlalchemy", "celery", "kombu", "psycopg", "django", "flask", "click")


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


def test_the_graph_sees_imports_of_every_kind() -> None:
    graph = import_graph()
    dispatcher = graph["celery_durable.dispatch.dispatcher"]
    assert dispatcher["celery_durable.dispatch.state_cache"] is True
    assert graph["celery_durable.durable"]["celery_durable.dispatch.dispatcher"] is True  # types
    assert graph["celery_durable.durable"]["celery_durable.worker.steps"] is False  # in a method
    assert dispatcher["celery_durable.observability.signals"] is True  # from pkg


def test_no_module_imports_a_higher_layer() -> None:
    wrong = upward_imports(import_graph())
    assert not wrong, "\n".join(wrong)


def test_nothing_below_the_adapters_imports_the_facade() -> None:
    users = sorted(s for s, edges in import_graph().items() if "celery_durable.durable" in edges)
    allowed = (
        "celery_durable.cli",
        "celery_durable.contrib",
        "celery_durable.observability.metrics",
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
    cycles = import_cycles(import_graph())
    assert not cycles, "\n".join("import cycle: " + " -> ".join(c) for c in cycles)


def test_the_rule_checks_can_fail() -> None:
    """The graph checks see a circle, an upward import and SQL outside the store."""
    graph = {
        "celery_durable.core.a": {"celery_durable.core.b": True},
        "celery_durable.core.b": {"celery_durable.core.a": True, "celery_durable.worker": False},
        "celery_durable.worker": {"celery_durable.core.a": False},
    }
    assert import_cycles(graph) == [
        ["celery_durable.core.a", "celery_durable.core.b", "celery_durable.core.a"]
    ]
    assert upward_imports(graph) == [
        "celery_durable.core.b (layer 2) imports celery_durable.worker (layer 6)"
    ]
    users = [
        "celery_durable.store.index",
        "celery_durable.contrib.django.migrations.0001_initial",
        "celery_durable.storefront",
        "celery_durable.testing",
    ]
    assert sql_outside_the_store(users) == ["celery_durable.storefront", "celery_durable.testing"]


#: What only the store may touch: a connection's transaction and engine, the store's SQL
#: helpers that take a connection, and the database layer's errors (the store translates them).
_STORE_ONLY_ATTRIBUTES = {"transaction", "writing", "append_in", "engine", "database"}
_STORE_ONLY_NAMES = {
    "Connection", "JOURNAL_AWAY", "journal_errors", "connection_lost", "translated",
    "translating", "upsert", "record_sent_rows", "save_run_row", "SqlUnitOfWork",
}  # fmt: skip


def store_internals(source: str) -> list[str]:
    """Where a module's source reaches into the store below its unit of work."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in _STORE_ONLY_ATTRIBUTES:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "celery_durable.store"
        ):
            found += [
                f"line {node.lineno}: imports {a.name}"
                for a in node.names
                if a.name in _STORE_ONLY_NAMES
            ]
    return found


def test_only_the_store_holds_a_connection() -> None:
    """Outside ``store/`` nothing opens a transaction, holds a connection or an engine, calls
    a store helper that takes one, or translates the database's errors: the services write
    through a unit of work (core/unit_of_work.py) and catch the library's own errors."""
    package = PACKAGE
    wrong = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith(("store/", "contrib/django/migrations/")):
            continue
        wrong += [f"{relative} {where}" for where in store_internals(path.read_text())]
    assert wrong == [], "\n".join(wrong)
    assert store_internals("with journal.transaction() as conn: upsert(conn, rows)\n") == [
        "line 1: .transaction"
    ]
    assert store_internals("from celery_durable.store.index import upsert\n") == [
        "line 1: imports upsert"
    ]


def test_the_import_graph_script_passes() -> None:
    """``python tools/import_graph.py`` (docs/architecture.md) proves the rules and says so."""
    done = subprocess.run(
        [sys.executable, "tools/import_graph.py"],
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == (
        "verdict: ok, "
        f"{len(import_graph())} modules: no SQLAlchemy outside store/ and the Django migrations, "
        "no upward import, no import circle"
    )


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


def test_only_the_store_speaks_sql() -> None:
    """SQLAlchemy is imported only in ``store/`` (and the Django app's migrations)."""
    assert "celery_durable.store.journal.sql" in sqlalchemy_users()
    assert sql_outside_the_store(sqlalchemy_users()) == []
