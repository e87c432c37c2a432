"""Queue deletion and expiry in the kombu transport: `queue_delete` deletes the queue's topic (lanes and pop
retry topic included) and its bindings; an `auto_delete` queue goes when its last consumer is cancelled;
an `x-expires` queue nobody uses is swept, one in use is leased and stays; the bindings log is compacted
into snapshots, so a new connection replays only what came after the last one."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection, Consumer, Exchange, Queue

import rmq_eventstore.kombu.bindings as bindings
from rmq_eventstore.client import Admin, ensure_local_broker, stop_local_broker
from rmq_eventstore.kombu.names import topic_name


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    store = tmp_path_factory.mktemp("kexp") / "store"
    b = ensure_local_broker(store, idle_exit=None)
    yield b.namesrv_addr, store
    stop_local_broker(store)


@pytest.fixture
def ns() -> str:
    return "x" + uuid.uuid4().hex[:12]


def conn(namesrv: str, ns: str, **opts: object) -> Connection:
    return Connection(f"rocketmq://{namesrv}//", transport_options={"namespace": ns, **opts})


def topics(namesrv: str, ns: str) -> set[str]:
    with Admin(namesrv) as a:
        return {t for t in a.topic_list() if t.startswith(ns + "%")}


def wait_for(cond, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_queue_delete_deletes_topic_lanes_and_bindings(broker: tuple[str, Path], ns: str) -> None:
    namesrv, store = broker
    ex = Exchange("ex", "direct")
    q = Queue("work.q", ex, routing_key="k", max_priority=9)
    with conn(namesrv, ns) as c:
        ch = c.default_channel
        bq = q.bind(ch)
        bq.declare()
        with c.Producer() as p:
            for i in range(3):
                p.publish({"i": i}, exchange=ex, routing_key="k", priority=i * 4)
        deadline = time.monotonic() + 10
        m = bq.get(no_ack=False)
        while m is None and time.monotonic() < deadline:
            m = bq.get(no_ack=False)
        assert m is not None
        m.requeue()  # a pop retry topic for the group
        topic = topic_name("work.q", ns)
        assert topic in topics(namesrv, ns)
        assert wait_for(lambda: (store / "consumequeue" / topic / "8").is_dir(), 10)  # lanes
        assert 0 <= bq.delete() <= 3  # ready messages (the requeued one may be on its way back, sends dispatching)
        assert topic not in topics(namesrv, ns)
        assert not (store / "consumequeue" / topic).exists()
        assert not any(t.startswith("%RETRY%") and t.endswith(topic) for t in Admin(namesrv).topic_list())
        chan = c.default_channel
        assert chan.clients.shared.queue("work.q") is None and not chan.get_table("ex")
    with conn(namesrv, ns) as c2:  # another connection sees it gone
        assert c2.default_channel.clients.shared.queue("work.q") is None
        with pytest.raises(Exception, match="NOT_FOUND"):
            c2.default_channel.queue_declare("work.q", passive=True)


def test_auto_delete_queue_goes_with_its_last_consumer(broker: tuple[str, Path], ns: str) -> None:
    namesrv, store = broker
    q = Queue("short.lived", Exchange("ev", "fanout"), auto_delete=True)
    kept = Queue("durable.one", Exchange("ev", "fanout"))
    with conn(namesrv, ns) as c:
        consumer = Consumer(c.default_channel, [q, kept], callbacks=[lambda b, m: m.ack()])
        consumer.consume()
        assert topic_name("short.lived", ns) in topics(namesrv, ns)
        consumer.cancel()
        assert topic_name("short.lived", ns) not in topics(namesrv, ns)
        assert topic_name("durable.one", ns) in topics(namesrv, ns)
        assert c.default_channel.clients.shared.queue("short.lived") is None
    # closing the connection cancels the consumers: the same
    with conn(namesrv, ns) as c:
        Consumer(c.default_channel, [q], callbacks=[lambda b, m: m.ack()]).consume()
        assert topic_name("short.lived", ns) in topics(namesrv, ns)
    assert topic_name("short.lived", ns) not in topics(namesrv, ns)


def test_x_expires_unused_queue_is_swept_used_one_is_leased(broker: tuple[str, Path], ns: str) -> None:
    namesrv, store = broker
    idle = Queue("idle.q", Exchange("d", "direct"), routing_key="idle", expires=1.5)
    busy = Queue("busy.q", Exchange("d", "direct"), routing_key="busy", expires=1.5)
    got: list = []
    with conn(namesrv, ns, expiry_sweep_interval=0) as user, conn(namesrv, ns, expiry_sweep_interval=0.5) as sweeper:
        idle.bind(user.default_channel).declare()
        Consumer(user.default_channel, [busy], callbacks=[lambda b, m: (got.append(b), m.ack())]).consume()
        assert sweeper.default_channel.clients is not None  # its keeper thread starts with its clients
        t_idle, t_busy = topic_name("idle.q", ns), topic_name("busy.q", ns)
        assert {t_idle, t_busy} <= topics(namesrv, ns)
        assert wait_for(lambda: t_idle not in topics(namesrv, ns), 15)
        time.sleep(3.0)  # twice its x-expires: its consumer's leases keep it
        assert t_busy in topics(namesrv, ns)
        assert sweeper.default_channel.clients.shared.queue("busy.q") is not None
        assert sweeper.default_channel.clients.shared.queue("idle.q") is None
        assert not sweeper.default_channel.get_table("d") or all(b[2] != "idle.q" for b in sweeper.default_channel.get_table("d"))
        # the consumer still works after the sweeps
        with user.Producer() as p:
            p.publish({"x": 1}, exchange=Exchange("d", "direct"), routing_key="busy")
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            try:
                user.drain_events(timeout=1)
            except TimeoutError:
                pass
        assert got == [{"x": 1}]


def test_bindings_log_is_compacted_into_snapshots(broker: tuple[str, Path], ns: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    namesrv, _ = broker
    monkeypatch.setattr(bindings, "SNAPSHOT_EVERY", 40)
    ex = Exchange("reply", "direct")
    with conn(namesrv, ns) as c:
        ch = c.default_channel
        Queue("stays", ex, routing_key="stays").bind(ch).declare()
        for i in range(30):  # a reply queue declared, bound and deleted 30 times: ~90 records
            q = Queue(f"r{i}.reply", ex, routing_key=f"r{i}").bind(ch)
            q.declare()
            q.delete()
        offset = ch.clients.shared._offset
    assert offset >= 90
    with conn(namesrv, ns) as c:
        shared = c.default_channel.clients.shared
        shared.refresh()
        assert shared.replayed < 40  # started from a snapshot
        assert shared.queue("stays") is not None and shared.queue("r3.reply") is None
        assert [b[2] for b in c.default_channel.get_table("reply")] == ["stays"]
    assert not {t for t in topics(namesrv, ns) if "reply" in t}


def test_200_celery_pings_leave_no_reply_topic() -> None:
    """The small version of `make expirytest`: a real worker, 200 `inspect(limit=1).ping()` calls, each with a
    new reply queue; none of their topics (nor their pop retry topics) is left."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "celery_inspect_expiry.py"), "--pings", "200"],
                       capture_output=True, text=True, timeout=180, cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "reply queue topics left: 0" in r.stdout and "answered: 200" in r.stdout

