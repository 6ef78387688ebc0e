"""The `procbus.workflows` entry-point group: an installed package that declares its procedure
modules there has them run by `procbus worker`, as `--workflows` would. The package is installed
the way pip leaves one (a .dist-info folder with its entry_points.txt on the path), and the
worker's own discovery runs in a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]

PROBE = """
import json
from procbus.worker.extensions import entry_point_modules, load_user_procedures
from procbus.worker.main import WORKFLOWS

modules = entry_point_modules()
found = load_user_procedures(modules, WORKFLOWS)
print(json.dumps({
    "modules": modules,
    "workflows": [cls.__name__ for cls in found.workflows],
    "activities": sorted(getattr(a, "__name__", "?") for a in found.activities),
}))
"""


def test_a_package_declares_its_procedures_in_the_entry_point_group(tmp_path: Path) -> None:
    site = tmp_path / "site"
    info = site / "sales_procedures-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sales-procedures\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[procbus.workflows]\nrefresh = examples.user_procedures\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=PROJECT,  # where `examples` imports from, as a user's worker runs in their project
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["modules"] == ["examples.user_procedures"]
    assert found["workflows"] == ["RefreshCaches"]
    assert found["activities"] == ["count_rows", "forget_refresh", "note_refresh", "refuse_refresh"]
