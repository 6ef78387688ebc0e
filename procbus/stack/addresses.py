"""Which Temporal server, namespace, task queue and database a command talks to.

Each comes from the first that names it: a CLI flag (`--address`, `--namespace`, `--profile`:
they set PROCBUS_TEMPORAL_*), PROCBUS_*, Temporal's own TEMPORAL_* and temporal.toml profile
(procbus.temporal.connection), else the `procbus dev` stack running on STATE_DIR. A command that
needs only Temporal asks for Temporal alone; one that needs the database never takes the dev
stack's database beside a Temporal configured elsewhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from procbus.config import Settings
from procbus.errors import ConfigError, StackError
from procbus.stack.state import StackInfo, read_live_stack
from procbus.temporal.connection import TemporalOptions, configured_temporal


@dataclass(frozen=True, kw_only=True)
class TemporalAddresses:
    """The Temporal namespace a command talks to, and the task queue of procbus's workers."""

    temporal_address: str
    namespace: str
    task_queue: str
    ui_url: str | None
    source: Literal["settings", "embedded"]
    metrics_url: str | None = None  # where the worker serves Prometheus metrics, if it does
    temporal_options: TemporalOptions = field(default_factory=TemporalOptions)


@dataclass(frozen=True, kw_only=True)
class ServiceAddresses(TemporalAddresses):
    """Temporal and procbus's database: what a worker, `status` or the demo needs."""

    database_url: str


def metrics_url(metrics_address: str | None) -> str | None:
    """The URL Prometheus scrapes for a metrics endpoint on host:port."""
    return f"http://{metrics_address}/metrics" if metrics_address else None


def mask_password(url: str) -> str:
    """Return `url` with its password, if any, replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def resolve_temporal(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> TemporalAddresses:
    """Return the Temporal namespace to use: the one configured, else the embedded stack's.

    Args:
        settings: procbus's settings.
        environ: the environment for Temporal's TEMPORAL_* variables; the process's when None.

    Raises:
        ConfigError: when Temporal's client configuration cannot be loaded.
        StackError: when nothing names a Temporal server and no embedded stack runs.
    """
    configured = configured_temporal(settings, environ)
    if configured.address is not None:
        return TemporalAddresses(
            temporal_address=configured.address,
            namespace=configured.namespace or "default",
            task_queue=settings.task_queue,
            ui_url=None,
            source="settings",
            metrics_url=metrics_url(settings.metrics_address()),
            temporal_options=configured.options,
        )
    stack = read_live_stack(settings.state_dir)
    if stack is None:
        raise StackError(
            f"PROCBUS_TEMPORAL_ADDRESS is not set and no embedded stack runs on "
            f"{settings.state_dir}: start one with `procbus dev`, or set PROCBUS_TEMPORAL_ADDRESS "
            "(or TEMPORAL_ADDRESS, or an address in a temporal.toml profile)"
        )
    return TemporalAddresses(
        temporal_address=stack.temporal_address,
        # --namespace (PROCBUS_TEMPORAL_NAMESPACE) applies to the dev server; TEMPORAL_* do not.
        namespace=settings.temporal_namespace
        if "temporal_namespace" in settings.model_fields_set
        else stack.namespace,
        task_queue=stack.task_queue,
        ui_url=stack.ui_url,
        source="embedded",
        metrics_url=stack.metrics_url,  # what the running `procbus dev` serves
    )


def resolve_database_url(settings: Settings, environ: Mapping[str, str] | None = None) -> str:
    """Return procbus's database: PROCBUS_DATABASE_URL, else the embedded stack's.

    The embedded stack's only when no Temporal is configured either: a command never mixes a
    Temporal of your own with the dev stack's database.

    Args:
        settings: procbus's settings.
        environ: the environment for Temporal's TEMPORAL_* variables; the process's when None.

    Raises:
        ConfigError: when a Temporal server is configured but PROCBUS_DATABASE_URL is not.
        StackError: when PROCBUS_DATABASE_URL is not set and no embedded stack runs.
    """
    if settings.database_url is not None:
        return settings.database_url.get_secret_value()
    configured = configured_temporal(settings, environ)
    if configured.address is not None:
        raise ConfigError(
            f"PROCBUS_DATABASE_URL is not set: this command needs procbus's database, and with "
            f"Temporal at {configured.address} ({configured.address_from}) it does not take the "
            "database of a running `procbus dev`; set PROCBUS_DATABASE_URL"
        )
    stack = read_live_stack(settings.state_dir)
    if stack is None:
        raise StackError(
            f"PROCBUS_DATABASE_URL is not set and no embedded stack runs on {settings.state_dir}: "
            "start one with `procbus dev`, or set PROCBUS_DATABASE_URL"
        )
    return stack.database_url


def uses_embedded_stack(settings: Settings) -> bool:
    """Return whether these settings take Temporal or the database from a running `procbus dev`."""
    leaves_unset = settings.database_url is None or configured_temporal(settings).address is None
    return leaves_unset and read_live_stack(settings.state_dir) is not None


def resolve_addresses(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> ServiceAddresses:
    """Return Temporal and the database to use: those configured, else the embedded stack's.

    Args:
        settings: procbus's settings.
        environ: the environment for Temporal's TEMPORAL_* variables; the process's when None.

    Raises:
        ConfigError: when Temporal's configuration cannot be loaded, or a Temporal server is
            configured but PROCBUS_DATABASE_URL is not.
        StackError: when the settings name no services and no embedded stack runs.
    """
    temporal = resolve_temporal(settings, environ)
    database_url = resolve_database_url(settings, environ)
    return ServiceAddresses(**vars(temporal), database_url=database_url)


def embedded_addresses(info: StackInfo) -> ServiceAddresses:
    """Return what a `procbus dev` stack serves, as every command sees it."""
    return ServiceAddresses(
        temporal_address=info.temporal_address,
        namespace=info.namespace,
        task_queue=info.task_queue,
        database_url=info.database_url,
        ui_url=info.ui_url,
        source="embedded",
        metrics_url=info.metrics_url,
    )
