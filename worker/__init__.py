"""`procbus worker`: the Temporal worker that runs every procbus workflow and activity."""

from procbus.worker.main import build_worker, run_worker, serve, stopped_by_signals

__all__ = ["build_worker", "run_worker", "serve", "stopped_by_signals"]
