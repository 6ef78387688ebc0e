"""Session services and per-test isolation (fresh task queue, fresh database)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from procbus.db import create_pool
from procbus.errors import SparkUnavailable
from procbus.stack.ephemeral import EphemeralServices, ephemeral_services
from procbus.temporal import connect_client
from procbus.worker import build_worker
from procbus.worker.main import WORKFLOWS
from tests.services import (
    TEST_AUTH,
    create_template,
    create_test_database,
    drop_test_database,
)
from tests.spark_classes import (
    BUILD_TIMEOUT_SECONDS,
    archive_folder,
    archive_path,
    jvm_options,
    start_building,
    stop_building,
)

# pytest-xdist's workers are given COLUMNS=80 (execnet); the CLI would wrap its output there
# and nowhere else. What the tests read is the CLI's output when piped: no terminal width.
for _terminal_size in ("COLUMNS", "LINES"):
    os.environ.pop(_terminal_size, None)

# A failure whose traceback cannot be rendered still reports as that test's (see the module).
pytest_plugins = ["tests.report_fallback"]

_exit_status: list[int] = []
# Seconds each test group took in a full run on 2 cores (`--write-group-seconds` rewrites it).
GROUP_SECONDS = Path(__file__).with_name("group_seconds.json")
# The caller's own JVM options, kept under the run's (tests/spark_classes.py).
_CALLER_JVM_OPTIONS = os.environ.get("JAVA_TOOL_OPTIONS", "")
_spark_archive: list[Path] = []
_archive_build: list[subprocess.Popen[bytes]] = []
# The process building the archive, for xdist's workers (they inherit the environment).
_ARCHIVE_BUILDER = "PROCBUS_TEST_SPARK_CLASSES_BUILDER"
_waited_for_archive: list[bool] = []


def pytest_configure(config: pytest.Config) -> None:
    """The Spark class archive in the user's cache (tests/spark_classes.py): the first process
    (xdist's controller, or the only one) builds it in the background if missing; every
    process's JVMs map it once built."""
    if config.getoption("dist", "no") == "loadgroup" and pytest.version_tuple[:2] >= (9, 2):
        # Its test IDs ignore the groups xdist writes into them: the tests of a file would
        # spread over the processes, each starting the file's broker, cluster or stack.
        raise pytest.UsageError(
            f"pytest {pytest.__version__} breaks --dist loadgroup (pytest-dev/pytest-xdist#1386):"
            " `make install` installs the pytest that pyproject.toml names"
        )
    # xdist would hand out the groups with the most tests first; ours go longest first.
    config.option.loadscopereorder = False
    cache = getattr(config, "cache", None)  # none with -p no:cacheprovider
    try:
        folder = archive_folder(cache.mkdir("spark-classes") if cache is not None else None)
        if folder is not None:
            _spark_archive.append(archive_path(folder))
    except (OSError, SparkUnavailable) as error:  # no java: the Spark tests say so
        print(f"no Spark class archive: {error}", file=sys.stderr)
    if _spark_archive and not hasattr(config, "workerinput"):
        building = start_building(_spark_archive[0])
        if building is not None:
            _archive_build.append(building)
            os.environ[_ARCHIVE_BUILDER] = str(building.pid)
    _set_jvm_options()


def _set_jvm_options() -> None:
    os.environ["JAVA_TOOL_OPTIONS"] = jvm_options(
        _spark_archive[0] if _spark_archive else None, _CALLER_JVM_OPTIONS
    )


@pytest.fixture(autouse=True)
def _run_jvm_options(request: pytest.FixtureRequest) -> None:
    """Every JVM a test starts, in this process or in its subprocesses, with the run's options.
    A test that starts one (marked spark, or using the shared session) waits for an archive
    still being built (a checkout's first run): a JVM costs about twice the CPU without it,
    beside the build. The others run meanwhile."""
    if request.node.get_closest_marker("spark") or "spark" in request.fixturenames:
        _wait_for_archive()
    _set_jvm_options()


def _wait_for_archive() -> None:
    if _waited_for_archive or not _spark_archive:
        return
    _waited_for_archive.append(True)
    builder = int(os.environ.get(_ARCHIVE_BUILDER) or 0)
    deadline = time.monotonic() + BUILD_TIMEOUT_SECONDS
    while builder and not _spark_archive[0].is_file() and time.monotonic() < deadline:
        try:
            if psutil.Process(builder).status() == psutil.STATUS_ZOMBIE:
                return  # it ended without an archive: the JVMs go without
        except psutil.NoSuchProcess:
            return
        time.sleep(0.2)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--write-group-seconds",
        action="store_true",
        help=f"write how long each test group took to {GROUP_SECONDS.name}"
        " (run with -n 5 --dist loadgroup; it orders later runs)",
    )


