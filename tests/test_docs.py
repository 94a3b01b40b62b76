"""Every code block of every page in docs/ is executed or checked (docs/testing.md, "Docs").

The convention, per fenced block, by its language tag:

* ``python`` -- executed. The blocks of one page run in order in one namespace, in a fresh
  temp dir that is the current directory and on ``sys.path``, with an embedded-defaults
  environment: ``CELERY_DURABLE_URL`` points at a SQLite file there, ``CELERY_BROKER_URL`` is
  ``memory://``.
* ``pycon`` -- a doctest (``>>>`` lines), run in the same namespace; ``...`` matches anything.
* ``console`` -- each ``$ `` line is a command, run with bash in the page's temp dir (``python``
  and ``celery`` are this interpreter's, virtualenv or not); the lines below it, if any, are its
  expected output, compared doctest style. A command whose expected output starts with
  ``Error:`` must fail, every other must succeed. ``bash``, ``sh``, ``shell`` -- the block is
  one bash script (``set -e``) that must succeed.
* ``json``, ``toml``, ``ini`` -- parsed. ``yaml`` -- parsed when PyYAML is installed.
* anything else (``text``, ``sql``, …) and a block without a language -- not allowed unless
  marked skipped.

Markers, an HTML comment on the last non-blank line before the fence:

* ``<!-- docs-test: skip REASON -->`` -- the block is not run; the reason is required.
* ``<!-- docs-test: file NAME -->`` -- the block is written to ``NAME`` in the page's temp dir
  (for the project module that later blocks import or name with ``celery -A``), not run.
* ``<!-- docs-test: output -->`` -- on a ``text`` block right after a ``python`` block: what
  that block prints, compared doctest style. A ``python`` block that prints without one fails,
  so a page cannot show output its code does not produce.

docs/cli.md's ``python`` and ``console`` blocks are run by tests/cli/test_cli_docs.py (in process,
with their outputs); here they are only parsed.
"""

from __future__ import annotations

import configparser
import contextlib
import doctest
import importlib
import inspect
import io
import json
import os
import posixpath
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import celery._state
import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None  # type: ignore[assignment]

from tests.support.processes import REPO_ROOT

DOCS = REPO_ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
MARKER = re.compile(r"^<!--\s*docs-test:\s*(\S+)\s*(.*?)\s*-->$")
FENCE = re.compile(r"^(\s*)(```+)\s*([\w+-]*)\s*$")
SHELLS = {"bash", "sh", "shell"}
PARSED = {"json", "toml", "ini", "yaml"}
RUN_ELSEWHERE = {("cli.md", "python"), ("cli.md", "console")}  # tests/cli/test_cli_docs.py
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


@dataclass
class Block:
    page: str
    line: int
    language: str
    text: str
    action: str  # "run", "skip", "file"
    argument: str = ""

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def blocks_of(page: Path) -> list[Block]:
    """The fenced blocks of a page with their markers; a malformed marker fails here."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, ticks, language = match.groups()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != ticks:
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            pytest.fail(f"docs/{page.name}:{start + 1}: the block is never closed")
        i += 1
        previous = next((ln.strip() for ln in reversed(lines[:start]) if ln.strip()), "")
        action, argument = "run", ""
        marker = MARKER.match(previous)
        if marker:
            action, argument = marker.groups()
            if action not in ("skip", "file", "output"):
                pytest.fail(f"docs/{page.name}:{start + 1}: unknown docs-test marker {action!r}")
            if not argument and action != "output":
                pytest.fail(
                    f"docs/{page.name}:{start + 1}: 'docs-test: {action}' needs "
                    + ("a reason" if action == "skip" else "a file name")
                )
        elif "docs-test" in previous:
            pytest.fail(f"docs/{page.name}:{start + 1}: malformed docs-test marker {previous!r}")
        found.append(
            Block(page.name, start + 1, language.lower(), "\n".join(body) + "\n", action, argument)
        )
    return found


def test_the_docs_have_pages() -> None:
    names = {p.name for p in PAGES}
    assert {"index.md", "tutorial.md", "reference.md", "testing.md", "cli.md"} <= names


def test_every_page_in_the_nav_exists_or_is_expected() -> None:
    """mkdocs.yml lists every page of docs/ (pages listed there may still be in the making)."""
    missing = {p.name for p in PAGES} - nav_pages()
    assert not missing, f"pages not in mkdocs.yml's nav: {sorted(missing)}"


def nav_pages() -> set[str]:
    nav = (REPO_ROOT / "mkdocs.yml").read_text()
    return set(re.findall(r":\s*([\w./-]+\.md)\s*$", nav, re.M))


def test_mkdocs_builds_strict(tmp_path: Path) -> None:
    """The site builds without warnings (MkDocs comes with the test extra); mkdocs.yml makes a
    link to a missing anchor a warning, so this fails on one too."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr


