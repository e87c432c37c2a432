"""The event-sourced example application's events (examples/eventsourcing_shop.py) read back by Spark from the
store's files (examples/eventsourcing_spark.py): the same counts and revenue as the application's own
projection, and notification ids contiguous from 1."""

from __future__ import annotations

import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))


def test_spark_reads_the_event_sourced_shop(spark, tmp_path):
    from eventsourcing_spark import summarise

    store = tmp_path / "store"
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "eventsourcing_shop.py"), "--store", str(store)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    placed, paid, revenue = re.search(r"orders placed (\d+), paid (\d+), revenue ([\d.]+)", out).groups()
    notifications = int(re.search(r"notifications: (\d+)", out).group(1))
    doc = summarise(spark, str(store))
    assert doc["events"] == notifications and doc["contiguous"]
    assert sum(n for cls, n in doc["by_class"].items() if cls.endswith("Order.Placed")) == int(placed)
    assert sum(c["orders"] for c in doc["customers"].values()) == int(placed)
    assert sum(Decimal(c["revenue"]) for c in doc["customers"].values()) >= Decimal(revenue)  # placed ≥ paid
    assert int(paid) <= int(placed)
