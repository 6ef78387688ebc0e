"""A procbus cluster on one machine: hosts in network namespaces on one bridge, each service
listening on its own host's address only, and the faults a nemesis injects between them.

Hosts (docs/internals/testing.md): `db` (PostgreSQL), `temporal` (the Temporal server),
workers `w1`, `w2`, ... (each a `procbus worker` with its own worker ID) and, when asked for,
`sink` (a webhook receiver that journals every request, procbus.testing.sink) and `spark` (a
standalone master and worker, procbus.testing.spark). The machine itself is
on the bridge too, as the first address, so the harness and the `procbus` CLI reach every host;
the network is a private /24 with no route off the machine.

Needs root (network namespaces) and nftables (a partition is a drop rule inside a host's
namespace); `make test` installs nftables when it can, and `require_cluster_tools()` says what
is missing otherwise.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from procbus.errors import StackError
from procbus.stack import (
    DevTemporalServer,
    EmbeddedPostgres,
    KafkaBroker,
    ManagedProcess,
    service_dir,
    wait_for_port,
)
from procbus.testing.rabbitmq import RabbitMQ
from procbus.testing.sink import read_journal
from procbus.testing.spark import SparkCluster

# Namespaces of a cluster are named for the process that made it, so a later run can tell a
# dead run's leftovers (its process gone) from a live one's.
NAME_PREFIX = "pbc"
# The /24s a cluster picks from: private, and checked against the machine's own routes.
SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
POSTGRES_PORT = 5432
TEMPORAL_PORT = 7233
# With `latency=True`, worker wN reaches each server through a delaying proxy on the server's
# host (procbus.testing.proxy), on this port plus N.
PROXY_PORTS = {"db": 15430, "temporal": 17230}
KAFKA_PORT = 9092  # with `kafka=True`: a Kafka broker (Tansu) on the sink host
AMQP_PORT = 5672  # with `amqp=True`: a RabbitMQ broker on the sink host
SINK_PORT = 8080
OPERATOR = "operator"


def require_cluster_tools() -> None:
    """Fail with what to do when this machine cannot build a cluster."""
    if os.geteuid() != 0:
        raise StackError(
            "a procbus test cluster puts each host in its own network namespace, which needs "
            "root: run the cluster tests as root (in a container or VM of your own)"
        )
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("setpriv", "util-linux")):
        if shutil.which(tool) is None:
            raise StackError(
                f"`{tool}` is missing: a procbus test cluster needs it; install it with "
                f"`apt-get install -y {package}` (or `make test`, which does so as root)"
            )


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(f"ip {' '.join(args)}: {result.stderr.strip()}")


def _peer_in(name: str, netns: str) -> list[str]:
    """The arguments that put a veth link's peer, named `name`, in `netns`."""
    return ["peer", "name", name, "netns", netns]


def _in_netns(netns: str, *argv: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        ["ip", "netns", "exec", netns, *argv], input=stdin, capture_output=True, text=True
    )
    if result.returncode != 0:
        raise StackError(f"{' '.join(argv)} in {netns}: {result.stderr.strip()}")
    return result.stdout


def _namespaces() -> list[str]:
    listed = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True)
    return [entry["name"] for entry in json.loads(listed.stdout or "[]")]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_netns(netns: str) -> None:
    """End every process still in `netns`, then delete it (its links go with it)."""
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def remove_dead_clusters() -> list[str]:
    """Delete the namespaces of clusters whose process died without cleaning up."""
    removed = []
    for netns in _namespaces():
        owner = netns.removeprefix(NAME_PREFIX).split("-", 1)[0]
        if netns.startswith(NAME_PREFIX) and owner.isdigit() and not _pid_alive(int(owner)):
            _remove_netns(netns)
            removed.append(netns)
    return removed


