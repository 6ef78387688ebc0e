"""How procbus values travel through Temporal: pydantic models as JSON, and workflow input that
does not fit its model refused at once.

Without this, a workflow whose JSON input does not decode (a misspelled field from the `temporal`
CLI or the UI's Start Workflow form, a list where an object belongs) fails its first workflow task
before any workflow code runs, and Temporal retries that task forever: the run hangs RUNNING.
Here such input fails the workflow, non-retryable, as InvalidProcedureInput with pydantic's
message naming each bad or missing field; nothing else happens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError

from procbus.core import WorkflowInput
from procbus.errors import ErrorType, validation_findings
from procbus.temporal.errors import application_error


def refused_input(
    model: type[pydantic.BaseModel], error: pydantic.ValidationError
) -> ApplicationError:
    """The failure of a workflow whose input does not fit its model: pydantic's findings, one per
    bad or missing field, and the shape it wants."""
    findings = validation_findings(error)
    required = ", ".join(
        f'"{name}": ...' for name, field in model.model_fields.items() if field.is_required()
    )
    return application_error(
        ErrorType.INVALID_PROCEDURE_INPUT,
        f"{error.error_count()} validation error(s) for {model.__name__}: {findings} "
        f"(expected a JSON object like {{{required}}})",
    )


class ProcbusPayloadConverter(PydanticPayloadConverter):
    """pydantic's JSON converter; input for a WorkflowInput that does not validate becomes a
    non-retryable ApplicationError, which fails the workflow instead of its task."""

    def from_payloads(
        self, payloads: Sequence[Payload], type_hints: list[type] | None = None
    ) -> list[Any]:
        if not type_hints or len(type_hints) != len(payloads):
            return super().from_payloads(payloads, type_hints)
        values = []
        for payload, hint in zip(payloads, type_hints, strict=True):
            try:
                values.extend(super().from_payloads([payload], [hint]))
            except pydantic.ValidationError as error:
                if not (isinstance(hint, type) and issubclass(hint, WorkflowInput)):
                    raise
                raise refused_input(hint, error) from None
        return values


procbus_data_converter = DataConverter(payload_converter_class=ProcbusPayloadConverter)
