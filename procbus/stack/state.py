"""STATE_DIR/stack.json: where a running `procbus dev` tells every other command what it serves.

A stack is live while its `procbus dev` holds the lock on STATE_DIR/dev.lock; the kernel drops
the lock when that process dies, even by SIGKILL, so a stale stack.json is never taken for live.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from datetime import datetime
from pathlib import Path
from typing import IO

from pydantic import BaseModel

from procbus.errors import StackError

STACK_FILE = "stack.json"
LOCK_FILE = "dev.lock"


class StackInfo(BaseModel):
    pid: int
    temporal_address: str
    namespace: str
    ui_url: str | None
    database_url: str
    task_queue: str
    postgres_pid: int
    temporal_pid: int
    started_at: datetime
    metrics_url: str | None = None


class StackLock:
    """An exclusive hold on a state folder: one embedded stack per folder."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_file = self.path.open("a+")
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.seek(0)
            holder = lock_file.read().strip() or "?"
            lock_file.close()
            raise StackError(
                f"an embedded stack (pid {holder}) already runs on {self.path.parent}: use it, "
                "or stop it first"
            ) from None
        lock_file.seek(0)
        lock_file.truncate()
        lock_file.write(str(os.getpid()))
        lock_file.flush()
        self._file = lock_file

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None


def is_held(state_dir: Path) -> bool:
    path = state_dir / LOCK_FILE
    if not path.exists():
        return False
    with path.open("a+") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock_file, fcntl.LOCK_UN)
        return False


def write_stack(state_dir: Path, info: StackInfo) -> None:
    path = state_dir / STACK_FILE
    temporary = path.with_suffix(".tmp")
    temporary.unlink(missing_ok=True)
    # Its database URL carries the password: this user's alone, as postgres.password is.
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(info.model_dump_json(indent=2))
    temporary.replace(path)  # readers never see half a file


def remove_stack(state_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (state_dir / STACK_FILE).unlink()


def read_live_stack(state_dir: Path) -> StackInfo | None:
    """The stack running on `state_dir`, or None if none runs (a left-over file is ignored)."""
    path = state_dir / STACK_FILE
    if not path.exists() or not is_held(state_dir):
        return None
    try:
        return StackInfo.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None