# Clusters started at once (pytest-xdist workers) claim their /24 here, under a file lock: each
# reads the routes before the other has added its own, so the routes alone let both pick one.
SUBNET_CLAIMS = Path("/tmp/procbus-cluster-subnets.json")


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 of SUBNETS that no route of the machine's and no live cluster's claim overlaps."""
    with open(SUBNET_CLAIMS.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            claims = json.loads(SUBNET_CLAIMS.read_text())  # [[owner pid, subnet], ...]
        except (OSError, ValueError):
            claims = []
        live = [[owner, net] for owner, net in claims if _alive(int(owner))]
        subnet = _unrouted_subnet([ipaddress.IPv4Network(net) for _, net in live])
        live.append([os.getpid(), str(subnet)])
        SUBNET_CLAIMS.write_text(json.dumps(live))
        return subnet


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _unrouted_subnet(claimed: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    routes = subprocess.run(["ip", "-j", "route", "show", "table", "all"], capture_output=True)
    used: list[ipaddress.IPv4Network] = list(claimed)
    for route in json.loads(routes.stdout or "[]"):
        with contextlib.suppress(ValueError):  # "default", or not an IPv4 network
            used.append(ipaddress.IPv4Network(route.get("dst", ""), strict=False))
    candidates = list(SUBNETS.subnets(new_prefix=24))
    random.shuffle(candidates)
    for subnet in candidates:
        if not any(subnet.overlaps(route) for route in used if route.prefixlen > 0):
            return subnet
    raise StackError(f"no free /24 in {SUBNETS} for a test cluster")


@dataclass
class Host:
    """One host of the cluster: a network namespace with one address on the bridge."""

    name: str
    address: str
    netns: str
    cut_from: set[str] = field(default_factory=set)

    def command(self, *argv: str) -> list[str]:
        """`argv` run on this host (in its namespace)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def listening(self) -> list[tuple[str, int]]:
        """The TCP addresses listened on in this host's namespace."""
        found = []
        for line in _in_netns(self.netns, "ss", "-ltnH").splitlines():
            address, _, port = line.split()[3].rpartition(":")  # Local Address:Port
            found.append((address.strip("[]"), int(port)))
        return found


class Network:
    """Hosts on one bridge (in a namespace of its own), and the machine's address on it."""

    def __init__(self, host_names: Sequence[str]) -> None:
        self.owner = os.getpid()
        self.subnet = _free_subnet()
        addresses = self.subnet.hosts()
        self.machine_address = str(next(addresses))
        self.switch = f"{NAME_PREFIX}{self.owner}-switch"
        self.machine_link = f"{NAME_PREFIX}{self.owner}"[:15]
        self.hosts = {
            name: Host(name, str(next(addresses)), f"{NAME_PREFIX}{self.owner}-{name}")
            for name in host_names
        }

    def up(self) -> None:
        remove_dead_clusters()
        prefix = self.subnet.prefixlen
        _ip("netns", "add", self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        # The machine's leg: its end in the root namespace holds the first address.
        _ip("link", "add", self.machine_link, "type", "veth", *_peer_in("m", self.switch))
        _ip("-n", self.switch, "link", "set", "dev", "m", "master", "br0", "up")
        _ip("addr", "add", f"{self.machine_address}/{prefix}", "dev", self.machine_link)
        _ip("link", "set", self.machine_link, "up")
        for index, host in enumerate(self.hosts.values()):
            port = f"h{index}"
            _ip("netns", "add", host.netns)
            _ip("-n", host.netns, "link", "set", "lo", "up")
            link = ["link", "add", "eth0", "type", "veth", *_peer_in(port, self.switch)]
            _ip("-n", host.netns, *link)
            _ip("-n", self.switch, "link", "set", "dev", port, "master", "br0", "up")
            _ip("-n", host.netns, "addr", "add", f"{host.address}/{prefix}", "dev", "eth0")
            _ip("-n", host.netns, "link", "set", "eth0", "up")

    def down(self) -> None:
        for host in self.hosts.values():
            _remove_netns(host.netns)
        _remove_netns(self.switch)  # the machine's leg goes with its peer
        subprocess.run(["ip", "link", "del", self.machine_link], capture_output=True)

    def cut(self, name: str, *peers: str) -> None:
        """Drop every packet between host `name` and each of `peers` (a host name, or
        "machine"), both ways, silently: connections hang as over a broken link."""
        host = self.hosts[name]
        host.cut_from.update(peers)
        self._apply_rules(host)

    def heal(self, name: str) -> None:
        """Undo every cut of host `name`."""
        host = self.hosts[name]
        host.cut_from.clear()
        self._apply_rules(host)

    def _address(self, peer: str) -> str:
        return self.machine_address if peer == "machine" else self.hosts[peer].address

    def _apply_rules(self, host: Host) -> None:
        addresses = ", ".join(sorted(self._address(peer) for peer in host.cut_from))
        rules = "flush ruleset\n"
        if addresses:
            hook = "type filter hook {} priority 0;"
            rules += (
                "table inet procbus_cut {\n"
                f"  chain output {{ {hook.format('output')} ip daddr {{ {addresses} }} drop; }}\n"
                f"  chain input {{ {hook.format('input')} ip saddr {{ {addresses} }} drop; }}\n"
                "}\n"
            )
        _in_netns(host.netns, "nft", "-f", "-", stdin=rules)


def _timestamped(process: subprocess.Popen[bytes], log_file: Path) -> None:
    """The process's output into `log_file`, each line with the time it came: a nemesis run's
    logs are read beside its history."""
    assert process.stdout is not None
    with log_file.open("ab") as log:
        for line in process.stdout:
            log.write(datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3].encode() + b" " + line)
            log.flush()


