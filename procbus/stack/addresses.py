"""Which Temporal server, namespace, task queue and database a command talks to.

Settings win; what they leave unset comes from the embedded stack running on STATE_DIR.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from procbus.config import Settings
from procbus.errors import StackError
from procbus.stack.state import StackInfo, read_live_stack


@dataclass(frozen=True)
class ServiceAddresses:
    temporal_address: str
    namespace: str
    task_queue: str
    database_url: str
    ui_url: str | None
    source: Literal["settings", "embedded"]
    metrics_url: str | None = None  # where the worker serves Prometheus metrics, if it does


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


def resolve_addresses(settings: Settings) -> ServiceAddresses:
    """Return the services to use: those the settings name, else the embedded stack's.

    Args:
        settings: procbus's settings.

    Raises:
        StackError: when the settings name no services and no embedded stack runs.
    """
    database_url = settings.database_url.get_secret_value() if settings.database_url else None
    if settings.temporal_address and database_url:
        return ServiceAddresses(
            settings.temporal_address,
            settings.temporal_namespace,
            settings.task_queue,
            database_url,
            None,
            "settings",
            metrics_url(settings.metrics_address()),
        )
    stack = read_live_stack(settings.state_dir)
    if stack is None:
        missing = (
            "PROCBUS_TEMPORAL_ADDRESS" if not settings.temporal_address else "PROCBUS_DATABASE_URL"
        )
        raise StackError(
            f"{missing} is not set and no embedded stack runs on {settings.state_dir}: start one "
            f"with `procbus dev`, or set {missing}"
        )
    return ServiceAddresses(
        settings.temporal_address or stack.temporal_address,
        settings.temporal_namespace if settings.temporal_address else stack.namespace,
        stack.task_queue,
        database_url or stack.database_url,
        None if settings.temporal_address else stack.ui_url,
        "embedded",
        stack.metrics_url,  # what the running `procbus dev` serves
    )


def embedded_addresses(info: StackInfo) -> ServiceAddresses:
    """Return what a `procbus dev` stack serves, as every command sees it."""
    return ServiceAddresses(
        info.temporal_address,
        info.namespace,
        info.task_queue,
        info.database_url,
        info.ui_url,
        "embedded",
        info.metrics_url,
    )
