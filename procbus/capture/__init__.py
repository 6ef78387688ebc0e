"""Change capture: every committed INSERT, UPDATE and DELETE of an application's PostgreSQL table
becomes a change event in a transaction-grouped topic, published by a trigger in the
application's own transaction (procbus.capture.captures)."""

from procbus.capture.captures import Capture, Captures, SourceColumn, pipeline_principal

__all__ = ["Capture", "Captures", "SourceColumn", "pipeline_principal"]
