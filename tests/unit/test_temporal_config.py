"""Which Temporal a command talks to: flag > PROCBUS_* > TEMPORAL_* and temporal.toml > dev stack.

No server: the resolution alone, on an environment each test writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.service import TLSConfig
from typer.testing import CliRunner

from procbus.config import Settings, load_settings, setting_names
from procbus.errors import ConfigError, StackError
from procbus.stack.addresses import (
    resolve_addresses,
    resolve_database_url,
    resolve_temporal,
    uses_embedded_stack,
)
from procbus.stack.state import StackInfo, StackLock, write_stack
from procbus.starter.cli import app
from procbus.temporal.connection import configured_temporal

PROFILES = """
[profile.default]
address = "default.example:7233"

[profile.prod]
address = "prod.example:7233"
namespace = "prod-ns"
api_key = "prod-key"

[profile.mtls]
address = "mtls.example:7233"
[profile.mtls.tls]
server_name = "temporal.internal"
server_ca_cert_data = "CA FROM PROFILE"
"""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in setting_names():
        monkeypatch.delenv(name, raising=False)
    for name in ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_PROFILE", "TEMPORAL_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    # No user's ~/.config/temporalio/temporal.toml: an empty file stands for none.
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", "/dev/null")
    monkeypatch.chdir(tmp_path)  # no stray .env


@pytest.fixture
def toml(tmp_path: Path) -> Path:
    path = tmp_path / "temporal.toml"
    path.write_text(PROFILES)
    return path


@pytest.fixture
def dev_stack(tmp_path: Path) -> Iterator[Path]:
    """A state folder a `procbus dev` seems to run on: its stack.json, its lock held."""
    state_dir = tmp_path / "state"
    lock = StackLock(state_dir)
    lock.acquire()
    info = StackInfo(
        pid=1,
        temporal_address="127.0.0.1:7233",
        namespace="dev-ns",
        ui_url="http://127.0.0.1:8233",
        database_url="postgresql://dev@127.0.0.1:5432/procbus",
        task_queue="procbus",
        postgres_pid=1,
        temporal_pid=1,
        started_at=datetime.now(UTC),
    )
    write_stack(state_dir, info)
    yield state_dir
    lock.release()


def test_temporal_address_alone_is_enough_for_a_temporal_command(tmp_path: Path) -> None:
    environ = {"TEMPORAL_ADDRESS": "temporal.example:7233", "TEMPORAL_NAMESPACE": "orders"}
    services = resolve_temporal(Settings(state_dir=tmp_path / "none"), environ)
    assert (services.temporal_address, services.namespace) == ("temporal.example:7233", "orders")
    assert services.source == "settings"
    assert services.temporal_options.tls is False


def test_procbus_settings_beat_temporal_variables_which_beat_the_profile(toml: Path) -> None:
    environ = {"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_PROFILE": "prod"}
    settings = Settings()
    assert configured_temporal(settings, environ).address == "prod.example:7233"
    assert configured_temporal(settings, environ).namespace == "prod-ns"
    environ |= {"TEMPORAL_ADDRESS": "env.example:7233", "TEMPORAL_NAMESPACE": "env-ns"}
    found = configured_temporal(settings, environ)
    assert (found.address, found.namespace) == ("env.example:7233", "env-ns")
    assert found.address_from == "TEMPORAL_ADDRESS"
    mine = Settings(temporal_address="mine.example:7233", temporal_namespace="mine")
    found = configured_temporal(mine, environ)
    assert (found.address, found.namespace) == ("mine.example:7233", "mine")
    assert found.address_from == "PROCBUS_TEMPORAL_ADDRESS"
    assert found.options.api_key == "prod-key"  # what PROCBUS_* leave unset still comes through


def test_the_profile_setting_beats_temporal_profile(toml: Path) -> None:
    environ = {"TEMPORAL_CONFIG_FILE": str(toml), "TEMPORAL_PROFILE": "prod"}
    assert configured_temporal(Settings(), {"TEMPORAL_CONFIG_FILE": str(toml)}).address == (
        "default.example:7233"
    )
    found = configured_temporal(Settings(temporal_profile="mtls"), environ)
    assert found.address == "mtls.example:7233"
    assert found.address_from == "temporal.toml"
    assert found.options.tls == TLSConfig(
        domain="temporal.internal", server_root_ca_cert=b"CA FROM PROFILE"
    )


def test_a_missing_profile_is_an_error_naming_it(toml: Path) -> None:
    with pytest.raises(ConfigError, match="profile 'staging'.*not found"):
        configured_temporal(
            Settings(temporal_profile="staging"), {"TEMPORAL_CONFIG_FILE": str(toml)}
        )


def test_tls_and_api_key_from_either_side(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"PROCBUS CA")
    environ = {
        "TEMPORAL_ADDRESS": "cloud.example:7233",
        "TEMPORAL_API_KEY": "env-key",
        "TEMPORAL_GRPC_META_X_TENANT": "sales",
    }
    options = configured_temporal(Settings(), environ).options
    assert (options.tls, options.api_key) == (True, "env-key")  # an API key means TLS
    assert options.rpc_metadata == {"x-tenant": "sales"}
    assert configured_temporal(Settings(), environ | {"TEMPORAL_TLS": "false"}).options.tls is False
    # PROCBUS_TEMPORAL_TLS_CA over TEMPORAL_TLS_SERVER_CA_CERT_DATA; the server name stays.
    environ |= {
        "TEMPORAL_TLS_SERVER_CA_CERT_DATA": "TEMPORAL CA",
        "TEMPORAL_TLS_SERVER_NAME": "cloud.internal",
    }
    tls = configured_temporal(Settings(temporal_tls_ca=ca), environ).options.tls
    assert tls == TLSConfig(domain="cloud.internal", server_root_ca_cert=b"PROCBUS CA")
    with pytest.raises(ConfigError, match="cannot read /no/such/cert.pem"):
        configured_temporal(Settings(), {"TEMPORAL_TLS_CLIENT_CERT_PATH": "/no/such/cert.pem"})


def test_a_database_command_never_takes_the_dev_stacks_database_beside_your_temporal(
    dev_stack: Path,
) -> None:
    settings = Settings(state_dir=dev_stack)
    assert resolve_database_url(settings, {}) == "postgresql://dev@127.0.0.1:5432/procbus"
    environ = {"TEMPORAL_ADDRESS": "temporal.example:7233"}
    with pytest.raises(ConfigError, match=r"PROCBUS_DATABASE_URL is not set.*TEMPORAL_ADDRESS"):
        resolve_database_url(settings, environ)
    with pytest.raises(ConfigError, match="PROCBUS_DATABASE_URL is not set"):
        resolve_addresses(settings, environ)
    # Temporal alone is what a status read needs: it is there.
    assert resolve_temporal(settings, environ).temporal_address == "temporal.example:7233"
    assert not uses_embedded_stack(
        Settings(
            state_dir=dev_stack,
            temporal_address="t:7233",
            database_url="postgresql://app@db/procbus",
        )
    )


def test_the_dev_stack_fills_in_only_what_nothing_configures(dev_stack: Path) -> None:
    services = resolve_addresses(Settings(state_dir=dev_stack), {"TEMPORAL_NAMESPACE": "cloud"})
    # TEMPORAL_* describe another server: the dev stack keeps its own namespace, no TLS.
    assert (services.temporal_address, services.namespace) == ("127.0.0.1:7233", "dev-ns")
    assert services.source == "embedded"
    assert services.temporal_options.tls is False
    named = resolve_temporal(Settings(state_dir=dev_stack, temporal_namespace="other"), {})
    assert named.namespace == "other"  # --namespace on the dev server
    assert uses_embedded_stack(Settings(state_dir=dev_stack))


def test_nothing_configured_and_no_stack_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(StackError, match="or set PROCBUS_TEMPORAL_ADDRESS \\(or TEMPORAL_ADDRESS"):
        resolve_temporal(Settings(state_dir=tmp_path), {})
    with pytest.raises(StackError, match="or set PROCBUS_DATABASE_URL$"):
        resolve_database_url(Settings(state_dir=tmp_path), {})


def test_the_flags_beat_every_setting(monkeypatch: pytest.MonkeyPatch, toml: Path) -> None:
    for name in ("PROCBUS_TEMPORAL_NAMESPACE", "PROCBUS_TEMPORAL_PROFILE"):
        monkeypatch.setenv(name, "")  # the flags set them: restored after the test
        monkeypatch.delenv(name)
    monkeypatch.setenv("PROCBUS_TEMPORAL_ADDRESS", "procbus.example:7233")
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(toml))
    # A database command, so it refuses before any connection, naming the address it took.
    result = CliRunner().invoke(app, ["--address", "flag.example:7233", "lock", "list"])
    assert isinstance(result.exception, ConfigError)
    assert "Temporal at flag.example:7233" in str(result.exception)
    monkeypatch.delenv("PROCBUS_TEMPORAL_ADDRESS")
    result = CliRunner().invoke(app, ["--profile", "prod", "--namespace", "n1", "lock", "list"])
    assert "Temporal at prod.example:7233 (temporal.toml)" in str(result.exception)
    settings = load_settings()  # what the flags left for the command's settings
    assert (settings.temporal_profile, settings.temporal_namespace) == ("prod", "n1")
