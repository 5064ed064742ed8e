"""Private PostgreSQL and Redis servers on free ports, for tests that restart a server.

The shared test servers are never restarted (other tests use them at the same time);
these are started from the installed binaries in a temporary directory and removed after.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

PG_BIN_ROOT = Path("/usr/lib/postgresql")
START_DEADLINE_S = 30


def free_port() -> int:
    """A local TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _wait_for_port(port: int, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server on port {port} exited with {process.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"no server came up on port {port}")


class PrivateRedis:
    """A redis-server with an always-fsynced append-only file, so a restart keeps data."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed: cannot start a private Redis")
        self.binary = binary
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="nestegg-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--dir", str(self.directory), "--save", "", "--appendonly", "yes"]
        command += ["--appendfsync", "always"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        _wait_for_port(self.port, self.process)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def remove(self) -> None:
        """Stop the server and delete its files."""
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)


class PrivatePostgres:
    """A PostgreSQL cluster made by initdb, run as the postgres user, trust auth; with a
    ``password``, TCP connections need it (scram-sha-256) and the URL does not hold it."""

    def __init__(self, password: str | None = None) -> None:
        versions = sorted(PG_BIN_ROOT.glob("*/bin/initdb")) if PG_BIN_ROOT.exists() else []
        if not versions or os.geteuid() != 0 or shutil.which("runuser") is None:
            pytest.skip("cannot start a private PostgreSQL (needs root, runuser and initdb)")
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("no postgres user: cannot start a private PostgreSQL")
        self.bin = versions[-1].parent
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="nestegg-pg-"))
        os.chown(self.directory, account.pw_uid, account.pw_gid)
        self.data = self.directory / "data"
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        auth = ["-A", "trust"]
        if password is not None:
            pwfile = self.directory / "pwfile"
            pwfile.write_text(password)
            os.chown(pwfile, account.pw_uid, account.pw_gid)
            auth = ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        self._as_postgres("initdb", "-D", str(self.data), *auth, "-U", "postgres", "--no-sync")

    def _as_postgres(self, tool: str, *args: str) -> None:
        command = ["runuser", "-u", "postgres", "--", str(self.bin / tool), *args]
        subprocess.run(command, check=True, capture_output=True, timeout=START_DEADLINE_S)

    def start(self) -> None:
        """Start the cluster and wait until it accepts connections."""
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1"
        log = str(self.directory / "log")
        self._as_postgres("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")
        _wait_for_port(self.port)

    def kill(self) -> None:
        """Stop the cluster at once (immediate mode: no clean shutdown, as a crash)."""
        self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def _signal_all(self, signum: int) -> None:
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True)
        for pid in [postmaster, *map(int, children.stdout.split())]:
            os.kill(pid, signum)

    def pause(self) -> None:
        """SIGSTOP the server and its backends: it still accepts TCP but never answers."""
        self._signal_all(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT what pause() stopped."""
        self._signal_all(signal.SIGCONT)

    def remove(self) -> None:
        """Stop the cluster and delete its files."""
        stop = [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]
        command = ["runuser", "-u", "postgres", "--", *stop]
        subprocess.run(command, capture_output=True, timeout=START_DEADLINE_S)
        shutil.rmtree(self.directory, ignore_errors=True)
