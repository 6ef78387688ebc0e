"""A RabbitMQ broker of the OS package (`apt-get install rabbitmq-server`), started by a test on
ports of its own (the AMQP port, the distribution port and its own epmd): on loopback, or on a
cluster host's address inside its network namespace (procbus.testing.cluster). Its data outlives
a restart."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

from procbus.stack import LOOPBACK, free_port

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
RABBITMQ_CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"


class RabbitMQ:
    def __init__(
        self,
        folder: Path,
        *,
        host: str = LOOPBACK,
        port: int | None = None,
        netns: str | None = None,
    ) -> None:
        """On `host`:`port` (a free loopback port by default); in the namespace `netns`, its
        other ports on that namespace's loopback, and `guest` may log in from other hosts."""
        self.folder = folder
        self.host = host
        self.port = port or free_port()
        self.netns = netns
        self.node = f"procbus-test-{uuid.uuid4().hex[:6]}@localhost"
        # In a namespace of its own, a fixed port cannot collide with another run's.
        distribution, epmd = (25672, 4369) if netns else (free_port(), free_port())
        self.env = {
            **os.environ,
            "HOME": str(folder),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": host,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(distribution),
            "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(folder / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq.conf"),
            "ERL_EPMD_ADDRESS": LOOPBACK,
            "ERL_EPMD_PORT": str(epmd),
            # Schedulers that sleep when idle instead of spinning (RabbitMQ's advice for shared
            # hosts): the broker shares its cores with the test and the rest of the suite.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                "-kernel inet_dist_use_interface {127,0,0,1}"
                " +sbwt none +sbwtdcpu none +sbwtdio none"
            ),
        }
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "enabled_plugins").write_text("[].\n")
        # `guest` logs in from loopback only, unless told otherwise: a cluster's clients are on
        # other hosts.
        (folder / "rabbitmq.conf").write_text("loopback_users = none\n" if netns else "")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/"

    def _command(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)

    def start(self, timeout: float = 60.0) -> None:
        if not Path(RABBITMQ_SERVER).is_file():
            raise AssertionError(
                "RabbitMQ is missing: `make test` installs it when run as root; otherwise: "
                "sudo apt-get install -y --no-install-recommends rabbitmq-server"
            )
        log = (self.folder / "server.log").open("ab")
        self.process = subprocess.Popen(
            self._command(RABBITMQ_SERVER), env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError((self.folder / "server.log").read_text()[-2000:])
            ready = subprocess.run(
                self._command(RABBITMQ_CTL, "-n", self.node, "await_startup", "--timeout", "5"),
                env=self.env,
                capture_output=True,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.5)
        raise AssertionError(f"RabbitMQ did not start in {timeout:g} s")

    def stop(self) -> None:
        if self.process is None:
            return
        subprocess.run(
            self._command(RABBITMQ_CTL, "-n", self.node, "stop"),
            env=self.env,
            capture_output=True,
            timeout=60,
        )
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def close(self) -> None:
        """Stop the broker and the epmd it started."""
        self.stop()
        subprocess.run(
            self._command("epmd", "-port", self.env["ERL_EPMD_PORT"], "-kill"),
            env=self.env,
            capture_output=True,
        )
