"""Child processes of the embedded stack: started on loopback, ended with their parent."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import pwd
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import psutil

from procbus.errors import StackError

LOOPBACK = "127.0.0.1"
# Ports handed to servers are drawn from here up to the kernel's ephemeral range.
FIXED_PORTS_FROM = 20000
# Each port handed out, with the lock that reserves it from every other procbus process on this
# machine until this one ends: two processes drawing at random would otherwise hand one port to
# two servers (a test's `procbus dev` found its metrics port taken so).
_handed_out: dict[int, IO[str]] = {}
_RESERVATIONS_KEPT = 200
_PR_SET_PDEATHSIG = 1


def free_port(host: str = LOOPBACK) -> int:
    """Return a port free now, for a server started seconds later.

    Below the kernel's ephemeral range when it can be, as a port from bind(0) may meanwhile
    become some outgoing connection's source port (a test's metrics port was taken so between
    its choice and its server's start).
    """
    below = _ephemeral_ports_from()
    for _ in range(100):
        port = random.randrange(FIXED_PORTS_FROM, below) if below > FIXED_PORTS_FROM else 0
        if port in _handed_out:
            continue  # free again, but handed to a server that may not have started yet
        reservation = _reserve(port) if port else None
        if port and reservation is None:
            continue  # another process handed it out
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                if reservation is not None:
                    reservation.close()
                continue
            port = int(probe.getsockname()[1])
        if reservation is not None:
            _handed_out[port] = reservation
            if len(_handed_out) > _RESERVATIONS_KEPT:  # its server has long bound it
                _handed_out.pop(next(iter(_handed_out))).close()
        return port
    raise StackError(f"no free port on {host} in {FIXED_PORTS_FROM}-{below - 1}")


def _reserve(port: int) -> IO[str] | None:
    """The open lock file reserving `port` for this process, or None when another holds it;
    the lock goes with the process however it ends."""
    folder = Path(tempfile.gettempdir()) / f"procbus-ports-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    handle = (folder / str(port)).open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def _ephemeral_ports_from() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0  # unknown: let the kernel choose


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def require_free_port(port: int, setting: str) -> None:
    if not port_is_free(port):
        raise StackError(
            f"port {port} on {LOOPBACK} is in use by another process: stop it, or set {setting} "
            "to another port"
        )


def _die_with_parent(death_signal: int) -> Callable[[], None]:
    """A preexec hook: the child gets `death_signal` when procbus dies, even by SIGKILL."""

    def hook() -> None:
        with contextlib.suppress(OSError):
            os.setpgrp()  # Ctrl-C reaches procbus only; it stops the children in order
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, death_signal)

    return hook


def _as_user(user: str) -> list[str]:
    """The argv prefix that runs a command as `user`, with its group and no other groups."""
    entry = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]


class ManagedProcess:
    """One server process of the stack, its output in a log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_file: Path,
        *,
        stop_signal: int = signal.SIGTERM,
        user: str | None = None,
        env: dict[str, str] | None = None,
        netns: str | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.netns = netns
        self.log_file = log_file
        self.stop_signal = stop_signal
        self.user = user
        self.env = env
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None, f"{self.name} was not started"
        return self._process.pid

    def start(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        argv, user = self.argv, self.user
        if self.netns is not None:
            # Entering a network namespace takes root: enter it first, then become the user.
            as_user = [] if user is None else _as_user(user)
            argv, user = ["ip", "netns", "exec", self.netns, *as_user, *argv], None
        with self.log_file.open("ab") as log:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Drop root's groups too: a root-group folder on the path would otherwise deny.
                user=user,
                group=user,
                extra_groups=[] if user else None,
                env=self.env,
                preexec_fn=_die_with_parent(self.stop_signal),
            )

    def exited(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def fail_if_exited(self) -> None:
        code = self.exited()
        if code is not None:
            raise StackError(
                f"{self.name} exited with code {code} while starting; last lines of "
                f"{self.log_file}:\n{self.log_tail()}"
            )

    def stop(self, timeout: float = 15.0) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.send_signal(self.stop_signal)
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def wait_for_port(process: ManagedProcess, port: int, timeout: float, host: str = LOOPBACK) -> None:
    """Block until `process` accepts connections on `host`:`port`, or fail with its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        process.fail_if_exited()
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
            return
        time.sleep(0.1)
    process.stop()
    raise StackError(
        f"{process.name} did not listen on {host}:{port} within {timeout:.0f}s; last lines of "
        f"{process.log_file}:\n{process.log_tail()}"
    )


def end_orphans(marker: str, executable_name: str, stop_signal: int = signal.SIGTERM) -> list[int]:
    """End processes named `executable_name` whose command line holds `marker` (a state folder):
    servers left by a procbus that was killed before it could stop them."""
    ended = []
    for process in psutil.process_iter(["name", "cmdline"]):
        try:
            cmdline = process.info["cmdline"] or []
            if process.info["name"] == executable_name and any(marker in arg for arg in cmdline):
                process.send_signal(stop_signal)
                ended.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    _, alive = psutil.wait_procs(ended, timeout=10)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    return [process.pid for process in ended]