@pytest.hookimpl(wrapper=True)  # markers first: xdist's own hook reads them
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    """For `--dist loadgroup`: a test file runs whole in one xdist worker (its module-scoped
    stack, broker or cluster starts once), and every test of the in-process Spark session in
    one worker, so one Spark JVM starts instead of one a worker. The longest groups go first:
    xdist hands groups out in collection order, and a long one handed out last would run on
    alone at the end while the other processes stand idle."""
    group_of: dict[str, str] = {}
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        group = "spark-session" if "spark" in fixtures else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
        group_of[item.nodeid] = group
    seconds = expected_group_seconds()
    # A stable sort: each group's tests stay together, in file order.
    items.sort(key=lambda item: -seconds.get(group_of[item.nodeid], 0.0))
    yield  # xdist's own hook writes each test's group into its ID, which its scheduler reads


def expected_group_seconds() -> dict[str, float]:
    try:
        return {str(group): float(s) for group, s in json.loads(GROUP_SECONDS.read_text()).items()}
    except (OSError, ValueError, AttributeError) as error:  # only the order suffers
        print(f"no test group durations ({error}): groups run in file order", file=sys.stderr)
        return {}


_group_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under xdist the controller sees every report; a test's ID ends in `@group`."""
    if "@" in report.nodeid:
        group = report.nodeid.rsplit("@", 1)[1]
        _group_seconds[group] = _group_seconds.get(group, 0.0) + report.duration


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))
    if session.config.getoption("write_group_seconds") and _group_seconds:
        rounded = {group: round(s, 1) for group, s in sorted(_group_seconds.items())}
        GROUP_SECONDS.write_text(json.dumps(rounded, indent=1) + "\n")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    for building in _archive_build:
        stop_building(building, _spark_archive[0])
    # temporalio sdk-python #300: the interpreter can abort while shutting down after a client
    # or worker was used; leave with the session's real status instead.
    if _exit_status and not hasattr(config, "workerinput"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status[-1])


@pytest.fixture
def no_configured_services(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No procbus setting, no TEMPORAL_* variable or temporal.toml profile, no `procbus dev`
    stack: a command sees only what its test sets."""
    from procbus.config import setting_names

    for name in setting_names():
        monkeypatch.delenv(name, raising=False)
    for name in ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PROCBUS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def services() -> Iterator[EphemeralServices]:
    # Each xdist worker has its own: Schedules and some workflows have fixed IDs, so two
    # processes' tests would meet in one Temporal namespace.
    with ephemeral_services("procbus-test-") as started:
        yield started


@pytest.fixture(scope="session")
async def postgres_url(services: EphemeralServices) -> str:
    url = services.postgres.url()
    await create_template(url)
    return url


@pytest.fixture(scope="session")
def temporal_address(services: EphemeralServices) -> str:
    return services.temporal.address


@pytest.fixture(scope="session")
async def client(temporal_address: str) -> Client:
    return await connect_client(temporal_address, "default")


@pytest.fixture
def task_queue() -> str:
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
async def database_url(postgres_url: str) -> AsyncIterator[str]:
    url = await create_test_database(postgres_url)
    yield url
    await drop_test_database(postgres_url, url)


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url)
    yield pool
    await pool.close()


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    folder = tmp_path / "warehouse"
    folder.mkdir()
    return folder


@pytest.fixture
def worker_workflows() -> Sequence[type]:
    """The workflows of the `worker` and `start_worker` fixtures: all of procbus's, unless a
    module names the few its tests run (checking each in the sandbox takes ~15 ms a worker)."""
    return WORKFLOWS


@pytest.fixture
async def worker(
    client: Client,
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    worker_workflows: Sequence[type],
) -> AsyncIterator[Worker]:
    """The workflows and every activity of procbus, polling this test's own task queue."""
    async with build_worker(
        client,
        pool,
        task_queue,
        warehouse_root=warehouse,
        auth=TEST_AUTH,
        workflows=worker_workflows,
    ) as running:
        yield running


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from procbus.spark import spark_session

    session = spark_session("local[2]", tmp_path_factory.mktemp("spark-warehouse"), "procbus-tests")
    yield session
    session.stop()


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state folder the embedded PostgreSQL user can enter when run as root (pytest's own
    folders are closed to others): its data stays in it, and goes with it."""
    from procbus.stack.ephemeral import service_dir

    root = service_dir("procbus-state-")
    folder = root / "state"
    folder.mkdir()
    yield folder
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def start_worker(
    client: Client,
    pool: asyncpg.Pool,
    task_queue: str,
    warehouse: Path,
    worker_workflows: Sequence[type],
) -> Any:
    """A worker with fault rules (PROCBUS_FAULTS syntax) on this test's queue, and a bus member
    of this process whose descriptor cache is `cache`; use `async with`."""
    from procbus.core.faults import parse_faults
    from procbus.lakehouse.cache import AccessCache, DescriptorCache
    from procbus.worker.main import bus_member

    @contextlib.asynccontextmanager
    async def start(faults: str = "", cache: DescriptorCache | None = None) -> AsyncIterator[None]:
        rules = parse_faults(faults)
        access = AccessCache()
        async with (
            build_worker(
                client,
                pool,
                task_queue,
                warehouse_root=warehouse,
                faults=rules,
                access=access,
                auth=TEST_AUTH,
                workflows=worker_workflows,
            ),
            bus_member(
                client,
                pool,
                task_queue,
                tables=cache if cache is not None else DescriptorCache(),
                access=access,
                timeout_seconds=3.0,
                faults=rules,
            ),
        ):
            yield

    return start
