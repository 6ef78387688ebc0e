"""Throw-away services for tests and benchmarks: in-memory Temporal, fsync-off PostgreSQL.

Both on loopback and free ports, in a temporary folder removed afterwards.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from procbus.stack.postgres import EmbeddedPostgres
from procbus.stack.processes import free_port
from procbus.stack.temporal_server import DevTemporalServer


@dataclass
class EphemeralServices:
    temporal: DevTemporalServer
    postgres: EmbeddedPostgres
    root: Path


def service_dir(prefix: str) -> Path:
    """Return a folder the embedded PostgreSQL user can enter even when run as root."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o755)
    return folder


@contextlib.contextmanager
def ephemeral_services(prefix: str = "procbus-") -> Iterator[EphemeralServices]:
    root = service_dir(prefix)
    # Speed over durability: nothing here outlives the run.
    temporal = DevTemporalServer(free_port(), free_port(), root / "temporal.log", ui=False)
    postgres = EmbeddedPostgres(
        root / "postgres", free_port(), root / "postgres.log", ephemeral=True
    )
    try:
        postgres.prepare()
        temporal.prepare()
        postgres.launch()
        temporal.launch()
        postgres.wait_ready()
        temporal.wait_ready()
        yield EphemeralServices(temporal, postgres, root)
    finally:
        for server in (temporal, postgres):
            try:
                server.stop()
            except Exception as error:  # report, but still stop the other
                print(f"could not stop {type(server).__name__}: {error}")
        shutil.rmtree(root, ignore_errors=True)
