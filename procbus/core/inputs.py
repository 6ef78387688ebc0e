"""The base of every procbus workflow's input. Pure: safe in the workflow sandbox.

The data converter that refuses input which does not fit its model is the Temporal adapter's
(procbus.temporal.payloads).
"""

from __future__ import annotations

import pydantic


class WorkflowInput(pydantic.BaseModel):
    """Base of every procbus workflow's input: unknown fields are refused (a typo must not be
    ignored), as are NaN and infinity (no bound or timeout can be either), and input that does
    not validate fails the workflow at once."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)
