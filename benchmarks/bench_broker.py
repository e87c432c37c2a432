#!/usr/bin/env python3
"""Broker throughput and wake-up latency over loopback, side by side with Redis Streams and RabbitMQ, in ONE run.

    python benchmarks/bench_broker.py [--quick] [--out benchmarks/results] [--reps N] [--no-redis] [--no-rabbit]
    python benchmarks/bench_broker.py --profile [--quick]     # cProfile of the client and the broker process

One Python client process (this one) talks to:
  * our broker (`rmq_eventstore.broker.server.serve_in_thread` in a CHILD process, so client and broker do
    not share a GIL), through our client (`rmq_eventstore.client.Producer` / `PullConsumer`);
  * Redis on 127.0.0.1:6379 through redis-py (hiredis parser), one stream key `bench:broker:<pid>:*`,
    deleted afterwards;
  * RabbitMQ on 127.0.0.1:5672 (guest/guest) through pika's BlockingConnection, one durable queue
    `bench.broker.<pid>.*`, deleted afterwards.
Every system gets the same messages: 200-byte bodies (1,024 random bodies in rotation), tag `bench`, one
14-character key. Counts are fixed, the run has a time limit (`--max-seconds`), only 127.0.0.1 is contacted.
See benchmarks/README.md ("Broker over loopback") for what each number means and the results.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import json
import os
import pstats
import queue
import random
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.benchlib import echo_round_trips  # noqa: E402

TOPIC = "BenchBroker"
BODY_SIZE = 200
N_BODIES = 1024
TAG = "bench"
SEED = 20261122
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
RABBIT_HOST, RABBIT_PORT = "127.0.0.1", 5672
PULL_BATCH = 32
BIG_PULL = 256  # our broker runs with max_transfer_count_on_message_in_memory=256 to allow it
BROKER_CONFIG = {"max_transfer_count_on_message_in_memory": BIG_PULL}

FULL = dict(reps=5, single=5_000, batch=100_000, batch_size=100, wake=1000, rabbit_confirm=5_000)
QUICK = dict(reps=1, single=1_000, batch=20_000, batch_size=100, wake=50, rabbit_confirm=1_000)

rng = random.Random(SEED)
BODIES = [rng.randbytes(BODY_SIZE) for _ in range(N_BODIES)]
T0 = struct.Struct("<q")


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


class BenchTimeout(RuntimeError):
    pass


class Deadline:
    """The run's time limit; loops call check() once per batch or every few hundred messages."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise BenchTimeout("the benchmark exceeded --max-seconds")


def keys(n: int, prefix: str) -> list[str]:
    return [f"{prefix}{i:010d}" for i in range(n)]


def lat_stats(ns: list[int]) -> dict:
    us = np.asarray(ns, dtype=np.float64) / 1000.0
    p = np.percentile(us, [50, 90, 99])
    return {"n": int(us.size), "p50_us": round(float(p[0]), 1), "p90_us": round(float(p[1]), 1),
            "p99_us": round(float(p[2]), 1), "max_us": round(float(us.max()), 1),
            "mean_us": round(float(us.mean()), 1)}


def stamped_body(t0: int) -> bytes:
    """A 200-byte body whose first 8 bytes are the sender's perf_counter_ns (same process as the receiver)."""
    return T0.pack(t0) + BODIES[0][T0.size:]


# -- our broker --------------------------------------------------------------------------------------------
CHILD = r"""
import json, sys
from rmq_eventstore.broker.server import serve_in_thread
running = serve_in_thread(sys.argv[1], **json.loads(sys.argv[2]))
print(json.dumps({"namesrv": running.namesrv_address, "broker": running.broker_address}), flush=True)
sys.stdin.read()          # the parent closes stdin (or dies): shut down cleanly
running.close()
"""


def py_spy() -> str | None:
    """py-spy from PATH or from this interpreter's bin directory (a venv not on PATH)."""
    here = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(here) if here.exists() else None)


