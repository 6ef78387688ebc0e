"""The driver of a procbus job on a cluster: `procbus_spark_driver.py JOB_GROUP SPEC_FILE`
(the job's spec as JSON in a file beside its output; a JSON argument, as older workers passed
it, is read as it is).

It runs the spec under the attempt's job group and leaves its outcome (ok, or the error in
Spark's own words) in a file beside the output, which the worker reads when the cluster says
the driver ended. When its JVM is gone (killed, out of memory) it leaves none: the job did not
fail, its driver was lost, and the worker runs it again as a new attempt.
"""

from __future__ import annotations

import sys
from pathlib import Path

from py4j.protocol import Py4JNetworkError
from pydantic import TypeAdapter
from pyspark.sql import SparkSession

from procbus.errors import ProcbusError
from procbus.spark.backends import spark_error_text
from procbus.spark.specs import JobOutcome, JobSpec, outcome_file, run_spec

# The exit status of a driver whose JVM went before the job ended (no outcome is left).
DRIVER_LOST = 3


def main(argv: list[str]) -> int:
    job_group, spec_argument = argv[1], argv[2]
    spec_json = spec_argument
    if not spec_argument.lstrip().startswith("{"):
        spec_json = Path(spec_argument).read_text()
    spec = TypeAdapter(JobSpec).validate_json(spec_json)
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
    spark.stop()
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
