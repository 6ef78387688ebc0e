"""docs/how-to/grafana-dashboard.json asks only for metrics procbus serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

from procbus.core.metrics import PROCBUS_METRICS, STUCK_PROCEDURES, TOPIC_OLDEST_SECONDS

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "grafana-dashboard.json"
# As the Prometheus endpoint names them: counters with _total, histograms' series.
SERVED_SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


def test_every_query_names_a_metric_procbus_serves() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    named = {name for expr in expressions for name in re.findall(r"\bprocbus_[a-z_]+", expr)}
    served = {metric + suffix for metric in PROCBUS_METRICS for suffix in SERVED_SUFFIXES}
    assert named - served == set()
    assert {STUCK_PROCEDURES, TOPIC_OLDEST_SECONDS} <= named
    assert len({panel["id"] for panel in dashboard["panels"]}) == len(dashboard["panels"])
