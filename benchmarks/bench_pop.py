"""Acked consumption in ONE run: our POP + ACK against Redis Streams (XREADGROUP + XACK) and RabbitMQ (basic.consume
with manual acks), batches of 1 and 32; and how soon an unacked message comes back after its invisible time.

    python benchmarks/bench_pop.py [--quick] [--messages N] [--out DIR]

* ours: `rmq-eventstore serve` in a child process, `Producer` fills a topic, `PopConsumer.pop(max_nums=B)` then
  one ACK per message;
* Redis (127.0.0.1:6379): XADD, then XREADGROUP COUNT B and one XACK per batch (pipelined);
* RabbitMQ (127.0.0.1:5672, guest): a durable queue, persistent messages, basic.consume with prefetch B and
  one ack per batch (`multiple=True`).
Each side is measured on N messages (full 20,000, `--quick` 4,000). Redelivery: 20 messages popped with an
invisible time of 1 s and not acked; latency = when each is popped again - (pop time + 1 s).
Only loopback; Redis keys `bench:pop:<pid>:*` and the RabbitMQ queue `bench.pop.<pid>` are deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import broker_process  # noqa: E402

from rmq_eventstore.client import Message, PopConsumer, Producer  # noqa: E402

BODY = b"x" * 200


def ours(n: int, batches: list[int], tmp: Path) -> tuple[dict[int, float], list[float]]:
    rates: dict[int, float] = {}
    redelivery: list[float] = []
    with broker_process(tmp / "broker") as (_, ns), Producer(ns, "bench-pop") as p:
        for b in batches:
            topic = f"pop{b}"
            for _ in range(n // 100):
                p.send_batch([Message(topic, BODY)] * 100)
            with PopConsumer(ns, f"g{b}") as c:
                got = 0
                t0 = time.perf_counter()
                while got < n:
                    msgs = c.pop(topic, max_nums=b, invisible_time=60_000, poll_time=1000)
                    c.ack_batch(msgs)
                    got += len(msgs)
                rates[b] = n / (time.perf_counter() - t0)
        for _ in range(20):
            p.send(Message("redeliver", BODY))
        with PopConsumer(ns, "gr") as c:
            popped: dict[str, float] = {}
            deadline = time.time() + 10
            while len(popped) < 20 and time.time() < deadline:
                for m in c.pop("redeliver", max_nums=20, invisible_time=1000, poll_time=200):
                    popped[m.uniq_key or ""] = time.time()
            deadline = time.time() + 15
            while len(redelivery) < len(popped) and time.time() < deadline:
                for m in c.pop("redeliver", max_nums=20, invisible_time=60_000, poll_time=200):
                    if m.uniq_key in popped:
                        redelivery.append((time.time() - popped[m.uniq_key] - 1.0) * 1000)
                    c.ack(m)
    return rates, redelivery


def redis_side(n: int, batches: list[int]) -> dict[int, float]:
    import redis

    r = redis.Redis(host="127.0.0.1", port=6379)
    r.ping()
    rates = {}
    for b in batches:
        key = f"bench:pop:{os.getpid()}:{b}"
        try:
            r.xgroup_create(key, "g", id="0", mkstream=True)
            pipe = r.pipeline(transaction=False)
            for i in range(n):
                pipe.xadd(key, {"b": BODY})
                if i % 1000 == 999:
                    pipe.execute()
            pipe.execute()
            got = 0
            t0 = time.perf_counter()
            while got < n:
                res = r.xreadgroup("g", "c", {key: ">"}, count=b, block=1000)
                ids = [mid for _, entries in res for mid, _ in entries]
                if ids:
                    r.xack(key, "g", *ids)
                got += len(ids)
            rates[b] = n / (time.perf_counter() - t0)
        finally:
            r.delete(key)
    return rates


def rabbit_side(n: int, batches: list[int]) -> dict[int, float]:
    import pika

    conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5672))
    ch = conn.channel()
    rates = {}
    try:
        for b in batches:
            q = f"bench.pop.{os.getpid()}.{b}"
            ch.queue_declare(q, durable=True)
            props = pika.BasicProperties(delivery_mode=2)
            for _ in range(n):
                ch.basic_publish("", q, BODY, props)
            ch.basic_qos(prefetch_count=b)
            got = 0
            pending = 0
            t0 = time.perf_counter()
            for method, _, _ in ch.consume(q, inactivity_timeout=5):
                if method is None:
                    break
                got += 1
                pending += 1
                if pending == b or got == n:
                    ch.basic_ack(method.delivery_tag, multiple=True)
                    pending = 0
                if got >= n:
                    break
            rates[b] = got / (time.perf_counter() - t0)
            ch.cancel()
            ch.queue_delete(q)
    finally:
        conn.close()
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    n = args.messages or (4000 if args.quick else 20_000)
    batches = [1, 32]
    base = ROOT / "var" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="pop-", dir=base))
    try:
        mine, redelivery = ours(n, batches, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    peers: dict[str, dict[int, float]] = {}
    for name, fn in (("redis", redis_side), ("rabbitmq", rabbit_side)):
        try:
            peers[name] = fn(n, batches)
        except Exception as e:  # a peer that is not running is reported, not fatal
            print(f"{name}: skipped ({type(e).__name__}: {e})")
    print("\n| batch | ours POP+ACK (msgs/s) | " + " | ".join(f"{k} (msgs/s) | ours/{k}" for k in peers) + " |")
    print("|---:|---:|" + "---:|---:|" * len(peers))
    for b in batches:
        cells = [f"{peers[k][b]:,.0f} | {mine[b] / peers[k][b]:.2f}" for k in peers]
        print(f"| {b} | {mine[b]:,.0f} | " + " | ".join(cells) + " |")
    red = sorted(redelivery)
    if red:
        print(f"\nredelivery after the invisible time: {len(red)} messages, p50 {red[len(red) // 2]:.0f} ms, "
              f"max {red[-1]:.0f} ms")
    os.makedirs(args.out, exist_ok=True)
    out = Path(args.out) / f"pop-{time.strftime('%Y-%m-%d')}{'-quick' if args.quick else ''}.json"
    out.write_text(json.dumps({"messages": n, "ours": mine, "peers": peers, "redelivery_ms": red}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
