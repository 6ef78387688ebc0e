"""Spark for procbus jobs: local[*] on loopback by default, a cluster by URL."""

from procbus.errors import SparkJobCancelled, SparkJobFailed
from procbus.spark.backends import (
    JobHandle,
    JobPhase,
    JobProgress,
    LocalBackend,
    SparkBackend,
    run_watched,
    watch,
)
from procbus.spark.session import JAVA_HINT, find_java, spark_session

__all__ = [
    "JAVA_HINT",
    "JobHandle",
    "JobPhase",
    "JobProgress",
    "LocalBackend",
    "SparkBackend",
    "SparkJobCancelled",
    "SparkJobFailed",
    "find_java",
    "run_watched",
    "spark_session",
    "watch",
]
