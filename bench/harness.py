"""What every benchmark shares: the list of them, its size, its services and its last line.

BENCH_SMOKE=1: a smoke run; each benchmark does the least work that still runs every path it
measures and prints the same keys (tests/integration/test_benchmarks.py runs them so; its figures
mean nothing). A BENCH_* size set in the environment wins over both sizes.
BENCH_DATABASE_URL (a PostgreSQL server, as its superuser) and BENCH_TEMPORAL_ADDRESS: servers
to use instead of an embedded stack of its own; the run gets a database of its own on that
server, dropped after.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from procbus.db import connect
from procbus.stack.ephemeral import ephemeral_services, service_dir

SMOKE = os.environ.get("BENCH_SMOKE") == "1"
LIST = Path(__file__).with_name("benchmarks.txt")
ROOT_ONLY = "root"  # the list's mark of a benchmark that builds hosts in network namespaces

Size = TypeVar("Size", int, float)


def benchmarks(*, root_only: bool) -> list[str]:
    """The benchmarks of bench/benchmarks.txt (the Makefile reads it too): the cluster ones
    (run as root only), or the others."""
    names = []
    for line in LIST.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words and words[1:] not in ([], [ROOT_ONLY]):
            raise ValueError(f"{LIST.name}: {line!r} is not NAME or NAME {ROOT_ONLY}")
        if words and (words[1:] == [ROOT_ONLY]) == root_only:
            names.append(words[0])
    return names


def sized(full: Size, smoke: Size, env: str | None = None) -> Size:
    """`env`'s value if set, else the full run's size, or the smoke run's least."""
    value = os.environ.get(env) if env else None
    if value is not None:
        return type(full)(value)
    return smoke if SMOKE else full


@dataclass
class Services:
    database_url: str  # a database of this run's own
    temporal_address: str
    root: Path  # a folder of this run's own, removed after


@contextlib.asynccontextmanager
async def bench_services() -> AsyncIterator[Services]:
    """The servers handed in (BENCH_DATABASE_URL, BENCH_TEMPORAL_ADDRESS), else an embedded
    stack of the run's own."""
    server = os.environ.get("BENCH_DATABASE_URL")
    address = os.environ.get("BENCH_TEMPORAL_ADDRESS")
    if not server and not address:
        with ephemeral_services("procbus-bench-") as started:
            yield Services(started.postgres.url(), started.temporal.address, started.root)
        return
    if not server or not address:
        raise SystemExit("set both BENCH_DATABASE_URL and BENCH_TEMPORAL_ADDRESS, or neither")
    name = f"bench_{uuid.uuid4().hex[:12]}"
    admin = await connect(server)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    root = service_dir("procbus-bench-")
    try:
        yield Services(server.rsplit("/", 1)[0] + "/" + name, address, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        admin = await connect(server)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


def emit(figures: Mapping[str, object], keys: Iterable[str]) -> None:
    """Print the figures as the last line (JSON); exit with 1 if they are not the `keys` the
    benchmark declares (its FIGURES, which the smoke test holds its runs to)."""
    print(json.dumps(figures), flush=True)
    expected = list(keys)
    missing = [key for key in expected if key not in figures]
    extra = [key for key in figures if key not in expected]
    if missing or extra:
        print(
            f"{sys.argv[0]}: its figures are not the keys it declares: missing {missing}, "
            f"not declared {extra}",
            file=sys.stderr,
            flush=True,
        )
        os._exit(1)
