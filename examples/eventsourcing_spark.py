"""The event-sourced shop's events read back by Spark: `examples/eventsourcing_shop.py` writes them, this job
reads the same store directory (read-only, safe beside the running broker) and summarises them.

    python examples/eventsourcing_shop.py --store var/es-shop
    python examples/eventsourcing_spark.py --store var/es-shop

The application's events are queue 0 of topic ``ES_Shop``: the notification id is the queue offset + 1, the
library's event class is the record's TAGS, the aggregate is the stream (``STREAM_ID``), its version the
``ORIGINATOR_VERSION`` property, and the body is the library's JSON state.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def summarise(spark: Any, store: str, application: str = "Shop") -> dict[str, Any]:
    """Events per event class, orders per customer and revenue, from the store's files."""
    from pyspark.sql import functions as F

    from rmq_eventstore.eventsourcing import topic_for

    events = (spark.read.format("rocketmq").option("topic", topic_for(application)).load(store)
              .where(F.col("queue_id") == 0)
              .select((F.col("queue_offset") + 1).alias("notification_id"), F.col("tags").alias("event_topic"),
                      F.col("properties")["STREAM_ID"].alias("aggregate"),
                      F.col("properties")["ORIGINATOR_VERSION"].cast("long").alias("version"),
                      F.col("body").cast("string").alias("state")))
    by_class = {r["event_topic"]: r["count"] for r in events.groupBy("event_topic").count().collect()}
    placed = events.where(F.col("event_topic").endswith("Order.Placed"))
    # the library's JSON transcoder writes a Decimal as {"_type_": "decimal_str", "_data_": "12.50"}
    state = F.from_json("state", "customer string, amount struct<_type_: string, _data_: string>")
    per_customer = {r["customer"]: (r["orders"], r["revenue"]) for r in (
        placed.select(state.alias("s")).groupBy("s.customer")
        .agg(F.count("*").alias("orders"), F.sum(F.col("s.amount._data_").cast("decimal(18,2)")).alias("revenue"))
        .collect())}
    ids = [r["notification_id"] for r in events.orderBy("notification_id").select("notification_id").collect()]
    return {"events": len(ids), "contiguous": ids == list(range(1, len(ids) + 1)), "by_class": by_class,
            "customers": {c: {"orders": n, "revenue": str(rev)} for c, (n, rev) in sorted(per_customer.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", default="var/es-shop")
    ap.add_argument("--application", default="Shop")
    args = ap.parse_args()
    from rmq_eventstore.spark.session import local_session

    spark = local_session(app_name="es-shop-report")
    try:
        print(json.dumps(summarise(spark, str(Path(args.store).resolve()), args.application), indent=2))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
