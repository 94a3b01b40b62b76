"""What every ``celery`` command pays for the ``celery durable`` plugin.

Celery imports its ``celery.commands`` plugins (``celery durable``) with every command it
runs, ``celery beat`` and ``celery worker`` included: the plugin's group must not import the
commands, or the read models and presentation behind them, until one is looked up.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Modules only a ``celery durable`` command needs (and the modules only they import).
COMMAND_ONLY = (
    "celery_durable.cli.admin",
    "celery_durable.cli.blackouts",
    "celery_durable.cli.health",
    "celery_durable.cli.importing",
    "celery_durable.cli.partitions",
    "celery_durable.cli.replay_check",
    "celery_durable.cli.run",
    "celery_durable.cli.runs",
    "celery_durable.cli.schedules",
    "celery_durable.presentation",
)


def _loaded_after(code: str) -> list[str]:
    """The ``celery_durable`` modules a fresh interpreter holds after running ``code``."""
    script = textwrap.dedent(code) + textwrap.dedent(
        """
        import json, sys
        print(json.dumps(sorted(m for m in sys.modules if m.startswith("celery_durable"))))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout.strip().splitlines()[-1]))


def test_celerys_command_line_loads_the_plugin_group_without_its_commands() -> None:
    # celery.bin.celery loads every celery.commands entry point when it is imported.
    loaded = _loaded_after("import celery.bin.celery, celery.beat, celery_durable.beat")
    assert "celery_durable.cli" in loaded, "the entry point was not loaded: the test sees nothing"
    assert [m for m in COMMAND_ONLY if m in loaded] == []


def test_a_command_is_imported_when_it_is_looked_up() -> None:
    loaded = _loaded_after(
        """
        import click
        from celery_durable.cli import durable, main

        ctx = click.Context(durable)
        assert durable.list_commands(ctx) == main.list_commands(ctx) == [
            "beats", "blackouts", "db", "health", "import", "index", "partitions", "prune",
            "replay", "run", "runs", "schedules",
        ]
        assert durable.get_command(ctx, "runs").name == "runs"
        assert durable.get_command(ctx, "nothing") is None
        """
    )
    assert "celery_durable.cli.runs" in loaded and "celery_durable.presentation" in loaded
    assert "celery_durable.cli.admin" not in loaded


def test_the_group_knows_every_command_of_its_modules() -> None:
    """Each listed command resolves to a command of that name, and no command of the
    command modules is left out of the list."""
    import click

    from celery_durable import cli

    ctx = click.Context(cli.durable)
    listed = cli.durable.list_commands(ctx)
    for name in listed:
        command = cli.durable.get_command(ctx, name)
        assert command is not None and command.name == name
        assert cli.main.get_command(click.Context(cli.main), name) is command
    modules = {module for module, _ in cli._COMMANDS.values()}
    defined = {
        obj.name
        for module in modules
        for obj in vars(__import__(f"celery_durable.cli.{module}", fromlist=["_"])).values()
        if isinstance(obj, click.Command) and obj.name in cli._COMMANDS
    }
    assert defined == set(listed)
