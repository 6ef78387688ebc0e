"""docker-compose.yml cannot run here (no Docker engine): check what can be checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from procbus.config import setting_names
from procbus.stack.temporal_server import SEARCH_ATTRIBUTES

PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((PROJECT / "docker-compose.yml").read_text())
    return loaded


def test_the_whole_system_is_there(compose: dict[str, Any]) -> None:
    assert {
        "postgresql",
        "temporal",
        "temporal-ui",
        "temporal-search-attributes",
        "spark-master",
        "spark-worker",
        "kafka",
        "procbus-worker",
    } <= set(compose["services"])


def test_three_procbus_workers_under_their_own_ids_and_two_spark_workers(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    workers = [s for name, s in services.items() if name.startswith("procbus-worker")]
    assert len(workers) == 3
    assert {w["environment"]["PROCBUS_WORKER_ID"] for w in workers} == {
        "worker-1",
        "worker-2",
        "worker-3",
    }
    assert all(w["command"] == ["procbus", "worker"] for w in workers)
    spark_workers = [s for name, s in services.items() if name.startswith("spark-worker")]
    assert len(spark_workers) == 2
    assert all("spark://spark-master:7077" in s["command"] for s in spark_workers)


def test_images_are_pinned(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        image = service.get("image")
        if image is None:
            assert "build" in service, name
            continue
        repository, _, tag = image.rpartition(":")
        assert repository and tag and tag != "latest", f"{name}: pin {image}"


def test_long_running_services_have_health_checks(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        if service.get("restart") == "no":  # one-shot jobs
            continue
        assert "healthcheck" in service, name
        assert service["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name


def test_ports_are_published_on_loopback_only(compose: dict[str, Any]) -> None:
    published = {}
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"
            published[int(port.split(":")[1])] = name
    assert published[7233] == "temporal"
    assert published[8233] == "temporal-ui"
    assert published[5432] == "postgresql"
    assert published[7077] == "spark-master"


def test_dependencies_name_real_services(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], dependency


def test_every_procbus_setting_exists(compose: dict[str, Any]) -> None:
    used = {
        key
        for service in compose["services"].values()
        for key in (service.get("environment") or {})
        if key.startswith("PROCBUS_")
    }
    assert used, "no service sets a PROCBUS_ setting"
    assert used <= setting_names(), used - setting_names()
    worker = compose["services"]["procbus-worker"]["environment"]
    assert worker["PROCBUS_TEMPORAL_ADDRESS"] == "temporal:7233"
    assert worker["PROCBUS_DATABASE_URL"].startswith("postgresql://")


def test_the_search_attributes_are_created(compose: dict[str, Any]) -> None:
    script = " ".join(compose["services"]["temporal-search-attributes"]["command"])
    assert "--type Keyword" in script
    for name in SEARCH_ATTRIBUTES:
        assert name in script
