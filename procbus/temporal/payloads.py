"""How procbus values travel through Temporal: pydantic models as JSON, and workflow input that
does not fit its model refused at once.

Without this, a workflow whose JSON input does not decode (a misspelled field from the `temporal`
CLI or the UI's Start Workflow form, a list where an object belongs) fails its first workflow task
before any workflow code runs, and Temporal retries that task forever: the run hangs RUNNING.
Here such input fails the workflow, non-retryable, as InvalidProcedureInput with pydantic's
message naming each bad or missing field; nothing else happens.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import pydantic
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import DataConverter, DefaultPayloadConverter, PayloadCodec
from temporalio.exceptions import ApplicationError

from procbus.core import WorkflowInput
from procbus.errors import ConfigError, ErrorType, validation_findings
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

# Payload converters procbus's takes the place of: it converts all they do (pydantic's JSON for
# anything JSON can carry), and procbus's own inputs and results are pydantic models.
REPLACEABLE_PAYLOAD_CONVERTERS = (DefaultPayloadConverter, PydanticPayloadConverter)


def with_procbus_payloads(converter: DataConverter | None) -> DataConverter:
    """Return `converter` with procbus's payload converter, the rest of it kept.

    The payload codec (a user's encryption), the failure converter and external storage stay
    as they are, so the codec encodes procbus's payloads too.

    Args:
        converter: the client's data converter so far; procbus's own when None.

    Raises:
        ConfigError: when `converter` has a payload converter of its own, which procbus would
            replace (it reads and writes its models as pydantic JSON).
    """
    if converter is None:
        return procbus_data_converter
    current = converter.payload_converter_class
    if issubclass(current, ProcbusPayloadConverter):
        return converter
    if current not in REPLACEABLE_PAYLOAD_CONVERTERS:
        raise ConfigError(
            f"ProcbusPlugin cannot use the payload converter {current.__qualname__}: procbus "
            "reads and writes its models as pydantic JSON with its own converter; derive yours "
            "from procbus.temporal.ProcbusPayloadConverter (your payload codec and failure "
            "converter are kept as they are)"
        )
    return dataclasses.replace(converter, payload_converter_class=ProcbusPayloadConverter)


def load_payload_codec(path: str, setting: str = "PROCBUS_PAYLOAD_CODEC") -> PayloadCodec:
    """Return the payload codec the callable at `path` ("package.module:factory") makes.

    Args:
        path: where the factory is, imported from the working folder too (as `python -m`).
        setting: the setting `path` came from, named in errors.

    Raises:
        ConfigError: when the module does not import, has no such callable, or what it
            returns is no temporalio.converter.PayloadCodec.
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{setting}={path}: expected package.module:factory")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any failure of the user's module is reported the same way
        raise ConfigError(
            f"{setting}={path}: module {module_name!r} does not import: "
            f"{type(error).__name__}: {error}"
        ) from None
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ConfigError(f"{setting}={path}: module {module_name!r} has no callable {attribute!r}")
    try:
        codec = factory()
    except Exception as error:
        raise ConfigError(
            f"{setting}={path}: {attribute}() failed: {type(error).__name__}: {error}"
        ) from None
    if not isinstance(codec, PayloadCodec):
        raise ConfigError(
            f"{setting}={path}: {attribute}() returned {type(codec).__qualname__}, not a "
            "temporalio.converter.PayloadCodec"
        )
    return codec


def client_data_converter(payload_codec: str | None) -> DataConverter:
    """Return procbus's data converter, with the codec `payload_codec` names (if any).

    Raises:
        ConfigError: when the codec cannot be loaded (see load_payload_codec).
    """
    if payload_codec is None:
        return procbus_data_converter
    codec = load_payload_codec(payload_codec)
    return dataclasses.replace(procbus_data_converter, payload_codec=codec)
