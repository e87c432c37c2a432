"""The bounded version of `make soak-celery`: a few hundred tasks through 2 Celery workers on our transport,
each counted once in the sink, RSS of the broker and both workers sampled and plotted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_soak_runs_every_task_once_and_samples_rss(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "benchmarks/soak_celery.py", "--tasks", "400", "--workers", "2",
                        "--window", "150", "--sample", "0.5", "--stall", "60", "--out", str(tmp_path),
                        "--name", "soak"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads((tmp_path / "soak.json").read_text())
    assert (result["published"], result["ran_distinct"], result["missing"], result["duplicates"]) == (400, 400, 0, 0)
    assert result["queue_left"] == 0
    sampled = {name for s in result["samples"] for name in s["rss_kib"]}
    assert {"broker", "worker0", "worker1"} <= sampled
    assert all(s["rss_kib"]["broker"]["VmRSS"] > 0 for s in result["samples"])
    assert (tmp_path / "soak.png").stat().st_size > 0
