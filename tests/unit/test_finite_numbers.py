"""NaN and infinity are no bound, wait or timeout: a workflow's input and a topic's settings
refuse them (a NaN passed every `<= 0` check, and a timedelta of it failed inside a workflow)."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from procbus.procedures.models import ProcedureInput
from procbus.topics.models import TopicSettings


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_procedure_input_refuses_a_number_that_is_not_finite(value: float) -> None:
    with pytest.raises(ValidationError, match="finite number"):
        ProcedureInput(deadline_seconds=value)
    token = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}[str(value)]
    with pytest.raises(ValidationError, match="finite number"):  # as JSON, too
        ProcedureInput.model_validate_json(f'{{"step_timeout_seconds": {token}}}')


@pytest.mark.parametrize(
    "field", ["retry_sleep_seconds", "ttl_seconds", "batch_seconds", "incomplete_wait_seconds"]
)
def test_topic_settings_refuse_a_wait_that_is_not_finite(field: str) -> None:
    for value in (math.nan, math.inf):
        with pytest.raises(ValidationError, match="finite number"):
            TopicSettings.model_validate({"endpoint": "http://127.0.0.1:9/h", field: value})
