"""The procbus driver's outcome (procbus.spark.driver): a job that failed leaves its error for
the worker; a driver whose JVM went leaves none, so the worker sees a lost driver
(SparkDriverLost) and runs the job again, instead of rolling the procedure back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from py4j.protocol import Py4JNetworkError

from procbus.lakehouse.data import InputFormat
from procbus.lakehouse.models import TableDescriptor
from procbus.lakehouse.schemas import parse_columns
from procbus.spark import driver
from procbus.spark.specs import JobOutcome, LoadJob, outcome_file


class _Context:
    def setJobGroup(self, group: str, description: str) -> None:
        pass


class _Session:
    """The driver's session: the JVM behind it is what the cases take away."""

    sparkContext = _Context()

    def stop(self) -> None:
        pass


class _Builder:
    def getOrCreate(self) -> _Session:
        return _Session()


def _run(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    raised: BaseException | None,
    meanwhile: Callable[[Path], None] = lambda spec: None,
) -> int:
    table = TableDescriptor(
        namespace="sales",
        name="orders",
        columns=parse_columns("id:bigint"),
        location=str(tmp_path / "sales" / "orders"),
    )
    output = str(tmp_path / "out")
    spec = tmp_path / "job.json"
    job = LoadJob(table=table, source="in.csv", format=InputFormat.CSV, output=output)
    spec.write_text(job.model_dump_json())

    def run_spec(spark: Any, job: LoadJob) -> None:
        Path(job.output).mkdir()
        (Path(job.output) / "part-0.parquet").write_bytes(b"PAR1")
        meanwhile(spec)
        if raised is not None:
            raise raised

    monkeypatch.setattr(driver.SparkSession, "builder", _Builder())
    monkeypatch.setattr(driver, "run_spec", run_spec)
    return driver.main(["driver.py", "procbus-a1", str(spec)])


@pytest.mark.parametrize(
    "raised",
    [
        Py4JNetworkError("Answer from Java side is empty"),
        ConnectionRefusedError(111, "Connection refused"),
    ],
    ids=["answer-lost", "connection-refused"],
)
def test_a_driver_whose_jvm_is_gone_leaves_no_outcome(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raised: BaseException
) -> None:
    exit_status = _run(monkeypatch, tmp_path, raised)
    assert not outcome_file(str(tmp_path / "out")).exists()  # no error to mistake for the job's
    assert exit_status == driver.DRIVER_LOST


def test_a_job_that_failed_leaves_its_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert _run(monkeypatch, tmp_path, ValueError("row 3 has no amount")) == 1
    outcome = JobOutcome.model_validate_json(outcome_file(str(tmp_path / "out")).read_text())
    assert (outcome.ok, outcome.error) == (False, "row 3 has no amount")


@pytest.mark.parametrize(
    "raised", [None, ValueError("row 3 has no amount"), Py4JNetworkError("Answer from Java side")]
)
def test_a_driver_whose_attempt_was_discarded_while_it_ran_removes_what_it_wrote(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, raised: BaseException | None
) -> None:
    """Seen in the nemesis (seed 17): a load's driver was submitted, then the database went
    before the submission was recorded. Nothing could find the driver to cancel it; the
    rollback removed the attempt's folder, and the driver wrote its output there afterwards."""
    exit_status = _run(monkeypatch, tmp_path, raised, meanwhile=lambda spec: spec.unlink())
    assert exit_status == driver.ATTEMPT_DISCARDED
    assert not (tmp_path / "out").exists()
    assert not outcome_file(str(tmp_path / "out")).exists()