class BrokerChild:
    """Our broker (serve_in_thread on a fresh store) in a child process; closed by closing its stdin."""

    def __init__(self, root: Path, py_spy_out: Path | None = None, **store_config: object) -> None:
        self.path = tempfile.mkdtemp(prefix="broker-", dir=root)
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, self.path, json.dumps(store_config)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
        line = self.proc.stdout.readline()
        if not line:
            self.proc.kill()
            raise RuntimeError("the broker child process died before it printed its addresses")
        info = json.loads(line)
        self.namesrv, self.broker = info["namesrv"], info["broker"]
        self.spy: subprocess.Popen | None = None
        if py_spy_out is not None and py_spy() is not None:
            self.spy = subprocess.Popen([py_spy(), "record", "-p", str(self.proc.pid), "-o", str(py_spy_out),
                                         "-f", "raw", "-r", "250"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close(self) -> None:
        if self.spy is not None and self.spy.poll() is None:
            self.spy.send_signal(signal.SIGINT)
            try:
                self.spy.wait(30)
            except subprocess.TimeoutExpired:
                self.spy.kill()
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.path, ignore_errors=True)


class Ours:
    name = "ours"

    def __init__(self, root: Path, dl: Deadline) -> None:
        from rmq_eventstore.client import Producer, PullConsumer
        from rmq_eventstore.store import Message

        self.Message, self.Producer, self.PullConsumer = Message, Producer, PullConsumer
        self.root, self.dl = root, dl
        self.child: BrokerChild | None = None
        self.producer = None
        self.queues: list[int] = []

    def fresh(self) -> None:
        """A new broker on an empty store for each measurement (so every run starts from the same state)."""
        self.close()
        self.child = BrokerChild(self.root, **BROKER_CONFIG)
        self.producer = self.Producer(self.child.namesrv, "bench-producer")
        self.producer.start()

    def msgs(self, n: int, prefix: str) -> list:
        M = self.Message
        return [M(topic=TOPIC, body=BODIES[i & (N_BODIES - 1)], tags=TAG, keys=[k]) for i, k in
                enumerate(keys(n, prefix))]

    def warm(self) -> None:
        # route lookup + topic auto-creation outside the clock
        r = self.producer.send(self.Message(topic=TOPIC, body=BODIES[0], tags=TAG, keys=["warm"]))
        assert r.status == "SEND_OK", r

    def send_single(self, n: int) -> int:
        msgs = self.msgs(n, "ours")
        send, dl = self.producer.send, self.dl
        t = time.perf_counter_ns()
        for i, m in enumerate(msgs):
            send(m)
            if not i & 255:
                dl.check()
        return time.perf_counter_ns() - t

    def send_batch(self, n: int, size: int) -> int:
        msgs = self.msgs(n, "ourb")
        batches = [msgs[i:i + size] for i in range(0, n, size)]
        send_batch, dl = self.producer.send_batch, self.dl
        t = time.perf_counter_ns()
        for b in batches:
            send_batch(b)
            dl.check()
        return time.perf_counter_ns() - t

    read_batches = (PULL_BATCH, BIG_PULL)

    def read(self, n: int, batch: int) -> tuple[int, int]:
        """Pull every queue of the topic from offset 0, `batch` per request, until everything was read."""
        consumer = self.PullConsumer(self.child.namesrv, "bench-reader")
        consumer.start()
        try:
            got = 0
            t = time.perf_counter_ns()
            for qid in consumer.queues(TOPIC):
                offset = 0
                while True:
                    r = consumer.pull(TOPIC, qid, offset, max_nums=batch, suspend_timeout_ms=0)
                    if not r.messages:
                        break
                    got += len(r.messages)
                    offset = r.next_begin_offset
                    self.dl.check()
            return time.perf_counter_ns() - t, got
        finally:
            consumer.shutdown()

    def wakeup(self, samples: int) -> list[int]:
        """A consumer thread parked in a long-polling pull on queue 0; the main thread sends one message to
        queue 0 (its perf_counter_ns in the body); the latency is until the pull carrying it returns."""
        out: queue.Queue = queue.Queue()
        stop = threading.Event()
        consumer = self.PullConsumer(self.child.namesrv, "bench-wake")
        consumer.start()
        offset = consumer.pull(TOPIC, 0, 0, max_nums=1, suspend_timeout_ms=0).max_offset

        def park() -> None:
            nonlocal offset
            while not stop.is_set():
                r = consumer.pull(TOPIC, 0, offset, max_nums=PULL_BATCH, suspend_timeout_ms=1000)
                t1 = time.perf_counter_ns()
                for m in r.messages:
                    out.put(t1 - T0.unpack_from(m.body)[0])
                offset = r.next_begin_offset

        th = threading.Thread(target=park, daemon=True)
        th.start()
        lat = []
        try:
            time.sleep(0.2)
            for _ in range(samples):
                time.sleep(0.005)  # let the consumer park again
                self.producer.send(self.Message(topic=TOPIC, body=stamped_body(time.perf_counter_ns()),
                                                tags=TAG, keys=["wake"]), queue_id=0)
                lat.append(out.get(timeout=10))
                self.dl.check()
        finally:
            stop.set()
            th.join(5)
            consumer.shutdown()
        return lat

    def close(self) -> None:
        if self.producer is not None:
            self.producer.shutdown()
            self.producer = None
        if self.child is not None:
            self.child.close()
            self.child = None


# -- Redis Streams -----------------------------------------------------------------------------------------
class RedisPeer:
    name = "redis"

    def __init__(self, dl: Deadline) -> None:
        import redis

        self.redis = redis
        self.r = redis.Redis(REDIS_HOST, REDIS_PORT)
        self.r.ping()
        self.dl = dl
        self.prefix = f"bench:broker:{os.getpid()}"
        self.key = ""
        self.n = 0

    def fresh(self) -> None:
        self.close()
        self.n += 1
        self.key = f"{self.prefix}:{self.n}"

    def warm(self) -> None:
        pass

    def fields(self, n: int, prefix: str) -> list[dict]:
        return [{b"d": BODIES[i & (N_BODIES - 1)], b"t": TAG, b"k": k} for i, k in enumerate(keys(n, prefix))]

    def send_single(self, n: int) -> int:
        fs = self.fields(n, "reds")
        xadd, key, dl = self.r.xadd, self.key, self.dl
        t = time.perf_counter_ns()
        for i, f in enumerate(fs):
            xadd(key, f)
            if not i & 255:
                dl.check()
        return time.perf_counter_ns() - t

    def send_batch(self, n: int, size: int) -> int:
        fs = self.fields(n, "redb")
        key = self.key
        t = time.perf_counter_ns()
        for i in range(0, n, size):
            p = self.r.pipeline(transaction=False)
            for f in fs[i:i + size]:
                p.xadd(key, f)
            p.execute()
            self.dl.check()
        return time.perf_counter_ns() - t

    read_batches = (PULL_BATCH, BIG_PULL)

    def read(self, n: int, batch: int) -> tuple[int, int]:
        """XRANGE pages of `batch` entries (the same page sizes as our pulls)."""
        got = 0
        start = "-"
        t = time.perf_counter_ns()
        while True:
            page = self.r.xrange(self.key, min=start, count=batch)
            if not page:
                break
            got += len(page)
            start = b"(" + page[-1][0]
            self.dl.check()
        return time.perf_counter_ns() - t, got

    def wakeup(self, samples: int) -> list[int]:
        out: queue.Queue = queue.Queue()
        stop = threading.Event()
        r2 = self.redis.Redis(REDIS_HOST, REDIS_PORT)
        key = self.key

        def park() -> None:
            last = "$"
            while not stop.is_set():
                res = r2.xread({key: last}, count=PULL_BATCH, block=2000)
                t1 = time.perf_counter_ns()
                for _stream, entries in res or []:
                    for eid, f in entries:
                        out.put(t1 - T0.unpack_from(f[b"d"])[0])
                        last = eid

        th = threading.Thread(target=park, daemon=True)
        th.start()
        lat = []
        try:
            time.sleep(0.2)
            for _ in range(samples):
                time.sleep(0.005)
                self.r.xadd(key, {b"d": stamped_body(time.perf_counter_ns()), b"t": TAG, b"k": "wake"})
                lat.append(out.get(timeout=10))
                self.dl.check()
        finally:
            stop.set()
            th.join(5)
            r2.close()
        return lat

    def close(self) -> None:
        if self.key:
            self.r.delete(self.key)
            self.key = ""


# -- RabbitMQ ----------------------------------------------------------------------------------------------
class RabbitPeer:
    name = "rabbitmq"

    def __init__(self, dl: Deadline) -> None:
        import pika

        self.pika = pika
        self.params = pika.ConnectionParameters(RABBIT_HOST, RABBIT_PORT, credentials=pika.PlainCredentials(
            "guest", "guest"), heartbeat=0)
        self.conn = pika.BlockingConnection(self.params)
        self.ch = self.conn.channel()
        self.dl = dl
        self.prefix = f"bench.broker.{os.getpid()}"
        self.qname = ""
        self.n = 0
        self.persistent = pika.BasicProperties(delivery_mode=2, type=TAG)

    def fresh(self) -> None:
        self.close_queue()
        self.n += 1
        self.qname = f"{self.prefix}.{self.n}"
        self.ch.queue_declare(self.qname, durable=True)

    def warm(self) -> None:
        pass

    def props(self, n: int, prefix: str) -> list:
        P = self.pika.BasicProperties
        return [P(delivery_mode=2, type=TAG, message_id=k) for k in keys(n, prefix)]

    def _publish(self, ch, n: int, prefix: str) -> int:
        ps = self.props(n, prefix)
        publish, q, dl = ch.basic_publish, self.qname, self.dl
        t = time.perf_counter_ns()
        for i, p in enumerate(ps):
            publish("", q, BODIES[i & (N_BODIES - 1)], p)
            if not i & 255:
                dl.check()
        return time.perf_counter_ns() - t

    def send_single(self, n: int) -> int:
        """basic_publish on a channel in confirm mode: each call waits for the broker's ack (like a sync send)."""
        ch = self.conn.channel()
        ch.confirm_delivery()
        try:
            return self._publish(ch, n, "rabc")
        finally:
            ch.close()

    def send_batch(self, n: int, size: int) -> int:
        """basic_publish without confirms (nothing waited for per message), then one round trip at the end
        that checks the queue holds everything (fire-and-forget stream: RabbitMQ's fastest publish)."""
        t = self._publish(self.ch, n, "rabn")
        t0 = time.perf_counter_ns()
        while self.ch.queue_declare(self.qname, passive=True).method.message_count < n:
            self.dl.check()
            time.sleep(0.001)
        return t + time.perf_counter_ns() - t0

    read_batches = (PULL_BATCH,)

    def read(self, n: int, batch: int) -> tuple[int, int]:
        """basic_consume with prefetch 256, acks with multiple=True every `batch` messages (the queue is
        drained by it, so there is only one read variant)."""
        ch = self.conn.channel()
        ch.basic_qos(prefetch_count=256)
        got = 0
        t = time.perf_counter_ns()
        for method, _props, _body in ch.consume(self.qname, inactivity_timeout=1.0):
            if method is None:
                break
            got += 1
            if got % batch == 0:
                ch.basic_ack(method.delivery_tag, multiple=True)
                self.dl.check()
                if got >= n:
                    break
        el = time.perf_counter_ns() - t
        ch.cancel()
        ch.close()
        return el, got

    def wakeup(self, samples: int) -> list[int]:
        out: queue.Queue = queue.Queue()
        stop = threading.Event()
        conn2 = self.pika.BlockingConnection(self.params)
        ch2 = conn2.channel()
        ch2.basic_qos(prefetch_count=256)

        def on_message(ch, method, _props, body) -> None:
            t1 = time.perf_counter_ns()
            out.put(t1 - T0.unpack_from(body)[0])
            ch.basic_ack(method.delivery_tag)

        ch2.basic_consume(self.qname, on_message)

        def park() -> None:
            while not stop.is_set():
                conn2.process_data_events(time_limit=0.2)

        th = threading.Thread(target=park, daemon=True)
        th.start()
        lat = []
        try:
            time.sleep(0.2)
            for _ in range(samples):
                time.sleep(0.005)
                self.ch.basic_publish("", self.qname, stamped_body(time.perf_counter_ns()), self.persistent)
                lat.append(out.get(timeout=10))
                self.dl.check()
        finally:
            stop.set()
            th.join(5)
            conn2.close()
        return lat

    def close_queue(self) -> None:
        if self.qname:
            self.ch.queue_delete(self.qname)
            self.qname = ""

    def close(self) -> None:
        self.close_queue()


# -- the run ---------------------------------------------------------------------------------------------------
def run_round(system, cfg: dict, res: dict, bar) -> None:
    name = system.name
    rows = res.setdefault(name, {})
    n1, nb, size = cfg["single"], cfg["batch"], cfg["batch_size"]
    if name == "rabbitmq":
        n1 = cfg["rabbit_confirm"]
    # single sends
    system.fresh()
    system.warm()
    el = system.send_single(n1)
    rows.setdefault("send_single", []).append(n1 / (el / 1e9))
    bar.update(1)
    # batched sends, then read them back
    system.fresh()
    system.warm()
    el = system.send_batch(nb, size)
    rows.setdefault("send_batch", []).append(nb / (el / 1e9))
    bar.update(1)
    for batch in system.read_batches:
        el, got = system.read(nb, batch)
        if got < nb:
            raise RuntimeError(f"{name}: read {got} messages, expected {nb}")
        rows.setdefault(f"read_x{batch}", []).append(got / (el / 1e9))
    bar.update(1)
    rows.setdefault("wakeup_ns", []).extend(system.wakeup(cfg["wake"]))
    bar.update(1)
    system.close()


def summarize(res: dict) -> dict:
    out: dict = {}
    for name, rows in res.items():
        o = out[name] = {}
        for k, v in rows.items():
            if k == "wakeup_ns":
                o["wakeup"] = lat_stats(v)
            else:
                o[k] = {"median": round(statistics.median(v), 1), "min": round(min(v), 1),
                        "max": round(max(v), 1), "runs": [round(x, 1) for x in v]}
    return out


def ratios(summary: dict) -> dict:
    ours = summary.get("ours")
    r: dict = {}
    if not ours:
        return r
    for peer in ("redis", "rabbitmq"):
        p = summary.get(peer)
        if not p:
            continue
        d = r[f"ours/{peer}"] = {}
        for k in ("send_single", "send_batch", f"read_x{PULL_BATCH}", f"read_x{BIG_PULL}"):
            if k in ours and k in p:
                d[k] = round(ours[k]["median"] / p[k]["median"], 2)
        d["wakeup_p50 (lower is better)"] = round(ours["wakeup"]["p50_us"] / p["wakeup"]["p50_us"], 2)
    return r


def plot(summary: dict, path: Path, cfg: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in ("ours", "redis", "rabbitmq") if n in summary]
    labels = {"ours": "rmq_eventstore broker", "redis": "Redis Streams (redis-py)",
              "rabbitmq": "RabbitMQ (pika)"}
    ops = [("send_single", "send, one per call\n(Rabbit: confirm each)"),
           ("send_batch", f"send batched x{cfg['batch_size']}\n(Redis: pipelined;\nRabbit: no confirms)"),
           (f"read_x{PULL_BATCH}", f"read, {PULL_BATCH} per request\n(Rabbit: consume,\nprefetch 256)"),
           (f"read_x{BIG_PULL}", f"read, {BIG_PULL} per request\n(Rabbit: n/a)")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(15, 5.5), gridspec_kw={"width_ratios": [3, 1.4]})
    w = 0.8 / len(names)
    for j, n in enumerate(names):
        vals = [summary[n][k]["median"] if k in summary[n] else 0.0 for k, _ in ops]
        bars = ax1.bar([i + j * w for i in range(len(ops))], vals, w, label=labels[n])
        for b, v in zip(bars, vals, strict=True):
            if v:
                ax1.annotate(f"{v / 1000:.1f}k", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom",
                             fontsize=8)
    ax1.set_xticks([i + w * (len(names) - 1) / 2 for i in range(len(ops))], [t for _, t in ops], fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylabel("messages/s (log scale, median of rounds)")
    ax1.set_title("Throughput over loopback, one Python client process")
    ax1.legend(fontsize=8)
    for j, n in enumerate(names):
        wk = summary[n]["wakeup"]
        ax2.bar([0 + j * w, 1 + j * w], [wk["p50_us"] / 1000, wk["p99_us"] / 1000], w, label=labels[n])
    ax2.set_xticks([w * (len(names) - 1) / 2, 1 + w * (len(names) - 1) / 2], ["p50", "p99"])
    ax2.set_yscale("log")
    ax2.set_ylabel("ms (log scale)")
    ax2.set_title("Long-poll / blocking-read wake-up latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(summary: dict, rat: dict, cfg: dict) -> str:
    names = [n for n in ("ours", "redis", "rabbitmq") if n in summary]
    lines = [f"| system | send single (msg/s) | send batched x{cfg['batch_size']} (msg/s) | read x{PULL_BATCH} "
             f"(msg/s) | read x{BIG_PULL} (msg/s) | wake-up p50 / p99 (ms) |", "|---|---|---|---|---|---|"]
    for n in names:
        s = summary[n]

        def f(k: str, s: dict = s) -> str:
            if k not in s:
                return "—"
            return f"{s[k]['median']:,.0f} ({s[k]['min']:,.0f}–{s[k]['max']:,.0f})"

        wk = s["wakeup"]
        lines.append(f"| {n} | {f('send_single')} | {f('send_batch')} | {f(f'read_x{PULL_BATCH}')} | "
                     f"{f(f'read_x{BIG_PULL}')} | "
                     f"{wk['p50_us'] / 1000:.2f} / {wk['p99_us'] / 1000:.2f} |")
    lines.append("")
    for k, d in rat.items():
        lines.append(f"- {k}: " + ", ".join(f"{a} {b}x" for a, b in d.items()))
    return "\n".join(lines)


def summarize_py_spy(raw: Path, top: int = 25) -> dict:
    """Self and inclusive sample shares per function from py-spy's raw (collapsed stacks) output."""
    self_n: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        count = int(n)
        total += count
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        leaf = frames[-1]
        self_n[leaf] = self_n.get(leaf, 0) + count
        for f in set(frames):
            incl[f] = incl.get(f, 0) + count

    def pct(d: dict[str, int]) -> list[str]:
        return [f"{100 * v / max(total, 1):5.1f}%  {k}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return {"samples": total, "self": pct(self_n), "inclusive": pct(incl)}


def profile_ours(cfg: dict, root: Path, dl: Deadline, out: Path) -> dict:
    """Per phase: cProfile of this client process, and py-spy (when installed) on the broker child."""
    report: dict = {}
    phases = (("send_single", lambda o: o.send_single(cfg["single"])),
              ("send_batch", lambda o: o.send_batch(cfg["batch"], cfg["batch_size"])),
              ("read", lambda o: (o.send_batch(cfg["batch"], cfg["batch_size"]), o.read(cfg["batch"], PULL_BATCH))))
    for label, fn in phases:
        ours = Ours(root, dl)
        raw = out.parent / f"{out.stem}-{label}.raw.txt"
        try:
            ours.child = BrokerChild(root, py_spy_out=raw if py_spy() else None, **BROKER_CONFIG)
            ours.producer = ours.Producer(ours.child.namesrv, "bench-producer")
            ours.producer.start()
            ours.warm()
            prof = cProfile.Profile()
            prof.enable()
            fn(ours)
            prof.disable()
        finally:
            ours.close()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        report[label] = {"client_cprofile": s.getvalue()}
        log(f"--- client profile: {label} ---")
        log(s.getvalue())
        if raw.exists():
            report[label]["broker_py_spy"] = summ = summarize_py_spy(raw)
            raw.unlink()
            log(f"--- broker profile (py-spy, {summ['samples']} samples): {label} ---")
            log("self:\n  " + "\n  ".join(summ["self"]))
            log("inclusive:\n  " + "\n  ".join(summ["inclusive"]))
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--reps", type=int)
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--no-rabbit", action="store_true")
    ap.add_argument("--no-ours", action="store_true", help="peers only (for checking the peers' setup)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--replot", metavar="JSON", help="only redraw the PNG from a results JSON")
    args = ap.parse_args(argv)
    cfg = dict(QUICK if args.quick else FULL)
    if args.reps:
        cfg["reps"] = args.reps
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = REPO / "var" / "bench"
    root.mkdir(parents=True, exist_ok=True)
    dl = Deadline(args.max_seconds)
    date = dt.date.today().isoformat()
    suffix = "-quick" if args.quick else ""

    if args.replot:
        doc = json.loads(Path(args.replot).read_text())
        png = out / ("broker-quick.png" if doc["config"]["reps"] == QUICK["reps"] and "-quick" in args.replot
                     else "broker.png")
        plot(doc["results"], png, doc["config"])
        log(f"wrote {png}")
        return 0

    if args.profile:
        rep = profile_ours(cfg, root, dl, out / f"broker-profile-{date}{suffix}.json")
        (out / f"broker-profile-{date}{suffix}.json").write_text(json.dumps(rep, indent=1))
        return 0

    from tqdm import tqdm

    systems: list = []
    try:
        if not args.no_ours:
            systems.append(Ours(root, dl))
        skipped: dict[str, str] = {}
        for flag, peer in ((args.no_redis, RedisPeer), (args.no_rabbit, RabbitPeer)):
            if flag:
                continue
            try:
                systems.append(peer(dl))
            except Exception as exc:  # no server on loopback: its rows are left out, and the JSON says why
                skipped[peer.name] = f"{type(exc).__name__}: {exc}"
                log(f"{peer.name} skipped: {skipped[peer.name]}")
        load_before = os.getloadavg()
        res: dict = {}
        t_start = time.monotonic()
        with tqdm(total=cfg["reps"] * len(systems) * 4, desc="bench_broker", unit="step") as bar:
            echoes: list[int] = []
            for rnd in range(cfg["reps"]):
                order = systems[rnd % len(systems):] + systems[:rnd % len(systems)]
                for s in order:
                    bar.set_postfix_str(f"round {rnd + 1}: {s.name}")
                    run_round(s, cfg, res, bar)
                echoes.append(echo_round_trips(10_000))  # a single send's floor, timed in the same round
        summary = summarize(res)
        rat = ratios(summary)
        md = markdown(summary, rat, cfg)
        doc = {
            "date": date, "config": cfg, "body_size": BODY_SIZE, "pull_batch": PULL_BATCH,
            "seconds": round(time.monotonic() - t_start, 1), "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(), "nproc": os.cpu_count(), "python": sys.version.split()[0],
            "broker": "serve_in_thread in a child process (separate GIL), default StoreConfig (ASYNC_FLUSH)",
            "results": summary, "ratios": rat, "skipped_peers": skipped, "markdown": md,
            "echo_round_trips_per_s": statistics.median(echoes), "echoes": echoes,
        }
        (out / f"broker-{date}{suffix}.json").write_text(json.dumps(doc, indent=1))
        plot(summary, out / f"broker{suffix}.png", cfg)
        print(md)
        log(f"wrote {out / f'broker-{date}{suffix}.json'} and {out / f'broker{suffix}.png'}")
    finally:
        for s in systems:
            try:
                s.close()
            except Exception as exc:  # cleanup must continue for the other systems
                log(f"cleanup of {s.name} failed: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
