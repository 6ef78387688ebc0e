"""Which payloads of a workflow's history a payload codec encoded."""

from __future__ import annotations

from collections.abc import Iterator

from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowHistory

# Never through a codec: the server indexes search attributes; headers by the client's choice.
UNCODED_FIELDS = frozenset({"search_attributes", "header"})
# The SDK core's own bookkeeping in markers (a patch's ID, a local activity's sequence and
# time), never through a codec in any Temporal app; a local activity's result is encoded.
CORE_MARKER_DATA = frozenset(
    f".marker_recorded_event_attributes.details[{key}].payloads[0]"
    for key in ("patch-data", "data")
)


def payloads_in(value: object, path: str = "") -> Iterator[tuple[str, Payload]]:
    """Every payload in a protobuf message, with where it is."""
    if isinstance(value, Payload):
        yield path, value
    elif hasattr(value, "ListFields"):
        for field, child in value.ListFields():
            if field.name not in UNCODED_FIELDS:
                yield from payloads_in(child, f"{path}.{field.name}")
    elif hasattr(value, "values") and callable(value.values):  # a protobuf map
        for key, child in value.items():
            yield from payloads_in(child, f"{path}[{key}]")
    elif not isinstance(value, (str, bytes)) and hasattr(value, "__len__"):  # repeated
        for index, child in enumerate(value):
            yield from payloads_in(child, f"{path}[{index}]")


def history_payloads(history: WorkflowHistory) -> list[tuple[str, Payload]]:
    """Every payload in a history's events, but search attributes' and headers'."""
    return [(path, payload) for event in history.events for path, payload in payloads_in(event)]
