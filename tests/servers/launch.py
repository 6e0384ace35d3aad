"""Real PostgreSQL and Redis servers on loopback, from the distribution's packages.

Each server runs in a fresh temporary directory on a free TCP port of 127.0.0.1
(PostgreSQL's unix socket goes in the same directory), with durability turned off
because nothing here needs to survive a crash. Starting one raises
``ServerUnavailable`` with the reason when the binaries are missing or the server
does not come up; callers turn that into a skip that says so. Stopping a server
removes its directory.

Readiness is an event, not a guess: each server's own "ready to accept
connections" line is read from its output. Each server is a child process that the
kernel stops if the test process dies first (``setpriv --pdeathsig``), so a run killed
by a timeout leaves no server behind.

PostgreSQL refuses to run as root (CI runs as root): then the cluster belongs to
the ``postgres`` account that Debian's package creates, and its processes run as
that user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

START_TIMEOUT = 60.0


class ServerUnavailable(RuntimeError):
    """The server could not be started here; the message says why."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------ PostgreSQL
@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    user: str
    database: str
    socket_dir: str

    @property
    def dsn(self) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.database}"

    @property
    def sqlalchemy_url(self) -> str:
        return f"postgresql+asyncpg://{self.user}@{self.host}:{self.port}/{self.database}"


def _pg_bin() -> str:
    """The directory holding initdb and pg_ctl: PATH first, then Debian's layout."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return os.path.dirname(os.path.realpath(found))
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(p.split("/")[-3]) if p.split("/")[-3].isdigit() else 0,
    )
    if candidates:
        return os.path.dirname(candidates[-1])
    raise ServerUnavailable(
        "PostgreSQL is not installed (no pg_ctl on PATH or under /usr/lib/postgresql): "
        "apt-get install postgresql"
    )


def _run_as() -> tuple[str | None, int | None, int | None]:
    """(user name, uid, gid) to run PostgreSQL as: None for the current user."""
    if os.geteuid() != 0:
        return None, None, None
    try:
        pw = pwd.getpwnam("postgres")
    except KeyError:
        raise ServerUnavailable(
            "running as root and there is no 'postgres' account for PostgreSQL to run as"
        ) from None
    return pw.pw_name, pw.pw_uid, pw.pw_gid


@contextlib.contextmanager
def postgres(database: str = "loopbridge") -> Iterator[Postgres]:
    """A PostgreSQL cluster in a temporary directory, stopped and removed on exit."""
    bindir = _pg_bin()
    user, uid, gid = _run_as()
    root = tempfile.mkdtemp(prefix="loopbridge-pg-")
    data, sockets = os.path.join(root, "data"), os.path.join(root, "sock")
    os.mkdir(sockets)
    if uid is not None:
        os.chmod(root, 0o755)  # the server's account must reach its directory
        for path in (root, sockets):
            os.chown(path, uid, gid)  # type: ignore[arg-type]
    proc: subprocess.Popen[bytes] | None = None
    try:
        init = subprocess.run(
            [f"{bindir}/initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8"]
            + ["--no-sync", "--no-instructions"],
            user=user,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
        )
        if init.returncode != 0:
            raise ServerUnavailable(f"initdb failed: {init.stderr.strip()[-500:]}")
        output = b""
        for _ in range(3):  # the free port may be taken before the server binds it
            port = free_port()
            proc = _spawn(
                [f"{bindir}/postgres", "-D", data, "-F", "-p", str(port), "-k", sockets]
                + ["-c", "listen_addresses=127.0.0.1", "-c", "lc_messages=C"]
                + ["-c", "max_connections=200", "-c", "shared_buffers=16MB"]
                + ["-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
                user,
                signal.SIGINT,  # PostgreSQL's fast shutdown
            )
            found = _await_line(proc, b"ready to accept connections")
            if found is None:
                break
            output = found
            _stop(proc, signal.SIGINT)
            proc = None
        if proc is None:
            raise ServerUnavailable(
                f"PostgreSQL did not start: {output[-800:].decode(errors='replace')}"
            )
        _keep_reading(proc)
        create = subprocess.run(
            [f"{bindir}/createdb", "-h", sockets, "-p", str(port), "-U", "postgres", database],
            user=user,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT,
        )
        if create.returncode != 0:
            raise ServerUnavailable(f"createdb failed: {create.stderr.strip()}")
        yield Postgres("127.0.0.1", port, "postgres", database, sockets)
    finally:
        if proc is not None:
            _stop(proc, signal.SIGINT)
        shutil.rmtree(root, ignore_errors=True)


# ----------------------------------------------------------------------- Redis
@dataclass(frozen=True)
class Redis:
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"


@contextlib.contextmanager
def redis() -> Iterator[Redis]:
    """A redis-server on a free loopback port, without persistence, stopped on exit."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise ServerUnavailable("redis-server is not installed: apt-get install redis-server")
    root = tempfile.mkdtemp(prefix="loopbridge-redis-")
    proc: subprocess.Popen[bytes] | None = None
    try:
        for _ in range(3):  # the free port may be taken before the server binds it
            port = free_port()
            proc = _spawn(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", root]
                + ["--save", "", "--appendonly", "no", "--daemonize", "no"]
                + ["--protected-mode", "no", "--maxclients", "1000"],
                None,
                signal.SIGTERM,
            )
            output = _await_line(proc, b"Ready to accept connections")
            if output is None:
                break
            _stop(proc, signal.SIGTERM)
            proc = None
        if proc is None:
            raise ServerUnavailable(f"redis-server did not start: {output!r}")
        _keep_reading(proc)
        yield Redis("127.0.0.1", port)
    finally:
        if proc is not None:
            _stop(proc, signal.SIGTERM)
        shutil.rmtree(root, ignore_errors=True)


def _await_line(proc: subprocess.Popen[bytes], marker: bytes) -> bytes | None:
    """None once ``marker`` appears in the output; else what it printed before ending."""
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + START_TIMEOUT
    fd = proc.stdout.fileno()
    while marker not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            return seen + b" (timed out)"
        ready, _, _ = select.select([fd], [], [], left)
        chunk = os.read(fd, 65536) if ready else b""
        if ready and not chunk:  # end of output: it exited
            proc.wait()
            return seen
        seen += chunk
    return None


def _spawn(argv: list[str], user: str | None, on_parent_death: int) -> subprocess.Popen[bytes]:
    """The server as a child process (its log on a pipe) that the kernel signals with
    ``on_parent_death`` if this process dies first, so a killed test run leaves no
    server behind. util-linux's ``setpriv`` sets that up and execs the server (no
    Python runs in the forked child); without it, the server just runs."""
    setpriv = shutil.which("setpriv")
    if setpriv is not None:
        name = signal.Signals(on_parent_death).name.removeprefix("SIG")
        argv = [setpriv, f"--pdeathsig={name}", "--", *argv]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, user=user)


def _stop(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Ask the server to shut down; kill it if it has not within the bound."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _keep_reading(proc: subprocess.Popen[bytes]) -> None:
    """Read the server's log until it ends: a full pipe would stall the server."""

    def drain() -> None:
        assert proc.stdout is not None
        while proc.stdout.read(65536):
            pass

    threading.Thread(target=drain, name="server-log", daemon=True).start()
