"""Print the package's import graph and prove its three rules (docs/architecture.md).

Run from the repository root: ``python tools/import_graph.py`` (or ``python -m
tools.import_graph``). It prints the layers, which module groups (the top-level modules and
subpackages of ``celery_durable``) each group imports, the modules that import SQLAlchemy, and a
verdict line; it exits with 1, saying what breaks which rule, when

* a module outside ``celery_durable/store/`` and the Django app's migrations imports SQLAlchemy;
* a module imports one of a higher layer;
* module-level imports go round in a circle;
* a group belongs to no layer.

The graph is read from the source with ``ast``
(nothing is imported): every import of a package module, at module level, under
``TYPE_CHECKING`` or inside a function. tests/test_layers.py uses the same functions.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "celery_durable"
ROOT = PACKAGE.name

#: Lower ranks are lower layers; a module may import its own layer and the ones below.
LAYERS = [
    ("errors", "observability"),  # observability/__init__.py loads nothing
    ("core",),
    # signals: the public path; fast_publish: Celery's message built from a template (D12)
    ("message", "fast_publish", "observability.signals", "signals", "tracing"),
    (
        "store",
        "config",
        "beat_objects",
        "secret_lookup",
    ),  # config redacts the URL with the store's parser
    ("runtime",),
    ("dispatch", "worker", "schedules", "run_control", "observability.health", "blackouts"),
    (
        "beat",
        "importers",
        "observability.metrics",
        "metrics",  # the public path of observability.metrics
        "durable",
        "cli",
        "contrib",
        "presentation",  # the words and times the CLI and the admin show (pure)
        "testing",
        "__init__",
        "__main__",
    ),
]

#: Subpackages whose modules sit in different layers: each of their modules is a group.
SPREAD = ("observability",)

#: The only places that may import SQLAlchemy: the store, and the Django app's migrations.
SQL_PLACES = (f"{ROOT}.store", f"{ROOT}.contrib.django.migrations")


def _sources() -> Iterator[tuple[str, Path, bool]]:
    """``(module name, file, is a package)`` for every ``.py`` file of the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        yield ".".join(parts), path, is_package


def module_names() -> list[str]:
    """The package's modules, migrations left out."""
    return [name for name, _, _ in _sources() if "migrations" not in name.split(".")]


def _imports(tree: ast.Module, name: str, is_package: bool) -> Iterator[tuple[str, bool]]:
    """``(imported module, at module level or for types)`` for every import of the module."""

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
    for name, path, is_package in _sources():
        if name not in names:
            continue
        edges: dict[str, bool] = {}
        for target, top in _imports(ast.parse(path.read_text()), name, is_package):
            if target in names and target != name:
                edges[target] = edges.get(target, False) or top
        graph[name] = edges
    return graph


def group_of(module: str) -> str:
    """The module group: ``celery_durable.store.index`` → ``store``; the package → ``__init__``;
    a module of a :data:`SPREAD` subpackage → itself (``observability.signals``)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] in SPREAD:
        return ".".join(parts[1:3])
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(module: str) -> int:
    """The module's layer, 0 the lowest; ``ValueError`` when its group is in no layer."""
    for rank, members in enumerate(LAYERS):
        if group_of(module) in members:
            return rank
    raise ValueError(f"{module} is in no layer: add {group_of(module)!r} to LAYERS in {__file__}")


def upward_imports(graph: dict[str, dict[str, bool]]) -> list[str]:
    """Each import of a higher layer, in words (the package's lazy ``__init__`` excepted)."""
    return [
        f"{source} (layer {layer_of(source) + 1}) imports {target} (layer {layer_of(target) + 1})"
        for source, edges in graph.items()
        for target in edges
        if layer_of(target) > layer_of(source) and target != ROOT
    ]


def import_cycles(graph: dict[str, dict[str, bool]]) -> list[list[str]]:
    """Circles of module-level imports, each as the path that closes it (``[a, b, a]``).

    Imports inside functions run after every module has loaded, and a package's ``__init__``
    re-exporting its own modules is not a circle with them.
    """
    top = {
        source: [
            t
            for t, at_top in edges.items()
            if at_top and t != ROOT and not source.startswith(t + ".")
        ]
        for source, edges in graph.items()
    }
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in top.get(node, []):
            if state.get(target) == 1:
                found.append([*stack[stack.index(target) :], target])
            elif state.get(target) is None:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(top):
        if node not in state:
            visit(node)
    return found


def sqlalchemy_users() -> list[str]:
    """Every module of the package (migrations included) that imports SQLAlchemy, at any depth."""
    users = []
    for name, path, _ in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                imported = [node.module or ""]
            else:
                continue
            if any(n.split(".")[0] == "sqlalchemy" for n in imported):
                users.append(name)
                break
    return users


def sql_outside_the_store(users: list[str]) -> list[str]:
    """The SQLAlchemy users outside :data:`SQL_PLACES`."""
    return [u for u in users if not any(u == p or u.startswith(p + ".") for p in SQL_PLACES)]


def _label(group: str) -> str:
    if group in SPREAD:
        return f"{group}/__init__.py"
    path = group.replace(".", "/")
    return f"{path}/" if (PACKAGE / path).is_dir() else f"{path}.py"


def _wrapped(head: str, words: list[str]) -> list[str]:
    return textwrap.wrap(
        " ".join(words) or "nothing",
        width=100,
        initial_indent=head,
        subsequent_indent=" " * len(head),
    )


def report() -> tuple[list[str], bool]:
    """The printed lines, and whether every rule holds."""
    graph = import_graph()
    lines = ["layers, lowest first (a module imports its own layer and the ones below):"]
    for rank, members in enumerate(LAYERS):
        lines += _wrapped(f"  {rank + 1}  ", [_label(m) for m in members])
    unplaced = sorted({group_of(m) for m in graph} - {g for layer in LAYERS for g in layer})
    if unplaced:
        where = ", ".join(_label(g) for g in unplaced)
        lines += ["", f"verdict: BROKEN, in no layer (add to LAYERS in tools/): {where}"]
        return lines, False

    groups: dict[str, set[str]] = {}
    for source, edges in graph.items():
        imported = groups.setdefault(group_of(source), set())
        imported.update(group_of(t) for t in edges if t != ROOT)
    order = sorted(groups, key=lambda g: (layer_of(f"{ROOT}.{g}"), g))
    width = max(len(_label(g)) for g in order)
    lines += ["", "what each group imports (at module level, for types or inside a function):"]
    for group in order:
        targets = sorted(groups[group] - {group}, key=lambda g: (layer_of(f"{ROOT}.{g}"), g))
        lines += _wrapped(f"  {_label(group):<{width}}  -> ", [_label(t) for t in targets])

    users = sqlalchemy_users()
    lines += ["", f"modules importing sqlalchemy ({len(users)}):"]
    lines += [f"  {u}" for u in users]

    broken = [
        *(f"{u} imports SQLAlchemy outside store/" for u in sql_outside_the_store(users)),
        *upward_imports(graph),
        *("import circle: " + " -> ".join(c) for c in import_cycles(graph)),
    ]
    lines.append("")
    if broken:
        lines += [f"  {b}" for b in broken]
        lines.append(f"verdict: BROKEN, {len(broken)} import(s) break the rules above")
    else:
        lines.append(
            f"verdict: ok, {len(graph)} modules: no SQLAlchemy outside store/ and the Django "
            "migrations, no upward import, no import circle"
        )
    return lines, not broken


def main() -> int:
    lines, ok = report()
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
