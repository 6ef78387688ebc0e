"""Transaction-grouped batches: a receiver never sees part of a source transaction
(procbus.batching.assembly, pure)."""

from procbus.batching.assembly import (
    Event,
    assemble_batch,
    assemble_batches,
    whole_transaction_batches,
)

__all__ = ["Event", "assemble_batch", "assemble_batches", "whole_transaction_batches"]
