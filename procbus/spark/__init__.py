"""Spark for procbus jobs: local[*] on loopback by default, a cluster by URL."""

from procbus.spark.session import JAVA_HINT, find_java, spark_session

__all__ = ["JAVA_HINT", "find_java", "spark_session"]
