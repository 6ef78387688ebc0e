"""Temporal clients for procbus: pydantic payloads; TLS, API key from the configuration."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from functools import cache

from temporalio.client import Client, Plugin
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.service import RPCError

from procbus.config import Settings
from procbus.errors import StackError
from procbus.temporal.auth import Signer, SigningInterceptor
from procbus.temporal.connection import TemporalOptions, configured_temporal
from procbus.temporal.payloads import client_data_converter


class _DropLateActivityCompletion(logging.Filter):
    """The lease keeper of a finished procedure is cancelled without waiting (so the locks are
    released at once); its completion then finds the workflow closed, which is expected."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Activity not found on completion" not in record.getMessage()


@cache
def procbus_runtime(metrics_address: str | None = None) -> Runtime:
    """Return the Temporal runtime of procbus processes.

    The core SDK's logs go through Python logging (stderr), never to stdout, where `--json`
    output goes. With `metrics_address` (host:port) it serves Prometheus metrics there, the
    SDK's and procbus's (procbus.core.metrics).

    Raises:
        StackError: when it cannot serve metrics on `metrics_address`.
    """
    core_log = logging.getLogger("temporalio.core")
    core_log.addFilter(_DropLateActivityCompletion())
    metrics = None
    if metrics_address is not None:
        metrics = PrometheusConfig(
            bind_address=metrics_address, counters_total_suffix=True, durations_as_seconds=True
        )
    try:
        runtime = Runtime(
            telemetry=TelemetryConfig(
                logging=LoggingConfig(
                    filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                    forwarding=LogForwardingConfig(logger=core_log),
                ),
                metrics=metrics,
            )
        )
    except Exception as error:  # the core SDK binds the metrics port itself
        raise StackError(
            f"cannot serve metrics on {metrics_address} (PROCBUS_METRICS_PORT): {error}"
        ) from None
    if metrics_address is None:
        Runtime.set_default(runtime, error_if_already_set=False)
    return runtime


STARTING_SERVER_WAIT_SECONDS = 60.0
_STARTING_SERVER = "not healthy yet"


async def connect_client(
    address: str,
    namespace: str,
    settings: Settings | None = None,
    *,
    metrics_address: str | None = None,
    signer: Signer | None = None,
    options: TemporalOptions | None = None,
    plugins: Sequence[Plugin] = (),
) -> Client:
    """Connect a client whose payloads are pydantic models as JSON.

    So the `temporal` CLI can send them.

    Args:
        address: the Temporal server's host:port.
        namespace: the Temporal namespace.
        settings: TLS, API key (PROCBUS_TEMPORAL_*, else TEMPORAL_*) and payload codec
            (PROCBUS_PAYLOAD_CODEC) to connect with; none when None.
        metrics_address: where a worker built on the client serves metrics, if anywhere.
        signer: every workflow the client starts carries this principal's token.
        options: TLS, API key and gRPC metadata (a resolved address's); else the settings'.
        plugins: Temporal plugins for the client (a worker built on it gets them too).

    Raises:
        StackError: when the server cannot be reached or refuses the client.
        ConfigError: when the settings' payload codec cannot be loaded.
    """
    data_converter = client_data_converter(settings.payload_codec if settings else None)
    if options is None and settings is not None:
        options = configured_temporal(settings).options
    options = options or TemporalOptions()
    deadline = time.monotonic() + STARTING_SERVER_WAIT_SECONDS
    while True:
        try:
            return await Client.connect(
                address,
                namespace=namespace,
                tls=options.tls,
                api_key=options.api_key,
                rpc_metadata=options.rpc_metadata,
                data_converter=data_converter,
                runtime=procbus_runtime(metrics_address),
                interceptors=[SigningInterceptor(signer)] if signer is not None else [],
                plugins=plugins,
            )
        except RuntimeError as error:  # the core SDK reports an unreachable server this way
            # A server that listens but is still starting answers Unavailable for a few seconds.
            if _STARTING_SERVER in str(error) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
                continue
            raise StackError(f"cannot reach the Temporal server at {address}: {error}") from None
        except RPCError as error:
            raise StackError(
                f"the Temporal server at {address} refused the client: {error}"
            ) from None


def workflow_ui_url(ui_url: str | None, namespace: str, workflow_id: str) -> str | None:
    """Return a workflow's page in the Temporal UI, or None without a UI.

    Args:
        ui_url: the UI's base URL, if there is one.
        namespace: the Temporal namespace.
        workflow_id: the workflow's ID.
    """
    return f"{ui_url}/namespaces/{namespace}/workflows/{workflow_id}" if ui_url else None
