"""The change pipeline: a table:// topic's transaction-grouped batches of captured changes
(procbus.capture), applied to lake tables by a Spark job and one catalog commit per batch
(procbus.pipeline.apply); its state and `procbus pipeline status` (Pipelines)."""

from procbus.pipeline.apply import Pipelines, TableApplier
from procbus.pipeline.models import PipelineStatus

__all__ = ["PipelineStatus", "Pipelines", "TableApplier"]
