"""ProcbusPlugin adapts the user's Temporal setup, without a server: their data converter keeps
its codec and failure converter, their sandbox its restrictions, their interceptors their place;
PROCBUS_PAYLOAD_CODEC names a codec or says what is wrong with it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, cast

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import ClientConfig, Interceptor
from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverter,
    DefaultPayloadConverter,
)
from temporalio.worker import ReplayerConfig, UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from examples.codec import ENCODING, CompressionCodec
from procbus import ProcbusPlugin
from procbus.config import Settings, load_settings, setting_names
from procbus.engine import procbus_runner, workflow_runner
from procbus.engine.runner import PASSED_THROUGH
from procbus.errors import ConfigError, encoded_payload_error
from procbus.temporal import (
    ProcbusPayloadConverter,
    client_data_converter,
    load_payload_codec,
    procbus_data_converter,
    with_procbus_payloads,
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in setting_names():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no stray .env


class UsersFailureConverter(DefaultFailureConverter):
    def __init__(self) -> None:
        super().__init__(encode_common_attributes=True)


class UsersPayloadConverter(DefaultPayloadConverter):
    pass


class UsersClientInterceptor(Interceptor):
    pass


def test_the_users_codec_and_failure_converter_stay_beside_procbuss_payload_converter() -> None:
    codec = CompressionCodec()
    users = DataConverter(payload_codec=codec, failure_converter_class=UsersFailureConverter)
    adapted = with_procbus_payloads(users)
    assert adapted.payload_converter_class is ProcbusPayloadConverter
    assert adapted.payload_codec is codec
    assert adapted.failure_converter_class is UsersFailureConverter


def test_pydantics_converter_becomes_procbuss_and_procbuss_own_stays() -> None:
    assert with_procbus_payloads(None) is procbus_data_converter
    assert with_procbus_payloads(procbus_data_converter) is procbus_data_converter
    adapted = with_procbus_payloads(pydantic_data_converter)
    assert adapted.payload_converter_class is ProcbusPayloadConverter
    assert issubclass(ProcbusPayloadConverter, PydanticPayloadConverter)


def test_a_payload_converter_of_the_users_own_is_refused_saying_why() -> None:
    users = DataConverter(payload_converter_class=UsersPayloadConverter)
    with pytest.raises(ConfigError, match="cannot use the payload converter UsersPayloadConverter"):
        with_procbus_payloads(users)


def test_the_plugin_on_a_client_keeps_its_codec_and_interceptors() -> None:
    codec, mine = CompressionCodec(), UsersClientInterceptor()
    plugin = ProcbusPlugin(Settings(), tracing=False)
    config = plugin.configure_client(
        cast(
            ClientConfig,
            {"data_converter": DataConverter(payload_codec=codec), "interceptors": [mine]},
        )
    )
    assert config["data_converter"].payload_codec is codec
    assert config["data_converter"].payload_converter_class is ProcbusPayloadConverter
    assert list(config["interceptors"]) == [mine]  # procbus's are worker interceptors only


def test_the_plugin_on_a_replayer_keeps_its_sandbox_and_converter() -> None:
    restrictions = SandboxRestrictions.default.with_passthrough_modules("users_module")
    codec = CompressionCodec()
    plugin = ProcbusPlugin(Settings(), tracing=False)
    config = plugin.configure_replayer(
        cast(
            ReplayerConfig,
            {
                "workflow_runner": SandboxedWorkflowRunner(restrictions=restrictions),
                "data_converter": DataConverter(payload_codec=codec),
            },
        )
    )
    runner = config["workflow_runner"]
    assert isinstance(runner, SandboxedWorkflowRunner)
    assert {"users_module", *PASSED_THROUGH} <= runner.restrictions.passthrough_modules
    assert config["data_converter"].payload_codec is codec


def test_procbuss_modules_join_the_users_sandbox_restrictions() -> None:
    restrictions = SandboxRestrictions.default.with_passthrough_modules("users_module")
    restrictions = restrictions.with_passthrough_all_modules()
    runner = procbus_runner(SandboxedWorkflowRunner(restrictions=restrictions))
    assert isinstance(runner, SandboxedWorkflowRunner)
    assert runner.restrictions.passthrough_all_modules  # theirs, kept
    assert {"users_module", *PASSED_THROUGH} <= runner.restrictions.passthrough_modules


def test_an_unsandboxed_runner_stays_and_none_gets_procbuss_sandbox() -> None:
    unsandboxed = UnsandboxedWorkflowRunner()
    assert procbus_runner(unsandboxed) is unsandboxed
    assert procbus_runner(None) == workflow_runner()


def test_the_codec_setting_loads_a_codec_that_round_trips() -> None:
    converter = client_data_converter("examples.codec:CompressionCodec")
    assert isinstance(converter.payload_codec, CompressionCodec)
    assert converter.payload_converter_class is ProcbusPayloadConverter
    assert client_data_converter(None) is procbus_data_converter

    async def round_trip() -> tuple[list[Payload], list[Any]]:
        encoded = await converter.encode([{"table": "orders"}])
        return encoded, await converter.decode(encoded)

    encoded, decoded = asyncio.run(round_trip())
    assert encoded[0].metadata["encoding"] == ENCODING and b"orders" not in encoded[0].data
    assert decoded == [{"table": "orders"}]


def test_a_payload_read_without_its_codec_is_one_error_naming_the_setting() -> None:
    async def read_without_codec() -> None:
        encoded = await client_data_converter("examples.codec:CompressionCodec").encode(["x"])
        await procbus_data_converter.decode(encoded)

    with pytest.raises(KeyError) as raised:  # Temporal's own error, matched by its message
        asyncio.run(read_without_codec())
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = raised.value  # found in what caused an error too
    for error in (raised.value, wrapped):
        found = encoded_payload_error(error)
        assert found is not None and "(encoding 'binary/zlib')" in str(found)
        assert "set PROCBUS_PAYLOAD_CODEC=package.module:factory" in str(found)
    assert encoded_payload_error(KeyError("table")) is None
    assert encoded_payload_error(RuntimeError("other")) is None


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("examples.no_such:Codec", "module 'examples.no_such' does not import: ModuleNotFound"),
        ("examples.codec:Nothing", "module 'examples.codec' has no callable 'Nothing'"),
        ("examples.codec:ENCODING", "module 'examples.codec' has no callable 'ENCODING'"),
        ("collections:OrderedDict", "OrderedDict() returned OrderedDict, not a temporalio"),
        ("json:dumps", "dumps() failed: TypeError"),
    ],
)
def test_a_wrong_codec_setting_says_what_is_wrong_and_which_setting(path: str, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"PROCBUS_PAYLOAD_CODEC={path}: {says}")):
        load_payload_codec(path)


@pytest.mark.parametrize("value", ["examples.codec", "examples.codec:", ":Codec", "a b:Codec"])
def test_a_codec_setting_not_shaped_module_colon_factory_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("PROCBUS_PAYLOAD_CODEC", value)
    with pytest.raises(ConfigError, match="PROCBUS_PAYLOAD_CODEC: expected package.module:factory"):
        load_settings()
