"""`make bench`'s table over several runs (benchmarks/bench_all.py): each run's value side by side, a goal met
only when every run met it, and the files a run's `--summarize` reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import bench_all  # noqa: E402


def _row(path: str, ours: float, ratio: float | None, met: bool | None) -> dict:
    return {"path": path, "ours": ours, "unit": "msgs/s", "peer": "Redis" if ratio else "", "peer_value": 100.0,
            "ratio": ratio, "goal": "≥ 1.5×", "met": met, "bound": ""}


def test_a_goal_is_met_only_when_every_run_met_it(tmp_path: Path) -> None:
    runs = [tmp_path / "run-a", tmp_path / "run-b"]
    tables = [[_row("pop 1", 160.0, 1.6, True), _row("pop 32", 140.0, 1.4, False), _row("flat", 0.0, None, True)],
              [_row("pop 1", 120.0, 1.2, False), _row("pop 32", 130.0, 1.3, False), _row("flat", 0.0, None, True),
               _row("only here", 5.0, None, None)]]
    metas = [{"started": "a", "bounds": {"memcpy_gb_s": 1.5}}, {"started": "b", "steps": {"spark": {"rc": 1}}}]
    md = bench_all.combined_markdown(runs, tables, metas)
    lines = {line.split(" | ")[0].lstrip("| "): line for line in md.splitlines() if line.startswith("| ")}
    assert "160 msgs/s (1.60×) | 120 msgs/s (1.20×) | **1 of 2**" in lines["pop 1"]
    assert "**no** (0 of 2)" in lines["pop 32"]
    assert "**yes** (2 of 2)" in lines["flat"]
    assert "| – | 5.00 msgs/s | – |" in lines["only here"]  # absent from run 1; no goal verdict
    assert "Bounds in" in md and "memcpy 1.5 GB/s" in md
    assert "Steps of" in md and "spark" in md


def test_summarize_runs_writes_the_combined_table_beside_the_last_run(tmp_path: Path) -> None:
    dirs = []
    for name, rate in (("run-1", 3000.0), ("run-2", 4500.0)):
        d = tmp_path / name
        d.mkdir()
        (d / "run.json").write_text(json.dumps({"started": name, "quick": True, "steps": {"pop": {"rc": 0}}}))
        (d / "pop-x.json").write_text(json.dumps({"ours": {"1": {"rate": rate}},
                                                  "peers": {"redis": {"1": {"rate": 2000.0}}}}))
        dirs.append(d)
    md = bench_all.summarize_runs(dirs, readme=False)
    assert "| POP + ACK, batch 1 | ≥ 1.5× | 3,000 msgs/s (1.50×) | 4,500 msgs/s (2.25×) | **yes** (2 of 2) |" in md
    assert (dirs[1] / "combined.md").read_text() == md
    assert json.loads((dirs[1] / "combined.json").read_text())["rows"][0][0]["ratio"] == 1.5
    assert (dirs[0] / "summary.md").exists()


def test_runs_must_be_positive() -> None:
    with pytest.raises(SystemExit):
        bench_all.main(["--runs", "0"])