def test_relative_links_between_pages_resolve() -> None:
    """A link to another page must find it, or at least a page the nav expects."""
    expected = nav_pages()
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", text):
            if "://" in target or target in expected:
                continue
            if not (page.parent / target).resolve().exists():
                broken.append(f"docs/{page.name} -> {target}")
    assert not broken


class _Anchors(HTMLParser):
    """The ``id`` attributes and link targets of one rendered page."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(str(found["id"]))
        if tag == "a" and found.get("href"):
            self.hrefs.append(str(found["href"]))


def rendered(texts: dict[str, str]) -> dict[str, _Anchors]:
    """Each page rendered as MkDocs renders it: Python-Markdown with mkdocs.yml's
    ``markdown_extensions`` (so heading ids are ``toc``'s slugs, de-duplicated with ``_1``, and
    ``{#id}`` counts wherever ``attr_list`` is on), reduced to its ids and links."""
    import markdown
    import yaml

    names: list[str] = []
    configs: dict[str, dict[str, object]] = {}
    for entry in yaml.safe_load((REPO_ROOT / "mkdocs.yml").read_text())["markdown_extensions"]:
        if isinstance(entry, dict):
            [(name, options)] = entry.items()
            configs[name] = options or {}
        else:
            name = entry
        names.append(name)
    pages = {}
    for name, text in texts.items():
        parser = _Anchors()
        parser.feed(markdown.Markdown(extensions=names, extension_configs=configs).convert(text))
        pages[name] = parser
    return pages


def broken_anchors(texts: dict[str, str]) -> list[str]:
    """Links ``page.md#anchor`` (or ``#anchor`` in the page) whose anchor the target lacks."""
    pages = rendered(texts)
    broken = []
    for name, page in pages.items():
        for href in page.hrefs:
            target, _, anchor = href.partition("#")
            if not anchor or "://" in target or target.startswith("mailto:"):
                continue
            linked = pages.get(
                posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
                if target
                else name
            )
            if linked is not None and anchor not in linked.ids:
                broken.append(f"docs/{name} -> {href}")
    return broken


def test_links_to_a_heading_find_its_anchor() -> None:
    """``page.md#anchor`` must name a heading id of that page as MkDocs makes it (``toc``'s
    slugify: ``## `beat_schedule` under `-S durable` `` is ``#beat_schedule-under-s-durable``)."""
    broken = broken_anchors({p.name: p.read_text() for p in PAGES})
    assert not broken, f"links to anchors the target page does not have: {broken}"


def test_the_anchor_check_knows_toc_slugs() -> None:
    """The checker's oracle is Python-Markdown itself: a slug it makes passes, a guess fails."""
    texts = {
        "a.md": "# Top\n\n## `beat_schedule` under `-S durable`\n\n## Top\n\n[x](#top_1)\n",
        "b.md": "[ok](a.md#beat_schedule-under-s-durable) [bad](a.md#beat_schedule) [t](a.md#top)",
    }
    assert broken_anchors(texts) == ["docs/b.md -> a.md#beat_schedule"]


#: "SQLite or PostgreSQL", "SQLite by default, PostgreSQL in production", "on an SQLite and a
#: PostgreSQL journal" -- a list of the journal's databases that leaves MySQL/MariaDB out.
TWO_DATABASES = re.compile(
    r"SQLite(?: by default)?(?:,| or| and)+ (?:an? )?PostgreSQL(?!(?:,| or| and)+ (?:an? )?MySQL)"
)


def test_pages_listing_the_journal_databases_name_mysql_too() -> None:
    """SQLite, PostgreSQL and MySQL/MariaDB are the journal's databases: no page names two as
    if they were all (the MySQL how-to may speak of moving from the other two)."""
    stale = [
        f"{path.relative_to(REPO_ROOT)}: {match.group(0)!r}"
        for path in [*PAGES, REPO_ROOT / "README.md"]
        if path.name != "howto-mysql.md"
        for match in TWO_DATABASES.finditer(" ".join(path.read_text().split()))
    ]
    assert not stale, f"journal databases listed without MySQL/MariaDB: {stale}"


#: How a page counts the browser tests: "the three headless-browser tests", "three tests in
#: headless Chromium", "holds three tests in a real browser".
BROWSER_COUNT = re.compile(
    r"\b(one|two|three|four|five|six) (?:headless-browser tests?|tests? in headless Chromium"
    r"|(?:tests?|checks?) in a real browser|tests of `tests/contrib/test_django_browser\.py`)",
    re.I,
)
BROWSER_PAGES = ("README.md", "docs/testing.md", "docs/django.md")


def browser_tests() -> int:
    """How many tests ``tests/contrib/test_django_browser.py`` runs in Chromium: those asking for
    the ``chromium`` fixture, times their parametrisations."""
    module = importlib.import_module("tests.contrib.test_django_browser")
    count = 0
    for name, function in vars(module).items():
        if name.startswith("test_") and "chromium" in inspect.signature(function).parameters:
            variants = 1
            for mark in getattr(function, "pytestmark", []):
                if mark.name == "parametrize":
                    variants *= len(mark.args[1])
            count += variants
    return count


def test_the_pages_count_the_browser_tests_right() -> None:
    """README, testing and Django pages each say how many browser tests there are, correctly."""
    words = ["zero", "one", "two", "three", "four", "five", "six"]
    actual = browser_tests()
    assert actual >= 1
    counts = {
        name: [
            words.index(match.group(1).lower())
            for match in BROWSER_COUNT.finditer(" ".join((REPO_ROOT / name).read_text().split()))
        ]
        for name in BROWSER_PAGES
    }
    wrong = {name: found for name, found in counts.items() if not found or set(found) != {actual}}
    assert not wrong, (
        f"tests/contrib/test_django_browser.py has {actual} browser tests; pages say {wrong}"
    )


def test_the_pages_say_one_thing_about_a_missing_chromium() -> None:
    """Without Chromium the browser tests are skipped, and fail only with ``CI`` set: a sentence
    that has them fail without Chromium must say it is under CI."""
    contradicting = []
    for name in BROWSER_PAGES:
        text = " ".join((REPO_ROOT / name).read_text().split())
        for sentence in re.split(r"(?<=[.;])\s+", text):
            if (
                re.search(r"without chromium|chromium is missing|missing chromium", sentence, re.I)
                and re.search(r"\bfail", sentence)
                and "CI" not in sentence
            ):
                contradicting.append(f"{name}: {sentence!r}")
    assert not contradicting, f"a missing Chromium fails only under CI: {contradicting}"


#: A rule ID as cited in code, tests and docs (S1, R7, R8a, D8 …); not inside ``%C3%A9``-like
#: escapes or longer words (``W47`` is an ISO week).
RULE_ID = re.compile(r"(?<![%\w-])([SRACDBIOPWV][1-9]a?)\b")


def test_every_rule_id_cited_is_explained_in_the_rules_index() -> None:
    """docs/rules-index.md says what each cited ID promises, so no reader needs the tracker."""
    index = (DOCS / "rules-index.md").read_text()
    explained = set(re.findall(r"^\* \*\*([A-Z][1-9]a?)\*\* — ", index, re.M))  # one entry each
    cited: dict[str, str] = {}
    for folder, pattern in (("celery_durable", "*.py"), ("tests", "*.py"), ("docs", "*.md")):
        for path in sorted((REPO_ROOT / folder).rglob(pattern)):
            for match in RULE_ID.finditer(path.read_text(errors="replace")):
                cited.setdefault(match.group(1), str(path.relative_to(REPO_ROOT)))
    missing = {rule: where for rule, where in cited.items() if rule not in explained}
    assert not missing, f"rule IDs cited but not in docs/rules-index.md: {missing}"
    assert {"S1", "R7", "A6", "D8", "B2", "W6", "V1"} <= explained


@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore:Task name .* is already registered")  # pages reuse names
@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_code_block_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = blocks_of(page)
    env = docs_env(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # Each page is a project of its own: tasks another page declared with Celery's default
    # shared=True must not be registered into this page's apps when they are finalized.
    monkeypatch.setattr(celery._state, "_on_app_finalizers", set(celery._state._on_app_finalizers))
    modules_before = set(sys.modules)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    try:
        for i, block in enumerate(blocks):
            if block.action == "output":
                follows = blocks[i - 1] if i else None
                if follows is None or follows.language != "python" or follows.action != "run":
                    pytest.fail(f"{block.where}: an output block must follow a python block")
                continue
            shown = blocks[i + 1] if i + 1 < len(blocks) else None
            check_block(block, namespace, tmp_path, env, shown if _is_output(shown) else None)
    finally:
        close_durables(namespace)
        for name in set(sys.modules) - modules_before:
            module_file = getattr(sys.modules[name], "__file__", None) or ""
            if module_file.startswith(str(tmp_path)):
                close_durables(vars(sys.modules[name]))
                del sys.modules[name]


def _is_output(block: Block | None) -> bool:
    return block is not None and block.action == "output"


def check_block(
    block: Block,
    namespace: dict[str, object],
    tmp: Path,
    env: dict[str, str],
    output: Block | None = None,
) -> None:
    if block.action == "skip":
        excerpt = re.match(r"excerpt of (\S+)", block.argument)
        if excerpt:  # the code shown must be the code that runs
            source = (REPO_ROOT / excerpt.group(1)).read_text()
            assert block.text in source, f"{block.where}: not in {excerpt.group(1)} any more"
        return
    if block.action == "file":
        target = tmp / block.argument
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text)
        return
    if (block.page, block.language) in RUN_ELSEWHERE:
        return
    language = block.language
    if language == "python":
        run_python(block, namespace, output)
    elif language == "pycon":
        run_doctest(block, namespace)
    elif language == "console":
        run_console(block, tmp, env)
    elif language in SHELLS:
        result = bash("set -e\n" + block.text, tmp, env)
        assert result.returncode == 0, f"{block.where}\n{result.stdout}{result.stderr}"
    elif language in PARSED:
        parse(block)
    else:
        pytest.fail(
            f"{block.where}: a {language or 'untagged'!s} block is neither run nor checked: "
            "give it a language (python, pycon, console, bash, json, toml, ini) or mark it "
            "'<!-- docs-test: skip REASON -->'"
        )


def run_python(block: Block, namespace: dict[str, object], output: Block | None) -> None:
    """Execute a python block; what it prints must be the page's output block below it."""
    code = compile(block.text, block.where, "exec")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code, namespace)
    got = printed.getvalue()
    if output is None:
        assert not got, (
            f"{block.where}: the block prints {got!r}, but the page shows no output: add a "
            "text block marked '<!-- docs-test: output -->' below it with what it prints"
        )
    elif not doctest.OutputChecker().check_output(output.text, got, _FLAGS):
        pytest.fail(
            f"{block.where}: prints\n{got}but the page shows ({output.where})\n{output.text}"
        )


def run_doctest(block: Block, namespace: dict[str, object]) -> None:
    test = doctest.DocTestParser().get_doctest(
        block.text, namespace, block.where, block.page, block.line
    )
    runner = doctest.DocTestRunner(optionflags=_FLAGS, verbose=False)
    report: list[str] = []
    runner.run(test, out=report.append, clear_globs=False)
    assert runner.failures == 0, "".join(report)


def run_console(block: Block, tmp: Path, env: dict[str, str]) -> None:
    checker = doctest.OutputChecker()
    examples = console_examples(block.text)
    assert examples, f"{block.where}: a console block without '$ ' commands"
    for command, want in examples:
        result = bash(command, tmp, env)
        got = result.stdout + result.stderr
        failed = want.startswith("Error:")
        assert (result.returncode != 0) == failed, (
            f"{block.where}: $ {command}\nexit {result.returncode}\n{got}"
        )
        if want and not checker.check_output(want, got, _FLAGS):
            pytest.fail(f"{block.where}: $ {command}\nexpected:\n{want}got:\n{got}")


def console_examples(text: str) -> list[tuple[str, str]]:
    """``(command, expected output)`` pairs; a command may go on over ``\\`` line ends."""
    found: list[tuple[str, str]] = []
    continued = False
    for line in text.splitlines():
        if continued and found:
            command, want = found[-1]
            found[-1] = (command + "\n" + line, want)
        elif line.startswith("$ "):
            found.append((line[2:], ""))
        elif found:
            command, want = found[-1]
            found[-1] = (command, want + line + "\n")
        continued = line.endswith("\\") and (continued or line.startswith("$ "))
    return found


def parse(block: Block) -> None:
    text = block.text
    try:
        if block.language == "json":
            json.loads(text)
        elif block.language == "toml" and tomllib is not None:
            tomllib.loads(text)
        elif block.language == "ini":
            configparser.ConfigParser().read_string(text)
        elif block.language == "yaml":
            yaml = pytest.importorskip("yaml")
            yaml.safe_load(text)
    except Exception as exc:
        pytest.fail(f"{block.where}: {block.language} does not parse: {exc}")


def docs_env(tmp: Path) -> dict[str, str]:
    """Embedded defaults, plus ``python`` and ``celery`` commands that are this interpreter's.

    They are wrapper scripts that exec ``sys.executable`` by its own path, not symlinks to it: a
    virtualenv's interpreter finds the virtualenv's packages from where it lies (``pyvenv.cfg``
    next to its folder), so a link to it from elsewhere would run without them."""
    bin_dir = tmp / ".bin"
    bin_dir.mkdir()
    commands = {"python": "", "python3": "", "celery": " -m celery"}
    for name, arguments in commands.items():
        wrapper = bin_dir / name
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}"{arguments} "$@"\n')
        wrapper.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join([str(tmp), str(REPO_ROOT)])
    return {
        "PATH": path,
        "PYTHONPATH": pythonpath,
        "CELERY_DURABLE_URL": f"sqlite:///{tmp / 'journal.db'}",
        "CELERY_BROKER_URL": "memory://",
        "EXAMPLE_DATA_DIR": str(tmp / "example-data"),
    }