@dataclass
class WorkerProcess:
    """A `procbus worker` on one host, with its worker ID."""

    host: Host
    worker_id: str
    env: dict[str, str]
    log_file: Path
    process: subprocess.Popen[bytes] | None = None
    modules: tuple[str, ...] = ()  # modules of the user's procedures it runs too (--workflows)

    def start(self) -> None:
        user = [argument for module in self.modules for argument in ("--workflows", module)]
        self.process = subprocess.Popen(
            self.host.command(str(Path(sys.executable).parent / "procbus"), "worker", *user),
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        threading.Thread(
            target=_timestamped, args=(self.process, self.log_file), daemon=True
        ).start()

    @property
    def pid(self) -> int:
        assert self.process is not None, f"worker {self.worker_id} was not started"
        return self.process.pid

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL, and reaped."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def stop(self, timeout: float = 20) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.pid, signal.SIGCONT)  # a paused worker cannot hear SIGTERM
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


class Cluster:
    """PostgreSQL on `db`, Temporal on `temporal`, `procbus worker`s on `w1`..`wN`, a webhook
    receiver on `sink` when `sink` is true, and a Spark standalone cluster on `spark` (which the
    workers send their table jobs to) when `spark` is true."""

    def __init__(
        self,
        workers: int = 3,
        *,
        member_timeout_seconds: float = 5.0,
        worker_settings: dict[str, str] | None = None,
        sink: bool = False,
        worker_modules: Sequence[str] = (),
        latency: bool = False,
        kafka: bool = False,
        amqp: bool = False,
        spark: bool = False,
    ) -> None:
        self.worker_names = [f"w{n}" for n in range(1, workers + 1)]
        # Each worker's links to `db` and `temporal` through a proxy that can delay them.
        self.latency = latency
        self.proxies: dict[str, subprocess.Popen[str]] = {}
        # Modules of the user's own procedures every worker runs too (imported from the folder
        # the harness runs in, as `procbus worker --workflows` does).
        self.worker_modules = tuple(worker_modules)
        # PROCBUS_* settings of every worker beyond the cluster's own (faults=..., say).
        self.worker_settings = worker_settings or {}
        self.network = Network(
            ["db", "temporal", *self.worker_names, *(["sink"] * sink), *(["spark"] * spark)]
        )
        self.root = service_dir("procbus-cluster-")
        self.warehouse = self.root / "warehouse"
        self.auth_key = secrets.token_urlsafe(32)
        self.member_timeout_seconds = member_timeout_seconds
        db, temporal = self.network.hosts["db"], self.network.hosts["temporal"]
        self.postgres = EmbeddedPostgres(
            self.root / "postgres",
            POSTGRES_PORT,
            self.root / "postgres.log",
            ephemeral=True,
            host=db.address,
            netns=db.netns,
            clients=str(self.network.subnet),
        )
        self.temporal = DevTemporalServer(
            TEMPORAL_PORT,
            0,
            self.root / "temporal.log",
            db_file=self.root / "temporal.db",  # its workflows outlive a restart
            ui=False,
            host=temporal.address,
            netns=temporal.netns,
        )
        self.workers: dict[str, WorkerProcess] = {}
        self.kafka: KafkaBroker | None = None
        if kafka:
            if not sink:
                raise StackError("a cluster's Kafka broker runs on its sink host: sink=True")
            sink_host = self.network.hosts["sink"]
            self.kafka = KafkaBroker(
                self.root, KAFKA_PORT, host=sink_host.address, netns=sink_host.netns
            )
        self.amqp: RabbitMQ | None = None
        if amqp:
            if not sink:
                raise StackError("a cluster's RabbitMQ broker runs on its sink host: sink=True")
            sink_host = self.network.hosts["sink"]
            self.amqp = RabbitMQ(
                self.root / "rabbitmq",
                host=sink_host.address,
                port=AMQP_PORT,
                netns=sink_host.netns,
            )
        self.spark: SparkCluster | None = None
        if spark:
            spark_host = self.network.hosts["spark"]
            # Room for a few drivers at once beside their executors (see SparkCluster).
            self.spark = SparkCluster(
                self.root / "spark",
                host=spark_host.address,
                netns=spark_host.netns,
                cores=8,
                memory="8g",
            )
        self.sink: ManagedProcess | None = None
        self.sink_journal = self.root / "sink.jsonl"
        if sink:
            where = ["--host", self.sink_address, "--port", str(SINK_PORT)]
            self.sink = ManagedProcess(
                "sink",
                [
                    sys.executable,
                    "-m",
                    "procbus.testing.sink",
                    *where,
                    "--journal",
                    str(self.sink_journal),
                ],
                self.root / "sink.log",
                netns=self.network.hosts["sink"].netns,
            )

    @property
    def sink_address(self) -> str:
        return self.network.hosts["sink"].address

    def sink_url(self, path: str = "/hooks") -> str:
        """A webhook endpoint on the sink host (`path` may carry a query: `/hooks?batch=1`)."""
        return f"http://{self.sink_address}:{SINK_PORT}{path}"

    def sink_requests(self) -> list[dict[str, Any]]:
        """Every request the sink received, in arrival order (procbus.testing.sink)."""
        return read_journal(self.sink_journal)

    @property
    def database_url(self) -> str:
        return self.postgres.url("postgres")

    def settings(self, **extra: str) -> dict[str, str]:
        """The PROCBUS_* settings every process of this cluster shares: the CLI's on the
        machine and the workers' (which add their own)."""
        spark = self.spark
        return {
            **(
                {
                    "PROCBUS_SPARK_MASTER": spark.master,
                    "PROCBUS_SPARK_REST_URL": spark.rest_url,
                    "PROCBUS_SPARK_WEB_URL": spark.web_url,
                }
                if spark is not None
                else {}
            ),
            "PROCBUS_TEMPORAL_ADDRESS": self.temporal.address,
            "PROCBUS_DATABASE_URL": self.database_url,
            "PROCBUS_WAREHOUSE": str(self.warehouse),
            "PROCBUS_AUTH_KEY": self.auth_key,
            "PROCBUS_PRINCIPAL": OPERATOR,
            "PROCBUS_OPERATOR_PRINCIPAL": OPERATOR,
            **{f"PROCBUS_{key.upper()}": value for key, value in extra.items()},
        }

    def cli_env(self) -> dict[str, str]:
        """The environment of a `procbus` CLI on the machine that talks to this cluster."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("PROCBUS_")}
        return env | self.settings(state_dir=str(self.root / "cli-state"))

    def temporal_cli_env(self) -> dict[str, str]:
        """The environment of a `temporal` CLI on the machine that talks to this cluster."""
        return {
            **os.environ,
            "TEMPORAL_ADDRESS": self.temporal.address,
            "TEMPORAL_NAMESPACE": "default",
        }

    def start(self) -> None:
        require_cluster_tools()
        self.warehouse.mkdir()
        self.network.up()
        self.postgres.prepare()
        self.temporal.prepare()
        self.postgres.launch()
        self.temporal.launch()
        if self.sink is not None:
            self.sink.start()
        if self.kafka is not None:
            self.kafka.start()
        if self.spark is not None:
            self.spark.up()
        self.postgres.wait_ready()
        if self.amqp is not None:
            self.amqp.start()
        self.temporal.wait_ready()
        if self.sink is not None:
            wait_for_port(self.sink, SINK_PORT, 60, host=self.sink_address)
        migrated = subprocess.run(
            [str(Path(sys.executable).parent / "procbus"), "db", "migrate"],
            env=self.cli_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if migrated.returncode != 0:
            raise StackError(f"procbus db migrate on the cluster failed: {migrated.stderr}")
        if self.latency:
            self._start_proxies()
        for name in self.worker_names:
            self.start_worker(name)

    def _proxy_address(self, server: str, worker: str) -> str:
        host = self.network.hosts[server]
        return f"{host.address}:{PROXY_PORTS[server] + self.worker_names.index(worker) + 1}"

    def _start_proxies(self) -> None:
        for server, port in (("db", POSTGRES_PORT), ("temporal", TEMPORAL_PORT)):
            host = self.network.hosts[server]
            routes = [
                f"--route={name}={self._proxy_address(server, name)}/{host.address}:{port}"
                for name in self.worker_names
            ]
            proxy = subprocess.Popen(
                host.command(sys.executable, "-m", "procbus.testing.proxy", *routes),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self.proxies[server] = proxy
            assert proxy.stdout is not None
            if proxy.stdout.readline().strip() != "ready":
                raise StackError(f"the latency proxy on {server} did not start")

    def set_latency(self, worker: str, server: str, seconds: float) -> None:
        """Delay each way of `worker`'s link to `server` (db or temporal) by `seconds` (0: none)
        from now on, for new and open connections alike."""
        proxy = self.proxies[server]
        assert proxy.stdin is not None, "a cluster made without latency=True"
        proxy.stdin.write(f"{worker} {seconds}\n")
        proxy.stdin.flush()

    def start_worker(self, name: str) -> WorkerProcess:
        """Start (or start again, with the same worker ID) the worker on host `name`."""
        host = self.network.hosts[name]
        env = {key: value for key, value in os.environ.items() if not key.startswith("PROCBUS_")}
        env |= self.settings(
            state_dir=str(self.root / f"{name}-state"),
            worker_id=name,
            member_timeout_seconds=str(self.member_timeout_seconds),
            **self.worker_settings,
        )
        if self.latency:
            env["PROCBUS_DATABASE_URL"] = self.database_url.replace(
                f"{self.network.hosts['db'].address}:{POSTGRES_PORT}",
                self._proxy_address("db", name),
            )
            env["PROCBUS_TEMPORAL_ADDRESS"] = self._proxy_address("temporal", name)
        worker = WorkerProcess(
            host, name, env, self.root / f"{name}.log", None, self.worker_modules
        )
        worker.start()
        self.workers[name] = worker
        return worker

    def stop(self) -> None:
        keep = os.environ.get("PROCBUS_CLUSTER_KEEP_LOGS")
        if keep:  # the hosts' logs, kept for a failed run's reader
            Path(keep).mkdir(parents=True, exist_ok=True)
            for log in self._logs():
                shutil.copy(log, Path(keep) / log.name)
        for worker in self.workers.values():
            worker.stop()
        for proxy in self.proxies.values():
            with contextlib.suppress(OSError):
                if proxy.stdin is not None:
                    proxy.stdin.close()  # it exits when its orders end
            try:
                proxy.wait(5)
            except subprocess.TimeoutExpired:
                proxy.kill()
        if self.amqp is not None:
            with contextlib.suppress(Exception):
                self.amqp.close()
        if self.spark is not None:
            with contextlib.suppress(Exception):
                self.spark.down()
        for server in (self.kafka, self.sink, self.temporal, self.postgres):
            with contextlib.suppress(Exception):
                if server is not None:
                    server.stop()
        self.network.down()
        shutil.rmtree(self.root, ignore_errors=True)

    def _logs(self) -> list[Path]:
        """Every host's log (the Spark host's: spark-master.log and spark-worker.log)."""
        return sorted([*self.root.glob("*.log"), *self.root.glob("spark/*.log")])

    def log_tails(self, lines: int = 20) -> str:
        """The last lines of every host's log, for a failure's message."""
        tails = []
        for log in self._logs():
            text = log.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(tails)


@contextlib.contextmanager
def running_cluster(
    workers: int = 3,
    *,
    member_timeout_seconds: float = 5.0,
    worker_settings: dict[str, str] | None = None,
    sink: bool = False,
    worker_modules: Sequence[str] = (),
    latency: bool = False,
    kafka: bool = False,
    amqp: bool = False,
    spark: bool = False,
) -> Iterator[Cluster]:
    """Start a cluster for the block and tear it down after it, also after a failure."""
    cluster = Cluster(
        workers,
        member_timeout_seconds=member_timeout_seconds,
        worker_settings=worker_settings,
        sink=sink,
        worker_modules=worker_modules,
        latency=latency,
        kafka=kafka,
        amqp=amqp,
        spark=spark,
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def wait_until(
    condition: Callable[[], object], timeout: float, what: str, interval: float = 0.2
) -> None:
    """Poll `condition()` every `interval` seconds until true, or fail saying `what` did not
    happen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")
