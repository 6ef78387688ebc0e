"""The driver of a procbus job on a cluster: `procbus_spark_driver.py JOB_GROUP SPEC_FILE`
(the job's spec as JSON in a file beside its output; a JSON argument, as older workers passed
it, is read as it is).

It runs the spec under the attempt's job group and leaves its outcome (ok, or the error in
Spark's own words) in a file beside the output, which the worker reads when the cluster says
the driver ended. When its JVM is gone (killed, out of memory) it leaves none: the job did not
fail, its driver was lost, and the worker runs it again as a new attempt.

The spec file is the attempt's licence to leave output: discarding an attempt removes it first
(procbus.spark.staging), so a driver that finds it gone once it stopped writing removes what it
wrote. That holds for a driver no one can cancel, whose submission the ledger never recorded.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pydantic import TypeAdapter

from procbus.errors import ProcbusError, needs_extra
from procbus.spark.backends import spark_error_text
from procbus.spark.specs import CompactJob, JobOutcome, JobSpec, LoadJob, outcome_file, run_spec

with needs_extra("spark"):
    from py4j.protocol import Py4JNetworkError
with needs_extra("spark"):
    from pyspark.sql import SparkSession

# The exit status of a driver whose JVM went before the job ended (no outcome is left).
DRIVER_LOST = 3
# The exit status of a driver whose attempt was discarded while it ran (it removed its output).
ATTEMPT_DISCARDED = 4


def main(argv: list[str]) -> int:
    job_group, spec_argument = argv[1], argv[2]
    spec_json = spec_argument
    spec_path = None
    if not spec_argument.lstrip().startswith("{"):
        spec_path = Path(spec_argument)
        spec_json = spec_path.read_text()
    spec = TypeAdapter(JobSpec).validate_json(spec_json)
    status = _run(spec, job_group)
    if spec_path is not None and not spec_path.exists():
        print("procbus: this attempt was discarded while it ran; its output is removed")
        shutil.rmtree(spec.output, ignore_errors=True)
        outcome_file(spec.output).unlink(missing_ok=True)
        return ATTEMPT_DISCARDED
    return status


def _run(spec: LoadJob | CompactJob, job_group: str) -> int:
    """Run the job and leave its outcome; the exit status. Nothing is written after it returns."""
    spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setJobGroup(job_group, f"procbus {spec.kind} {spec.table.qualified_name}")
    try:
        run_spec(spark, spec)
        outcome = JobOutcome(ok=True)
    except (Py4JNetworkError, ConnectionError) as lost:  # the JVM went; this job did not fail
        print(f"procbus: the driver's JVM is gone ({lost}); no outcome left", file=sys.stderr)
        return DRIVER_LOST
    except ProcbusError as error:
        kind = error.error_type.value if error.error_type else None
        outcome = JobOutcome(ok=False, error=str(error), error_type=kind)
    except Exception as error:
        outcome = JobOutcome(ok=False, error=spark_error_text(error))
    outcome_file(spec.output).write_text(outcome.model_dump_json())
    spark.stop()  # its executors write nothing more
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
