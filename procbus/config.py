"""Settings: every one of them is an environment variable PROCBUS_<NAME> (or a line in .env)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from procbus.core import (
    KafkaCredentials,
    check_member_id,
    check_principal,
    parse_allowlist,
    parse_faults,
)
from procbus.delivery import DELIVERY_POLL_FIRST_SECONDS, DELIVERY_POLL_MAX_SECONDS
from procbus.errors import ConfigError, InvalidRequest
from procbus.lakehouse.key_index import DEFAULT_KEY_INDEX_BYTES

ENV_PREFIX = "PROCBUS_"

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9.\-]+):(?P<port>\d{1,5})$")
_LOCAL_MASTER = re.compile(r"^local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")


def _check_host_port(value: str, what: str) -> str:
    match = _HOST_PORT.fullmatch(value)
    if not match or not 0 < int(match["port"]) < 65536:
        raise ValueError(f"expected host:port for {what}, got {value!r}")
    return value


def _check_name(value: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(f"expected letters, digits, '_', '.', '-' (1-200), got {value!r}")
    return value


class Settings(BaseSettings):
    """What procbus connects to and where it keeps its files."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_file=".env", extra="ignore", validate_default=True
    )

    temporal_address: str | None = Field(
        default=None,
        description="host:port of a Temporal frontend; unset: TEMPORAL_ADDRESS, else the "
        "temporal.toml profile's, else the running `procbus dev`'s",
    )
    temporal_namespace: str = Field(
        default="default",
        description="Temporal namespace; unset: TEMPORAL_NAMESPACE, else the temporal.toml "
        "profile's, else default (or the running `procbus dev`'s)",
    )
    temporal_profile: str | None = Field(
        default=None,
        description="profile of Temporal's client configuration file (TEMPORAL_CONFIG_FILE, "
        "else ~/.config/temporalio/temporal.toml) for what PROCBUS_TEMPORAL_* leave unset; "
        "unset: TEMPORAL_PROFILE, else default",
    )
    temporal_tls_cert: Path | None = Field(default=None, description="client certificate (mTLS)")
    temporal_tls_key: Path | None = Field(default=None, description="client private key (mTLS)")
    temporal_tls_ca: Path | None = Field(default=None, description="server CA certificate")
    temporal_api_key: SecretStr | None = Field(default=None, description="Temporal Cloud API key")
    payload_codec: str | None = Field(
        default=None,
        description="package.module:factory, a callable returning the temporalio PayloadCodec "
        "(e.g. your encryption) the CLI and `procbus worker` encode and decode payloads with; "
        "imported from the working folder too",
    )
    task_queue: str = Field(default="procbus", description="task queue of the procbus workers")
    database_url: SecretStr | None = Field(
        default=None, description="postgresql:// URL; unset: the embedded PostgreSQL"
    )
    warehouse: Path | None = Field(
        default=None, description="root folder of table data; unset: STATE_DIR/warehouse"
    )
    load_roots: str | None = Field(
        default=None,
        description="absolute folders `table load --from` may read, comma-separated; unset: "
        "WAREHOUSE/incoming alone",
    )
    spark_master: str = Field(
        default="local[*]",
        description="local[*] (jobs in the worker) or spark://host:port (a standalone cluster)",
    )
    spark_rest_url: str | None = Field(
        default=None,
        description="a spark:// master's REST submission URL; unset: http://MASTER_HOST:6066",
    )
    spark_web_url: str | None = Field(
        default=None,
        description="a spark:// master's web UI (job progress); unset: http://MASTER_HOST:8080",
    )
    state_dir: Path = Field(default=Path(".procbus"), description="files of the embedded stack")
    dev_temporal_port: int = Field(default=7233, ge=1, le=65535, description="embedded gRPC port")
    dev_ui_port: int = Field(default=8233, ge=1, le=65535, description="embedded Web UI port")
    dev_postgres_port: int = Field(
        default=0, ge=0, le=65535, description="embedded PostgreSQL port; 0: any free port"
    )

    metrics_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Prometheus metrics on METRICS_HOST:PORT/metrics; unset: none for `procbus "
        "worker`, 9090 for `procbus dev`",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="address the metrics endpoint binds (0.0.0.0 in a container)",
    )
    otel: bool = Field(
        default=False,
        description="OpenTelemetry traces from procbus's workers: Temporal's tracing interceptor "
        "and procbus's spans (steps, undos, lock waits, broadcasts) through the configured "
        "tracer provider; also on whenever one is configured",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] | None = Field(
        default=None,
        description="what `procbus worker` and `procbus dev` log on stderr: this level and "
        "above; unset: warnings and errors, their message only",
    )
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="text (time, level, logger, message) or json (one object a line: time, "
        "level, logger, message, exc_info) for a log collector",
    )

    events_topic: str | None = Field(
        default=None,
        description="topic the table procedures publish TableCreated and TableDeleted to",
    )
    endpoint_allowlist: str | None = Field(
        default=None,
        description="hosts and CIDRs topics may send to, comma-separated; unset: any but "
        "link-local and cloud metadata addresses",
    )
    kafka_credentials: dict[str, KafkaCredentials] = Field(
        default_factory=dict,
        description='Kafka logins by name, as JSON: {"prod": {"username": "procbus", "password": '
        '"...", "sasl_mechanism": "SCRAM-SHA-512", "ca_location": "/etc/kafka/ca.pem"}}; a '
        "kafka:// endpoint names one with ?credentials=prod",
    )
    delivery_poll_max_seconds: float = Field(
        default=DELIVERY_POLL_MAX_SECONDS,
        ge=DELIVERY_POLL_FIRST_SECONDS,
        le=60.0,
        description="an idle topic's queue is looked at again after "
        f"{DELIVERY_POLL_FIRST_SECONDS} s, then twice as long each time up to this: the longest "
        "a new event waits for an idle topic's delivery to see it (each idle topic costs one "
        "look, two index probes, per this many seconds)",
    )
    outbox_workflow_types: str | None = Field(
        default=None,
        description="workflow types the outbox relay may start, comma-separated; unset: any but "
        "procbus's own (Broadcast, OutboxSweep, Retention, TopicDelivery)",
    )

    worker_id: str | None = Field(
        default=None,
        description="this worker's ID on the bus (its own task queue); unset: host-pid. A worker "
        "restarted under the same ID gets what the bus sent its predecessor",
    )
    member_timeout_seconds: float = Field(
        default=15.0,
        gt=0,
        description="a worker that has not heartbeaten for this long drops out of the bus",
    )
    worker_shutdown_seconds: float = Field(
        default=30.0,
        ge=0,
        description="a stopping worker (SIGTERM, Ctrl-C) lets its running steps finish for this "
        "long before it cancels them (Temporal's graceful shutdown timeout); 0: at once",
    )

    # Retention (the Retention workflow, started by a Temporal Schedule): ages in seconds.
    outbox_retention_seconds: float = Field(
        default=7 * 86400.0, gt=0, description="done outbox rows are deleted this long after"
    )
    spark_job_retention_seconds: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="finished Spark job ledger rows (and attempts) are deleted this long after, "
        "once their procedure has closed",
    )
    snapshot_retention_seconds: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="a table snapshot expires this long after a newer one replaced it (the "
        "current one never); files no kept snapshot lists are deleted with it",
    )
    orphan_file_retention_seconds: float = Field(
        default=3 * 86400.0,
        gt=0,
        description="a file in a table's folder that no kept snapshot or metadata file lists "
        "(left by a write that never committed) is deleted once it is this old",
    )
    key_index_bytes: int = Field(
        default=DEFAULT_KEY_INDEX_BYTES,
        ge=0,
        description="bytes of data files' sorted key columns a worker keeps between a "
        "pipeline's batches, so a batch finds its changed rows without reading the table's "
        "keys (16 bytes a row; 0: read them every batch)",
    )
    batch_fence_retention_seconds: float = Field(
        default=86400.0,
        gt=0,
        description="fence rows of applied change batches are deleted this long after, once "
        "their entries left the queue",
    )
    bus_member_retention_seconds: float = Field(
        default=86400.0,
        gt=0,
        description="rows of bus members gone (heartbeat run out) this long are deleted",
    )
    retention_every_seconds: float = Field(
        default=3600.0, gt=0, description="how often the Retention schedule runs"
    )
    auth_key: SecretStr | None = Field(
        default=None,
        description="HMAC key clients sign principals with and workers verify; unset: the dev "
        "stack's STATE_DIR/auth.key for its CLI, none for `procbus worker`",
    )
    principal: str | None = Field(
        default=None, description="who the CLI and starter scripts sign as (`--as` overrides)"
    )
    unauthenticated_principal: str | None = Field(
        default=None,
        description="who a start without a principal token runs as; unset: refused by `procbus "
        "worker`, the dev operator on `procbus dev`",
    )
    operator_principal: str | None = Field(
        default=None, description="admin and write on every table; `dev` on `procbus dev`"
    )
    auth_token_seconds: float = Field(
        default=300.0, gt=0, description="how long a signed principal token is good for"
    )
    auth_token_late_seconds: float = Field(
        default=7 * 86400.0,
        gt=0,
        description="how long past its token's expiry a start Temporal accepted in time may "
        "still be verified (no worker ran it, or it was started with a delay); a later one is "
        "refused, as the token's one use is remembered no longer",
    )

    faults: str | None = Field(
        default=None,
        description="fault injection for drills, e.g. CreateTable.add_to_catalog:fail_after",
    )

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _any_case(cls, value: object, info: ValidationInfo) -> object:
        if not isinstance(value, str):
            return value
        return value.upper() if info.field_name == "log_level" else value.lower()

    @field_validator("faults")
    @classmethod
    def _faults(cls, value: str | None) -> str | None:
        if not value:
            return None
        parse_faults(value)
        return value

    @field_validator("principal", "unauthenticated_principal", "operator_principal")
    @classmethod
    def _principal(cls, value: str | None) -> str | None:
        try:
            return check_principal(value) if value else None
        except InvalidRequest as error:
            raise ValueError(str(error)) from None

    @field_validator("endpoint_allowlist")
    @classmethod
    def _endpoint_allowlist(cls, value: str | None) -> str | None:
        return value if parse_allowlist(value) else None

    @field_validator("temporal_address")
    @classmethod
    def _temporal_address(cls, value: str | None) -> str | None:
        return None if not value else _check_host_port(value, "the Temporal frontend")

    @field_validator("payload_codec")
    @classmethod
    def _payload_codec(cls, value: str | None) -> str | None:
        if not value:
            return None
        module, _, factory = value.partition(":")
        if not (factory.isidentifier() and all(part.isidentifier() for part in module.split("."))):
            raise ValueError(f"expected package.module:factory, got {value!r}")
        return value

    @field_validator("worker_id")
    @classmethod
    def _worker_id(cls, value: str | None) -> str | None:
        return check_member_id(value) if value else None

    @field_validator("temporal_namespace", "task_queue")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        return _check_name(value)

    @field_validator("temporal_profile")
    @classmethod
    def _profile(cls, value: str | None) -> str | None:
        return _check_name(value) if value else None

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        parts = urlsplit(value.get_secret_value())
        if parts.scheme not in ("postgresql", "postgres"):
            raise ValueError(
                f"expected a postgresql:// URL, got scheme {parts.scheme or '(none)'!r}"
            )
        if not parts.hostname and "host=" not in parts.query:
            raise ValueError("the URL names no host")
        try:
            parts.port  # noqa: B018  # raises on a non-numeric port
        except ValueError:
            raise ValueError("the URL has a port that is not a number") from None
        return value

    @field_validator("load_roots")
    @classmethod
    def _load_roots(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        for folder in value.split(","):
            # Relative to what? A worker's working folder is no place to grant reads from.
            if not Path(folder.strip()).is_absolute():
                raise ValueError(f"expected absolute folders, comma-separated, got {folder!r}")
        return value

    @field_validator("spark_master")
    @classmethod
    def _spark_master(cls, value: str) -> str:
        if _LOCAL_MASTER.fullmatch(value):
            return value
        if value.startswith("sc://"):
            raise ValueError(
                "Spark Connect (sc://) cannot run procbus jobs yet: a job's steps would be lost "
                "with its worker; use spark://host:port (a standalone master) or local[*]"
            )
        if value.startswith("spark://"):
            _check_host_port(value.removeprefix("spark://").split("/")[0], "a spark:// master")
            return value
        raise ValueError(f"expected local[*], local[N] or spark://host:port, got {value!r}")

    @field_validator("temporal_tls_cert", "temporal_tls_key", "temporal_tls_ca")
    @classmethod
    def _readable_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if (self.temporal_tls_cert is None) != (self.temporal_tls_key is None):
            raise ValueError(
                "PROCBUS_TEMPORAL_TLS_CERT and PROCBUS_TEMPORAL_TLS_KEY must be set together"
            )
        return self

    @property
    def warehouse_root(self) -> Path:
        return self.warehouse if self.warehouse is not None else self.state_dir / "warehouse"

    def allowed_outbox_workflow_types(self) -> frozenset[str] | None:
        if self.outbox_workflow_types is None:
            return None
        return frozenset(
            name.strip() for name in self.outbox_workflow_types.split(",") if name.strip()
        )

    @property
    def load_root_paths(self) -> list[Path]:
        """The folders a worker loads table data from (what else it can read stays private)."""
        if self.load_roots is None:
            # Absolute: a load names its input by an absolute path (the state folder may be
            # given relative to the working folder, as `make demo` does).
            return [(self.warehouse_root / "incoming").absolute()]
        return [Path(folder.strip()) for folder in self.load_roots.split(",")]

    def metrics_address(self, default_port: int | None = None) -> str | None:
        """host:port of the metrics endpoint, or None for none."""
        port = self.metrics_port or default_port
        return f"{self.metrics_host}:{port}" if port else None

    @property
    def auth_key_bytes(self) -> bytes | None:
        """PROCBUS_AUTH_KEY as the HMAC key it is, or None."""
        return self.auth_key.get_secret_value().encode() if self.auth_key else None

    @property
    def uses_tls(self) -> bool:
        return self.temporal_tls_ca is not None or self.temporal_tls_cert is not None


def setting_names() -> set[str]:
    """Every environment variable the settings model reads."""
    return {ENV_PREFIX + name.upper() for name in Settings.model_fields}


def load_settings(**overrides: object) -> Settings:
    """Read the settings, turning a validation failure into one line that names the setting."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as error:
        first = error.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        name = ENV_PREFIX + field.upper() if field else "settings"
        message = str(first["msg"]).removeprefix("Value error, ")
        raise ConfigError(f"invalid setting {name}: {message}") from None
