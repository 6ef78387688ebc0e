"""A Spark standalone cluster for tests: a master and one worker from the pyspark wheel, with the
master's REST submission API enabled. On loopback (the integration tests) every port is a free
one; on a test cluster's `spark` host (procbus.testing.cluster) it listens on that host's address
only, inside its network namespace, on Spark's usual ports. Its drivers (cluster deploy mode)
run on the worker, in the same namespace: `drivers()` finds them and `kill_drivers()` is the
nemesis's "kill the Spark driver of a running job"."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from procbus.errors import StackError
from procbus.stack import free_port

MASTER_PORT, REST_PORT, WEB_PORT = 7077, 6066, 8080
# The JVM class a standalone worker runs each driver as (its Python job is that JVM's child).
DRIVER_CLASS = "org.apache.spark.deploy.worker.DriverWrapper"


class SparkCluster:
    """A Spark standalone master and one worker, listening on `host` only (inside `netns` when
    given), its REST submission API on the same address."""

    def __init__(
        self,
        folder: Path,
        *,
        host: str = "127.0.0.1",
        netns: str | None = None,
        cores: int = 4,
        memory: str = "4g",
        max_drivers: int | None = None,
    ) -> None:
        import pyspark

        self.folder = folder
        # The worker's: each running driver holds one core and 1 GiB of them, and its executor
        # needs some left, so drivers that take it all wait for executors forever. The master
        # runs at most `max_drivers` at once (half the cores by default) and queues the rest.
        self.cores, self.memory = cores, memory
        self.max_drivers = max_drivers or max(1, cores // 2)
        # An application takes every free core unless told otherwise: the first running
        # driver's executor would leave the others' none, and they would run one after another.
        self.cores_per_application = max(1, (cores - self.max_drivers) // self.max_drivers)
        self.host = host
        self.netns = netns
        self.spark_home = Path(pyspark.__file__).parent
        if netns is None:  # loopback is shared with everything else on the machine
            self.port, self.rest_port, self.web_port = free_port(), free_port(), free_port()
        else:
            self.port, self.rest_port, self.web_port = MASTER_PORT, REST_PORT, WEB_PORT
        self.master = f"spark://{host}:{self.port}"
        self.rest_url = f"http://{host}:{self.rest_port}"
        self.web_url = f"http://{host}:{self.web_port}"
        self.processes: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, *args: str) -> None:
        env = {**os.environ, "SPARK_HOME": str(self.spark_home), "SPARK_LOCAL_IP": self.host}
        command = [str(self.spark_home / "bin" / "spark-class"), *args]
        if self.netns is not None:  # `ip netns exec` execs it: the same process, and group
            command = ["ip", "netns", "exec", self.netns, *command]
        log = (self.folder / f"spark-{name}.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                command,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its drivers and executors go with its group
            )
        )

    def up(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        properties = self.folder / "master.conf"
        properties.write_text(
            "spark.master.rest.enabled true\n"
            f"spark.master.rest.host {self.host}\n"
            f"spark.master.rest.port {self.rest_port}\n"
            f"spark.deploy.maxDrivers {self.max_drivers}\n"
            f"spark.deploy.defaultCores {self.cores_per_application}\n"
            "spark.ui.reverseProxy true\n"
            f"spark.ui.reverseProxyUrl {self.web_url}\n"
        )
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", self.host,
            "--port", str(self.port),
            "--webui-port", str(self.web_port),
            "--properties-file", str(properties),
        )  # fmt: skip
        self._start(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            self.master,
            "--host", self.host,
            "--webui-port", "0",
            "--cores", str(self.cores),
            "--memory", self.memory,
            "--work-dir", str(self.folder / "work"),
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                if self.state().get("aliveworkers"):
                    return
            time.sleep(0.3)
        raise StackError(f"the Spark cluster did not come up: {self.log('master')}")

    def state(self) -> dict[str, Any]:
        """The master's view: workers, applications and drivers (its web UI's JSON)."""
        reply: dict[str, Any] = httpx.get(f"{self.web_url}/json/", timeout=5).json()
        return reply

    def log(self, name: str) -> str:
        return (self.folder / f"spark-{name}.log").read_text()[-3000:]

    def driver_state(self, submission_id: str) -> str:
        reply = httpx.get(f"{self.rest_url}/v1/submissions/status/{submission_id}").json()
        return str(reply.get("driverState"))

    def drivers(self, submission_id: str | None = None) -> list[int]:
        """The process IDs of the drivers running on the worker now: all of them, or the one of
        `submission_id` (the worker starts each driver in a folder named after it)."""
        found = []
        for process in Path("/proc").iterdir():
            if not process.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                command = (process / "cmdline").read_bytes().split(b"\0")
                if DRIVER_CLASS.encode() not in command:
                    continue
                folder = Path(os.readlink(process / "cwd"))
                if submission_id is not None and folder.name != submission_id:
                    continue
                if self._launched_here(int(process.name)):
                    found.append(int(process.name))
        return sorted(found)

    def _launched_here(self, pid: int) -> bool:
        """Whether `pid` descends from this cluster's worker (another cluster's, or a test's,
        drivers are not ours to kill)."""
        ours = {process.pid for process in self.processes}
        while pid > 1:
            if pid in ours:
                return True
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                return False
            pid = int(next(line for line in status.splitlines() if line.startswith("PPid:"))[5:])
        return False

    def kill_drivers(self, submission_id: str | None = None) -> int:
        """SIGKILL every running driver (or the one of `submission_id`) with its Python job, as
        a crash of the host it ran on would; the cluster's worker sees it end. Returns how many
        there were."""
        drivers = self.drivers(submission_id)
        for driver in drivers:
            for pid in [*_descendants(driver), driver]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return len(drivers)

    def down(self) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _descendants(pid: int) -> list[int]:
    """Every process under `pid`, children before their parents' siblings. Each thread lists
    the children it started (a JVM starts its Python job from a thread other than its first)."""
    direct: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                direct += [int(child) for child in (task / "children").read_text().split()]
    return [grandchild for child in direct for grandchild in [*_descendants(child), child]]
