"""Which Temporal server and namespace the settings name, and how to connect to it.

Temporal's own client configuration (`temporalio.envconfig`: TEMPORAL_ADDRESS,
TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS_*, the profiles of `temporal.toml` chosen by
TEMPORAL_PROFILE) gives what procbus's own settings (PROCBUS_TEMPORAL_*, which the CLI's
`--address`, `--namespace` and `--profile` set) leave unset, field by field.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.envconfig import ClientConfigProfile, ClientConfigTLS
from temporalio.service import TLSConfig

from procbus.config import Settings
from procbus.errors import ConfigError


@dataclass(frozen=True)
class TemporalOptions:
    """How a client connects, beside the address and namespace: TLS, API key, gRPC metadata."""

    tls: TLSConfig | bool = False
    api_key: str | None = field(default=None, repr=False)
    rpc_metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ConfiguredTemporal:
    """What the settings and Temporal's configuration name; None where they name nothing."""

    address: str | None
    namespace: str | None
    options: TemporalOptions
    # The setting that named the address, for messages: "PROCBUS_TEMPORAL_ADDRESS", ...
    address_from: str | None = None


def temporal_profile(settings: Settings, environ: Mapping[str, str]) -> ClientConfigProfile:
    """Return Temporal's client configuration: the chosen profile with TEMPORAL_* applied.

    Args:
        settings: procbus's settings (PROCBUS_TEMPORAL_PROFILE chooses the profile first).
        environ: the environment to read TEMPORAL_* from.

    Raises:
        ConfigError: when the chosen profile does not exist or temporal.toml cannot be read.
    """
    try:
        return ClientConfigProfile.load(settings.temporal_profile, override_env_vars=dict(environ))
    except Exception as error:  # the bridge's ConfigError, or an unreadable file
        chosen = settings.temporal_profile or environ.get("TEMPORAL_PROFILE") or "default"
        raise ConfigError(
            f"cannot load Temporal's client configuration (profile {chosen!r} of "
            f"{environ.get('TEMPORAL_CONFIG_FILE') or 'temporal.toml'}): {error}"
        ) from None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None


def _source(value: Path | str | bytes | None) -> bytes | None:
    if isinstance(value, Path):
        return _read(value)
    return value.encode() if isinstance(value, str) else value


def _tls(
    settings: Settings, profile: ClientConfigTLS | None, api_key: str | None
) -> TLSConfig | bool:
    """PROCBUS_TEMPORAL_TLS_* over Temporal's TLS settings; an API key alone means TLS on."""
    if not settings.uses_tls:
        if profile is None:
            return api_key is not None  # Temporal Cloud: TLS with the system's CA roots
        if profile.disabled:
            return False
    base = profile or ClientConfigTLS()
    ca, cert, key = settings.temporal_tls_ca, settings.temporal_tls_cert, settings.temporal_tls_key
    return TLSConfig(
        domain=base.server_name,
        server_root_ca_cert=_read(ca) if ca else _source(base.server_root_ca_cert),
        # The certificate and its key come as a pair, from one place.
        client_cert=_read(cert) if cert else _source(base.client_cert),
        client_private_key=_read(key) if key else _source(base.client_private_key),
    )


def configured_temporal(
    settings: Settings, environ: Mapping[str, str] | None = None
) -> ConfiguredTemporal:
    """Return the Temporal the settings name: PROCBUS_TEMPORAL_* over TEMPORAL_* over the profile.

    Args:
        settings: procbus's settings.
        environ: the environment for Temporal's variables; the process's when None.

    Raises:
        ConfigError: when Temporal's configuration cannot be loaded, or names a file that cannot
            be read.
    """
    environ = os.environ if environ is None else environ
    profile = temporal_profile(settings, environ)
    address, address_from = settings.temporal_address, "PROCBUS_TEMPORAL_ADDRESS"
    if address is None and profile.address:
        address = profile.address
        address_from = "TEMPORAL_ADDRESS" if environ.get("TEMPORAL_ADDRESS") else "temporal.toml"
    namespace = profile.namespace or None
    if "temporal_namespace" in settings.model_fields_set:
        namespace = settings.temporal_namespace
    api_key = (
        settings.temporal_api_key.get_secret_value()
        if settings.temporal_api_key is not None
        else profile.api_key or None
    )
    options = TemporalOptions(
        tls=_tls(settings, profile.tls, api_key),
        api_key=api_key,
        rpc_metadata=dict(profile.grpc_meta),
    )
    return ConfiguredTemporal(address, namespace, options, address_from if address else None)
