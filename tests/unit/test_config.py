from __future__ import annotations

from itertools import islice
from pathlib import Path

import pytest

from procbus.config import load_settings, setting_names
from procbus.delivery.dispatch import idle_waits
from procbus.errors import ConfigError


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in setting_names():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no stray .env


def test_defaults_use_the_embedded_stack() -> None:
    settings = load_settings()
    assert settings.temporal_address is None
    assert settings.database_url is None
    assert settings.task_queue == "procbus"
    assert settings.spark_master == "local[*]"
    assert settings.warehouse_root == Path(".procbus") / "warehouse"


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROCBUS_TEMPORAL_ADDRESS", "temporal.internal:7233")
    monkeypatch.setenv("PROCBUS_DATABASE_URL", "postgresql://app:secret@db.internal:5432/procbus")
    monkeypatch.setenv("PROCBUS_SPARK_MASTER", "spark://spark-master:7077")
    monkeypatch.setenv("PROCBUS_WAREHOUSE", "/data/warehouse")
    settings = load_settings()
    assert settings.temporal_address == "temporal.internal:7233"
    assert settings.database_url is not None
    assert "secret" not in repr(settings)  # the password never reaches a log line
    assert settings.warehouse_root == Path("/data/warehouse")


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("PROCBUS_DATABASE_URL", "mysql://db:3306/x", "expected a postgresql:// URL"),
        ("PROCBUS_DATABASE_URL", "postgresql://db:port/x", "port that is not a number"),
        ("PROCBUS_DATABASE_URL", "postgresql:///x", "names no host"),
        ("PROCBUS_TEMPORAL_ADDRESS", "http://temporal:7233", "expected host:port"),
        ("PROCBUS_TEMPORAL_ADDRESS", "temporal:99999", "expected host:port"),
        ("PROCBUS_SPARK_MASTER", "yarn", "expected local[*]"),
        ("PROCBUS_SPARK_MASTER", "spark://nohost", "expected host:port"),
        ("PROCBUS_TASK_QUEUE", "queue with spaces", "expected letters"),
        ("PROCBUS_DEV_TEMPORAL_PORT", "70000", "less than or equal to 65535"),
        ("PROCBUS_TEMPORAL_TLS_CA", "/no/such/ca.pem", "no such file"),
        ("PROCBUS_LOAD_ROOTS", "/data/in,incoming", "expected absolute folders"),
        ("PROCBUS_DELIVERY_POLL_MAX_SECONDS", "0.001", "greater than or equal to 0.05"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, says: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as raised:
        load_settings()
    message = str(raised.value)
    assert message.startswith(f"invalid setting {name}: ")
    assert says in message
    assert "\n" not in message


def test_loads_read_from_the_warehouse_incoming_folder_unless_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PROCBUS_WAREHOUSE", "/data/warehouse")
    assert load_settings().load_root_paths == [Path("/data/warehouse/incoming")]
    monkeypatch.setenv("PROCBUS_LOAD_ROOTS", "/data/in, /mnt/exports")
    assert load_settings().load_root_paths == [Path("/data/in"), Path("/mnt/exports")]


def test_an_idle_delivery_looks_at_its_queue_at_most_as_far_apart_as_the_poll_max(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert list(islice(idle_waits(load_settings().delivery_poll_max_seconds), 6)) == [
        0.05,
        0.1,
        0.2,
        0.4,
        0.5,
        0.5,
    ]
    monkeypatch.setenv("PROCBUS_DELIVERY_POLL_MAX_SECONDS", "0.15")
    assert list(islice(idle_waits(load_settings().delivery_poll_max_seconds), 4)) == [
        0.05,
        0.1,
        0.15,
        0.15,
    ]


def test_tls_certificate_and_key_go_together(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cert = tmp_path / "client.pem"
    cert.write_text("cert")
    monkeypatch.setenv("PROCBUS_TEMPORAL_TLS_CERT", str(cert))
    with pytest.raises(ConfigError, match="must be set together"):
        load_settings()


def test_setting_names_cover_the_documented_ones() -> None:
    documented = {
        "PROCBUS_TEMPORAL_ADDRESS",
        "PROCBUS_TEMPORAL_NAMESPACE",
        "PROCBUS_TEMPORAL_TLS_CERT",
        "PROCBUS_TEMPORAL_TLS_KEY",
        "PROCBUS_TEMPORAL_TLS_CA",
        "PROCBUS_TEMPORAL_API_KEY",
        "PROCBUS_TASK_QUEUE",
        "PROCBUS_DATABASE_URL",
        "PROCBUS_WAREHOUSE",
        "PROCBUS_SPARK_MASTER",
        "PROCBUS_STATE_DIR",
        "PROCBUS_LOAD_ROOTS",
    }
    assert documented <= setting_names()
