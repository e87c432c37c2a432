"""Acked consumption in ONE run: our POP + ACK against Redis Streams (XREADGROUP + XACK) and RabbitMQ (basic.consume
with manual acks), batches of 1 and 32; and how soon an unacked message comes back after its invisible time.

    python benchmarks/bench_pop.py [--quick] [--messages N] [--out DIR]

* ours: `rmq-eventstore serve` in a child process, `Producer` fills a topic, `PopConsumer.pop(max_nums=B)` then
  one BATCH_ACK_MESSAGE per popped batch (`ack_batch`), each waited for;
* Redis (127.0.0.1:6379): XADD, then XREADGROUP COUNT B and one XACK per batch, each waited for;
* pipelined (both): the ack of a batch goes out in the same write as the next read (ours `pop(..., ack=prev)`,
  Redis a pipeline of XACK + XREADGROUP): one round trip per batch instead of two;
* RabbitMQ (127.0.0.1:5672, guest): a durable queue, persistent messages, basic.consume with prefetch B and
  one ack per batch (`multiple=True`).
Each side is measured on N messages (full 20,000, `--quick` 4,000), in `--rounds` alternating rounds (medians
reported), so that a change of the machine's load hits every side. Redelivery: 20 messages popped with an
invisible time of 1 s and not acked; latency = when each is popped again - (pop time + 1 s).
Each round also times the Python echo round trip (benchlib.echo_round_trips): a waited pair is two round trips,
so echo / 2 × batch is the floor's rate, measured in the same minutes as the sides.
Only loopback; Redis keys `bench:pop:<pid>:*` and the RabbitMQ queue `bench.pop.<pid>` are deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import broker_process, echo_round_trips  # noqa: E402

from rmq_eventstore.client import Message, PopConsumer, Producer  # noqa: E402

BODY = b"x" * 200
_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) a process has used so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class Meter:
    """Wall time and CPU (this client process + the server process) of one measured loop: the CPU per
    message is what a loaded machine does not distort much, unlike the rate."""

    def __init__(self, server_pid: int | None) -> None:
        self.pid = server_pid

    def __enter__(self) -> Meter:
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        self.s0 = proc_cpu(self.pid) if self.pid else 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        self.client = time.process_time() - self.c0
        self.server = (proc_cpu(self.pid) - self.s0) if self.pid else float("nan")

    def result(self, n: int) -> dict:
        return {"rate": n / self.wall, "client_us": self.client / n * 1e6, "server_us": self.server / n * 1e6}


def ours(n: int, batches: list[int], tmp: Path, extra: tuple[str, ...] = ()) -> tuple[dict, list[float]]:
    rates: dict = {}
    redelivery: list[float] = []
    with broker_process(tmp / "broker", *extra) as (proc, ns), Producer(ns, "bench-pop") as p:
        for b in batches:
            for piped in (False, True):
                topic = f"pop{b}{'p' if piped else ''}"
                for _ in range(n // 100):
                    p.send_batch([Message(topic, BODY)] * 100)
                with PopConsumer(ns, f"g{b}") as c:
                    got = 0
                    msgs: list = []
                    with Meter(proc.pid) as m:
                        while got < n:
                            if piped:
                                msgs = c.pop(topic, max_nums=b, invisible_time=60_000, poll_time=1000, ack=msgs)
                            else:
                                msgs = c.pop(topic, max_nums=b, invisible_time=60_000, poll_time=1000)
                                c.ack_batch(msgs)
                            got += len(msgs)
                        c.ack_batch(msgs if piped else [])
                    rates[(b, piped)] = m.result(n)
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


def redis_side(n: int, batches: list[int]) -> dict:
    import redis

    r = redis.Redis(host="127.0.0.1", port=6379)
    r.ping()
    pid = int(r.info("server")["process_id"])
    rates: dict = {}
    for b, piped in ((b, piped) for b in batches for piped in (False, True)):
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
            ids: list = []
            with Meter(pid) as m:
                while got < n:
                    if piped:
                        pipe = r.pipeline(transaction=False)
                        if ids:
                            pipe.xack(key, "g", *ids)
                        pipe.xreadgroup("g", "c", {key: ">"}, count=b, block=1000)
                        res = pipe.execute()[-1]
                        ids = [mid for _, entries in res for mid, _ in entries]
                    else:
                        res = r.xreadgroup("g", "c", {key: ">"}, count=b, block=1000)
                        ids = [mid for _, entries in res for mid, _ in entries]
                        if ids:
                            r.xack(key, "g", *ids)
                    got += len(ids)
                if piped and ids:
                    r.xack(key, "g", *ids)
            rates[(b, piped)] = m.result(n)
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
            with Meter(None) as m:  # the broker's CPU is not measured (beam serves other work too)
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
            rates[(b, False)] = rates[(b, True)] = m.result(max(got, 1))  # acks are never waited for
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
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of every side; medians reported")
    ap.add_argument("--compare-unbuffered", action="store_true",
                    help="also measure ours with enablePopBufferMerge=false (before issue 16's buffer)")
    args = ap.parse_args()
    n = args.messages or (4000 if args.quick else 20_000)
    batches = [1, 32]
    base = ROOT / "var" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {}
    redelivery: list[float] = []
    skipped: set[str] = set()
    conf_args: tuple[str, ...] = ()
    echoes: list[int] = []
    for rnd in range(args.rounds):  # the sides alternate, so that a load change on the machine hits both
        tmp = Path(tempfile.mkdtemp(prefix="pop-", dir=base))
        try:
            mine, red = ours(n, batches, tmp)
            runs.setdefault("ours", []).append(mine)
            redelivery = redelivery or red
            if args.compare_unbuffered:  # without the checkpoint buffer (every pop and ack a revive record)
                conf = tmp / "unbuffered.conf"
                conf.write_text("enablePopBufferMerge=false\n")
                conf_args = ("-c", str(conf))
                runs.setdefault("unbuffered", []).append(ours(n, batches, tmp / "unbuffered", conf_args)[0])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for name, fn in (("redis", redis_side), ("rabbitmq", rabbit_side)):
            if name in skipped:
                continue
            try:
                runs.setdefault(name, []).append(fn(n, batches))
            except Exception as e:  # a peer that is not running is reported, not fatal
                print(f"{name}: skipped ({type(e).__name__}: {e})")
                skipped.add(name)
        echoes.append(echo_round_trips(10_000))  # the floor of a waited request, in the same round
        print(f"round {rnd + 1}/{args.rounds} done (load average {os.getloadavg()[0]:.1f}; Python echo "
              f"{echoes[-1]:,} round trips/s)", flush=True)

    def median(side: str) -> dict:
        rs = runs[side]
        return {k: {f: statistics.median(r[k][f] for r in rs) for f in rs[0][k]} for k in rs[0]}

    mine = median("ours")
    unbuffered = median("unbuffered") if args.compare_unbuffered else {}
    peers = {k: median(k) for k in runs if k not in ("ours", "unbuffered")}
    def cpu(r: dict) -> str:
        return f"{r['client_us'] + r['server_us']:,.1f}" if r["server_us"] == r["server_us"] else "-"

    print("\nmsgs/s (median of the rounds), and CPU µs per message (client process + server process):")
    print("\n| batch | acks | ours msgs/s | ours CPU µs/msg | " + " | ".join(
        f"{k} msgs/s | {k} CPU µs/msg | ours/{k} msgs/s" for k in peers) + " |")
    print("|---:|---|---:|---:|" + "---:|---:|---:|" * len(peers))
    for key in mine:
        cells = [f"{peers[k][key]['rate']:,.0f} | {cpu(peers[k][key])} | {mine[key]['rate'] / peers[k][key]['rate']:.2f}"
                 for k in peers]
        print(f"| {key[0]} | {'pipelined' if key[1] else 'waited'} | {mine[key]['rate']:,.0f} | {cpu(mine[key])} | "
              + " | ".join(cells) + " |")
    if args.compare_unbuffered:
        print("\nwithout the checkpoint buffer: " + ", ".join(
            f"batch {b} {'pipelined' if p else 'waited'} {v['rate']:,.0f} msgs/s, {cpu(v)} CPU µs/msg"
            for (b, p), v in unbuffered.items()))
    echo = statistics.median(echoes)
    print(f"\nPython echo round trip (median of the rounds): {echo:,.0f}/s; a waited POP + ACK is two round trips a "
          "batch: " + ", ".join(f"batch {b} ours {100 * mine[(b, False)]['rate'] / (echo / 2 * b):.0f}% of that bound"
                                for b in batches if (b, False) in mine))
    red = sorted(redelivery)
    if red:
        print(f"\nredelivery after the invisible time: {len(red)} messages, p50 {red[len(red) // 2]:.0f} ms, "
              f"max {red[-1]:.0f} ms")
    os.makedirs(args.out, exist_ok=True)
    out = Path(args.out) / f"pop-{time.strftime('%Y-%m-%d')}{'-quick' if args.quick else ''}.json"

    def flat(d: dict) -> dict:
        return {f"{b}{'-pipelined' if p else ''}": v for (b, p), v in d.items()}
    doc = {"messages": n, "rounds": args.rounds, "ours": flat(mine), "peers": {k: flat(v) for k, v in peers.items()},
           "redelivery_ms": red, "loadavg": os.getloadavg(), "echo_round_trips_per_s": echo, "echoes": echoes}
    if args.compare_unbuffered:
        doc["ours_unbuffered"] = flat(unbuffered)
    out.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