def test_python_and_celery_in_commands_are_this_interpreter(tmp_path: Path) -> None:
    """Also inside a virtualenv: the same prefix, so the same installed packages."""
    env = docs_env(tmp_path)
    script = 'python -c "import sys; print(sys.prefix)"; celery --version'
    result = bash(script, tmp_path, env)
    assert result.returncode == 0, result.stderr
    prefix, version = result.stdout.splitlines()
    import celery

    assert prefix == sys.prefix
    assert version.startswith(celery.__version__)


def bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # memory:// is in-process only: commands get the broker their app configures.
    full = {k: v for k, v in {**os.environ, **env}.items() if k != "CELERY_BROKER_URL"}
    return subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


def close_durables(namespace: dict[str, object]) -> None:
    from celery_durable import Durable

    for value in list(namespace.values()):
        if isinstance(value, Durable):
            value.close()


def test_markers_are_checked(tmp_path: Path) -> None:
    """The parser itself: a skip needs a reason, markers must be known, fences must close."""
    page = tmp_path / "page.md"
    page.write_text(
        textwrap.dedent(
            """\
            <!-- docs-test: skip long-running -->

            ```console
            $ celery -A proj worker
            ```

            <!-- docs-test: file proj.py -->
            ```python
            x = 1
            ```

            ```json
            {"a": 1}
            ```
            """
        )
    )
    blocks = blocks_of(page)
    assert [(b.language, b.action, b.argument) for b in blocks] == [
        ("console", "skip", "long-running"),
        ("python", "file", "proj.py"),
        ("json", "run", ""),
    ]
    for bad in ("<!-- docs-test: skip -->", "<!-- docs-test: maybe x -->", "<!-- docs-test -->"):
        page.write_text(f"{bad}\n```python\nx = 1\n```\n")
        with pytest.raises(pytest.fail.Exception):
            blocks_of(page)
    assert console_examples("$ a \\\n  b\nout\n$ c\n") == [("a \\\n  b", "out\n"), ("c", "")]


def test_what_a_python_block_prints_is_checked(tmp_path: Path) -> None:
    """A snippet that prints something else than the page shows fails (docs/flask.md once showed
    a greeting that its scheduled task could never print); one that prints unshown output too."""
    page = tmp_path / "page.md"
    page.write_text(
        textwrap.dedent(
            """\
            ```python
            def greet(name):
                return f"hello {name}"
            print(greet({"run": "ScheduledRun(...)"}))
            ```

            <!-- docs-test: output -->
            ```text
            hello Ada
            ```

            ```python
            print(greet("Ada"))
            ```
            """
        )
    )
    code, output, unshown = blocks_of(page)
    assert output.action == "output" and not _is_output(unshown)
    namespace: dict[str, object] = {}
    with pytest.raises(pytest.fail.Exception, match="but the page shows"):
        run_python(code, namespace, output)
    with pytest.raises(AssertionError, match="shows no output"):
        run_python(unshown, namespace, None)
    output.text = "hello {...}\n"
    run_python(code, namespace, output)  # ELLIPSIS, as in pycon blocks
