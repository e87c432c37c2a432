"""Quickstart: an embedded RocketMQ-format store under ./var/store.

Appends a few thousand domain events across topics (tags = event type, keys = aggregate id), then
reads them back by queue offset and by key, and prints a summary. Run it twice: the second run reopens
the store, recovers it and appends after what is there.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import zlib

from rmq_eventstore.store import GetMessageStatus, Message, MessageStore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--store", default="var/store", help="store directory (default: ./var/store)")
    ap.add_argument("--events", type=int, default=5000)
    args = ap.parse_args()

    topics = {"orders": ["OrderPlaced", "OrderPaid", "OrderShipped"],
              "payments": ["PaymentAuthorized", "PaymentCaptured"],
              "inventory": ["StockReserved", "StockReleased"]}
    rng = random.Random(7)
    t0 = time.perf_counter()
    with MessageStore.open(args.store) as store:
        before = {t: sum(store.get_max_offset_in_queue(t, q) for q in range(4)) for t in topics}
        batch = []
        for i in range(args.events):
            topic = rng.choice(list(topics))
            kind = rng.choice(topics[topic])
            aggregate = f"{topic[:-1]}-{rng.randrange(500)}"
            body = json.dumps({"type": kind, "aggregate": aggregate, "seq": i}).encode()
            batch.append(Message(topic=topic, body=body, tags=kind, keys=[aggregate],
                                 queue_id=zlib.crc32(aggregate.encode()) % 4))
            if len(batch) == 100:
                r = store.put_messages(batch)
                assert r.is_ok(), r
                batch = []
        if batch:
            assert store.put_messages(batch).is_ok()
        put_s = time.perf_counter() - t0
        store.wait_for_dispatch()

        print(f"store: {args.store}  (commitlog max offset {store.get_max_phy_offset():,} bytes)")
        print(f"appended {args.events:,} events in {put_s * 1000:.0f} ms")
        for topic in topics:
            counts = [store.get_max_offset_in_queue(topic, q) for q in range(4)]
            print(f"  {topic:10s} queues {counts}  (+{sum(counts) - before[topic]} this run)")

        # Read one queue from its first offset, the way a consumer pulls.
        got = 0
        offset = store.get_min_offset_in_queue("orders", 0)
        while True:
            res = store.get_message("demo-group", "orders", 0, offset, 32)
            if res.status != GetMessageStatus.FOUND:
                break
            got += res.message_count
            offset = res.next_begin_offset
        print(f"pulled orders/0: {got} messages, next offset {offset}")

        # Only OrderPaid events, filtered by tag in the consume queue.
        res = store.get_message("demo-group", "orders", 1, store.get_min_offset_in_queue("orders", 1), 32,
                                "OrderPaid")
        print(f"orders/1 tag OrderPaid: {res.message_count} of the first {res.next_begin_offset} entries")

        # Every event of one aggregate, by key through the index.
        q = store.query_message("orders", "order-42", 64)
        kinds = [m.tags for m in q.messages]
        print(f"key order-42: {len(q.messages)} events {kinds[:6]}{'...' if len(kinds) > 6 else ''}")
        if q.messages:
            m = q.messages[0]
            again = store.view_message_by_id(m.msg_id)
            print(f"  first: msgId {m.msg_id} -> {again.body.decode() if again else None}")
    print(f"done in {time.perf_counter() - t0:.2f} s; inspect with: rmq-eventstore inspect {args.store}")


if __name__ == "__main__":
    main()
