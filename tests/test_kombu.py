"""`rmq_eventstore.kombu`: what kombu's mixins do not cover. Routing across processes (bindings made in
one process, used by another), redelivery after a consumer is SIGKILLed, reject/requeue and restore on
close, exact prefetch, several queues at once, the delivery-time hint, both ways of selecting the
transport, the local-store URL, and the queue ↔ topic name mapping."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kombu import Connection, Consumer, Exchange, Producer, Queue

import rmq_eventstore.kombu as rk
from rmq_eventstore.client import ensure_local_broker, stop_local_broker
from rmq_eventstore.common.topic import is_valid_topic
from rmq_eventstore.kombu.names import escape, queue_name, topic_name, unescape

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = tmp_path_factory.mktemp("kombu") / "store"
    broker = ensure_local_broker(store, idle_exit=None)
    yield broker.namesrv_addr
    stop_local_broker(store)


@pytest.fixture
def ns() -> str:
    return "t" + uuid.uuid4().hex[:12]


def conn(namesrv: str, ns: str, **opts: object) -> Connection:
    return Connection(f"rocketmq://{namesrv}//", transport_options={"namespace": ns, **opts})


def child(code: str, *args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def wait_line(p: subprocess.Popen, want: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            raise AssertionError(f"child ended before {want!r}: {p.stderr.read()[-2000:]}")
        if line.startswith(want):
            return line.strip()
    raise AssertionError(f"no {want!r} within {timeout} s")


def drain_all(c: Connection, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            c.drain_events(timeout=max(deadline - time.monotonic(), 0.01))
        except TimeoutError:
            return


# -- selection -----------------------------------------------------------------------------------------------
def test_declarations() -> None:
    t = rk.Transport
    assert t.driver_type == "rocketmq"
    assert t.implements.exchange_type == frozenset({"direct", "topic", "fanout"})
    assert t.implements.asynchronous is True
    assert kombu.transport.TRANSPORT_ALIASES["rocketmq"] == "rmq_eventstore.kombu:Transport"
    from rmq_eventstore.client import LocalBrokerError, RemotingError, RemotingTimeoutError
    for e in (RemotingError, RemotingTimeoutError, LocalBrokerError, OSError, ConnectionResetError, TimeoutError):
        assert issubclass(e, t.connection_errors)


def test_options_it_does_not_read_are_named_once(caplog: pytest.LogCaptureFixture) -> None:
    """A misspelt option or another broker's is named in one warning per process (with the name it was probably
    meant to be), kombu's own (a publish retry policy, failover) are not, and every option the transport reads
    is in the list it prints: no connection is made to find out."""
    from rmq_eventstore.kombu import transport as tm

    tm._warned_options.clear()
    opts = {"visiblity_timeout": 10, "fanout_prefix": True, "max_retries": 3, "interval_start": 0,
            "namespace": "n", "eta_lead": 1}
    for _ in range(2):
        Connection("rocketmq://127.0.0.1:1//", transport_options=opts).transport  # noqa: B018
    warned = [r.getMessage() for r in caplog.records if "does not read" in r.getMessage()]
    assert len(warned) == 1
    assert "visiblity_timeout (did you mean visibility_timeout?)" in warned[0] and "fanout_prefix" in warned[0]
    assert "max_retries" not in warned[0].split(";")[0] and "namespace" not in warned[0].split(";")[0]
    Connection("rocketmq://127.0.0.1:1//", transport_options={"namespace": "n", "max_retries": 1}).transport  # noqa: B018
    assert len([r for r in caplog.records if "does not read" in r.getMessage()]) == 1
    # every option read in the transport's source is known (a new one added without listing it would warn)
    src = Path(tm.__file__).read_text()
    read = set(re.findall(r'opts\.get\("([a-z_]+)"', src)) | set(tm.Channel.from_transport_options)
    assert read <= tm.OWN_OPTIONS


def test_selected_by_class_path_without_the_alias(namesrv: str, ns: str) -> None:
    """A fresh interpreter that never imported rmq_eventstore.kombu: kombu refuses the scheme, the explicit
    transport (kombu `transport=`, Celery `broker_transport`) works."""
    p = child(f"""
        import kombu, sys
        url = "rocketmq://{namesrv}//"
        try:
            kombu.Connection(url).connect()
        except (KeyError, ValueError) as e:
            print("refused", type(e).__name__)
        with kombu.Connection(url, transport="rmq_eventstore.kombu:Transport",
                              transport_options={{"namespace": "{ns}"}}) as c:
            q = c.SimpleQueue("sel")
            q.put({{"x": 1}})
            m = q.get(timeout=5); m.ack()
            print("kombu", m.payload["x"], type(c.transport).__module__)
        import celery
        app = celery.Celery(broker=url, broker_transport="rmq_eventstore.kombu:Transport",
                            broker_transport_options={{"namespace": "{ns}"}})
        with app.connection_for_write() as c:
            c.connect()
            print("celery", c.transport.driver_type)
    """)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert "refused KeyError" in out
    assert "kombu 1 rmq_eventstore.kombu.transport" in out
    assert "celery rocketmq" in out


def test_local_store_url_finds_or_starts_the_broker(tmp_path: Path) -> None:
    store = tmp_path / "store"
    url = f"rocketmq://{store}"  # rocketmq:///abs/path
    try:
        p = child(f"""
            import logging, rmq_eventstore.kombu, kombu
            logging.basicConfig(level=logging.WARNING)
            with kombu.Connection("{url}") as c:
                c.clone().release()  # what Celery does with its connections (kombu fills in defaults here)
                c.SimpleQueue("local").put({{"from": "child"}})
            print("sent")
        """)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and "sent" in out, err
        assert "No hostname was supplied" not in err  # a path URL has no host on purpose: kombu must not warn
        with Connection(url) as c:  # the same broker, found through <store>/broker.json
            m = c.SimpleQueue("local").get(timeout=5)
            assert m.payload == {"from": "child"}
            m.ack()
        data = json.loads((store / "broker.json").read_text())
        assert data["pid"] != os.getpid()
    finally:
        stop_local_broker(store)


# -- routing across processes ------------------------------------------------------------------------------------
CONSUMER = """
    import sys, json, kombu, rmq_eventstore.kombu
    namesrv, ns, qname = sys.argv[1:4]
    fan = kombu.Exchange("xp_fanout", type="fanout")
    direct = kombu.Exchange("xp_direct", type="direct")
    topic = kombu.Exchange("xp_topic", type="topic")
    queue = kombu.Queue(qname, bindings=[kombu.binding(fan), kombu.binding(direct, routing_key=qname),
                                         kombu.binding(topic, routing_key=qname + ".#")])
    with kombu.Connection(f"rocketmq://{namesrv}//", transport_options={"namespace": ns}) as c:
        got = []
        def cb(body, m):
            got.append(body); m.ack(); print("got", json.dumps(body), flush=True)
        with kombu.Consumer(c, [queue], callbacks=[cb]):
            print("ready", flush=True)
            while True:
                try:
                    c.drain_events(timeout=30)
                except TimeoutError:
                    pass
"""


def test_fanout_direct_and_topic_routing_across_processes(namesrv: str, ns: str) -> None:
    """Bindings made by two consumer processes route what a third process publishes, though the publisher
    never declared the exchanges' bindings (nor, for the fanout, the exchange)."""
    kids = [child(CONSUMER, namesrv, ns, name) for name in ("xa", "xb")]
    try:
        for k in kids:
            wait_line(k, "ready")
        with conn(namesrv, ns) as c:
            p = Producer(c.channel())
            p.publish({"to": "all"}, exchange="xp_fanout", routing_key="")  # never declared here
            p.publish({"to": "xb"}, exchange=Exchange("xp_direct", type="direct"), routing_key="xb")
            p.publish({"to": "nobody"}, exchange=Exchange("xp_direct", type="direct"), routing_key="zz")
            p.publish({"to": "xa.t"}, exchange=Exchange("xp_topic", type="topic"), routing_key="xa.t.1")
            p.publish({"to": "xb.t"}, exchange=Exchange("xp_topic", type="topic"), routing_key="xb.t")
        got = {name: sorted(wait_line(k, "got")[4:] for _ in range(n))
               for name, k, n in zip(("xa", "xb"), kids, (2, 3), strict=True)}
        assert got["xa"] == sorted(json.dumps(x) for x in ({"to": "all"}, {"to": "xa.t"}))
        assert got["xb"] == sorted(json.dumps(x) for x in ({"to": "all"}, {"to": "xb"}, {"to": "xb.t"}))
        assert all({"to": "nobody"} not in v for v in got.values())
    finally:
        for k in kids:
            k.kill()
            k.wait()


# -- redelivery -----------------------------------------------------------------------------------------------
def test_sigkilled_consumer_message_comes_back_after_visibility_timeout(namesrv: str, ns: str) -> None:
    with conn(namesrv, ns) as c:
        c.SimpleQueue("vt").put({"n": 1})
    k = child("""
        import sys, kombu, rmq_eventstore.kombu, time
        namesrv, ns = sys.argv[1:3]
        c = kombu.Connection(f"rocketmq://{namesrv}//", transport_options={"namespace": ns, "visibility_timeout": 2})
        m = c.SimpleQueue("vt").get(timeout=10)
        print("holding", m.payload["n"], flush=True)
        time.sleep(60)
    """, namesrv, ns)
    try:
        assert wait_line(k, "holding") == "holding 1"
        k.send_signal(signal.SIGKILL)
        k.wait()
        killed = time.monotonic()
    finally:
        k.kill()
    with conn(namesrv, ns, visibility_timeout=30) as c:
        q = c.SimpleQueue("vt")
        with pytest.raises(q.Empty):
            q.get_nowait()  # still invisible: the dead consumer's lease runs
        m = q.get(timeout=15)
        assert m.payload == {"n": 1}
        assert m.delivery_info.get("redelivered") is True
        assert time.monotonic() - killed < 10
        m.ack()
        with pytest.raises(q.Empty):
            q.get(timeout=3)


def test_reject_requeue_and_restore_on_close(namesrv: str, ns: str) -> None:
    with conn(namesrv, ns) as c:
        q = c.SimpleQueue("rq")
        q.put({"n": 1})
        m = q.get(timeout=5)
        m.reject(requeue=True)
        m2 = q.get(timeout=5)
        assert m2.payload == {"n": 1} and m2.delivery_info["redelivered"] is True
        assert m2.delivery_tag != m.delivery_tag  # a tag per delivery
        m2.reject(requeue=False)
        with pytest.raises(q.Empty):
            q.get(timeout=1.5)
        q.put({"n": 2})
        assert q.get(timeout=5).payload == {"n": 2}  # not acked: given back when the connection closes
    t0 = time.monotonic()
    with conn(namesrv, ns) as c:
        m = c.SimpleQueue("rq").get(timeout=10)
        assert m.payload == {"n": 2} and time.monotonic() - t0 < 5  # long before the 3600 s visibility timeout
        m.ack()


# -- acks -----------------------------------------------------------------------------------------------------------
def test_acks_go_in_batches_and_all_land_by_close(namesrv: str, ns: str) -> None:
    """`basic_ack` hands the ack to the connection's batcher and returns: acks that come while a batch is in
    flight go together in the next BATCH_ACK_MESSAGE, and closing the connection waits for all of them, so
    none of the messages comes back after its (short) lease. A malformed delivery tag still raises at once."""
    n = 150
    sizes: list[int] = []
    with conn(namesrv, ns, visibility_timeout=2) as c:
        q = c.SimpleQueue("batched")
        for i in range(n):
            q.put({"n": i})
        pop = c.transport.clients().pop
        real = pop.ack_batch

        def counting(msgs: list) -> None:
            real(msgs)
            sizes.append(len(msgs))

        pop.ack_batch = counting  # a spy on the real client: the acks still go to the broker
        got = [q.get(timeout=10) for _ in range(n)]
        assert sorted(m.payload["n"] for m in got) == list(range(n))
        t0 = time.monotonic()
        for m in got:
            m.ack()
        took = time.monotonic() - t0
        with pytest.raises(ValueError):
            c.default_channel.basic_ack("batched/not a receipt handle")
    print(f"\n{n} acks taken in {took * 1000:.1f} ms, sent in {len(sizes)} requests: {sizes}")
    assert sum(sizes) == n and max(sizes) > 1  # all answered before close returned, some together
    with conn(namesrv, ns) as c:
        with pytest.raises(c.SimpleQueue("batched").Empty):
            c.SimpleQueue("batched").get(timeout=4)  # past the 2 s leases: nothing comes back


def test_acks_of_a_process_that_exits_without_closing_still_land(namesrv: str, ns: str) -> None:
    """A process that acks and exits at once, its connection never closed, still delivers its acks (the
    batcher is flushed at exit): none of its messages comes back after its lease."""
    with conn(namesrv, ns) as c:
        q = c.SimpleQueue("exit")
        for i in range(20):
            q.put({"n": i})
    k = child("""
        import sys, kombu, rmq_eventstore.kombu
        namesrv, ns = sys.argv[1:3]
        c = kombu.Connection(f"rocketmq://{namesrv}//", transport_options={"namespace": ns, "visibility_timeout": 2})
        q = c.SimpleQueue("exit")
        msgs = [q.get(timeout=10) for _ in range(20)]
        for m in msgs:
            m.ack()
        print("acked", len(msgs), flush=True)
    """, namesrv, ns)
    try:
        assert wait_line(k, "acked") == "acked 20"
        assert k.wait(30) == 0, k.stderr.read()[-2000:]
    finally:
        k.kill()
    with conn(namesrv, ns) as c:
        with pytest.raises(c.SimpleQueue("exit").Empty):
            c.SimpleQueue("exit").get(timeout=4)  # past the 2 s leases


def test_without_ack_batching_each_ack_is_a_round_trip(namesrv: str, ns: str) -> None:
    """Transport option `ack_batching=False`: `basic_ack` returns once the broker has the ack."""
    with conn(namesrv, ns, visibility_timeout=2, ack_batching=False) as c:
        q = c.SimpleQueue("unbatched")
        q.put({"n": 1})
        m = q.get(timeout=10)
        assert c.transport._acks is None
        m.ack()
    with conn(namesrv, ns) as c:
        with pytest.raises(c.SimpleQueue("unbatched").Empty):
            c.SimpleQueue("unbatched").get(timeout=4)


# -- prefetch -----------------------------------------------------------------------------------------------------
def test_prefetch_is_exact(namesrv: str, ns: str) -> None:
    queue = Queue("pf")
    with conn(namesrv, ns) as c:
        p = Producer(c.channel())
        for i in range(10):
            p.publish({"i": i}, routing_key="pf", declare=[queue])
        got = []
        ch = c.channel()
        with Consumer(ch, [queue], callbacks=[lambda body, m: got.append(m)], prefetch_count=3):
            drain_all(c, 1.5)
            assert len(got) == 3
            with conn(namesrv, ns) as other:  # the rest is left in the broker for others
                oq = other.SimpleQueue("pf")
                seen = []
                for _ in range(7):
                    seen.append(oq.get(timeout=5))
                with pytest.raises(oq.Empty):
                    oq.get(timeout=0.5)
                for m in seen[:2]:
                    m.ack()
                # the other 5 go back when `other` closes
            got[0].ack()
            drain_all(c, 1.5)
            assert len(got) == 4  # one ack, one more
            for _ in range(5):
                for m in got:
                    if not m.acknowledged:
                        m.ack()
                drain_all(c, 1.0)
                assert sum(not m.acknowledged for m in got) <= 3
            for m in got:
                if not m.acknowledged:
                    m.ack()
        assert len(got) == 8  # 10 - the 2 acked by `other`


def test_several_queues_at_once(namesrv: str, ns: str) -> None:
    """One connection consuming two queues on two channels (a Celery worker's task queue and its
    remote-control queue): each message is delivered promptly, whichever queue it is on."""
    with conn(namesrv, ns) as c, conn(namesrv, ns) as pub:
        got = []
        qa, qb = Queue("ma"), Queue("mb")
        ca = Consumer(c.channel(), [qa], callbacks=[lambda b, m: (got.append(b), m.ack())])
        cb = Consumer(c.channel(), [qb], callbacks=[lambda b, m: (got.append(b), m.ack())], no_ack=True)
        with ca, cb:
            p = Producer(pub.channel())
            for i in range(4):
                q = (qa, qb)[i % 2]
                t0 = time.monotonic()
                p.publish({"i": i}, routing_key=q.name, declare=[q])
                while len(got) <= i and time.monotonic() - t0 < 5:
                    try:
                        c.drain_events(timeout=2)
                    except TimeoutError:
                        pass
                assert got[-1] == {"i": i}
                assert time.monotonic() - t0 < 1.0
    assert len(got) == 4


def test_deliver_at_hint_sends_a_timer_message(namesrv: str, ns: str) -> None:
    with conn(namesrv, ns) as c:
        q = c.SimpleQueue("eta")
        due = time.time() + 2.5
        q.put({"late": True}, deliver_at=due)
        q.put({"late": False})
        assert q.get(timeout=3).payload == {"late": False}
        with pytest.raises(q.Empty):
            q.get(timeout=1)
        m = q.get(timeout=6)
        assert m.payload == {"late": True} and time.time() >= due - 0.01
        m.ack()


def test_queue_message_ttl_and_purge_and_size(namesrv: str, ns: str) -> None:
    with conn(namesrv, ns) as c:
        ch = c.channel()
        q = Queue("ttlq", message_ttl=1)(ch)
        q.declare()
        p = Producer(ch)
        p.publish({"n": 1}, routing_key="ttlq")
        time.sleep(1.3)
        p.publish({"n": 2}, routing_key="ttlq")
        assert q.get(no_ack=True).payload == {"n": 2}
        assert q.get() is None
        for i in range(5):
            p.publish({"n": i}, routing_key="ttlq")
        assert q.queue_declare(passive=True).message_count == 5
        assert q.purge() == 5
        assert q.get() is None


# -- names ---------------------------------------------------------------------------------------------------------
@given(st.text(min_size=1, max_size=30))
def test_queue_names_map_to_legal_topics_and_back(name: str) -> None:
    try:
        t = topic_name(name)
    except ValueError:
        assert len(escape(name)) > 127 - len("kombu-")
        return
    assert is_valid_topic(t)
    assert queue_name(t) == name
    assert unescape(escape(name)) == name
    if len(t) + 4 <= 127:
        assert topic_name(name, "ns1") == "ns1%" + t and queue_name(topic_name(name, "ns1"), "ns1") == name


@given(st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12))
def test_queue_names_never_collide(a: str, b: str) -> None:
    if a != b:
        assert escape(a) != escape(b)


def test_celery_names() -> None:
    assert topic_name("celery") == "kombu-celery"
    assert topic_name("w1@host.celery.pidbox") == "kombu-w1_Ahost_Pcelery_Ppidbox"
    assert topic_name("a_b") == "kombu-a__b" and topic_name("é") == "kombu-_c3_a9"
    with pytest.raises(ValueError):
        unescape("_2e")  # '.' is written _P, never as hex: one spelling per name


# -- Celery ----------------------------------------------------------------------------------------------------
CELERY_APP = """
import rmq_eventstore.kombu  # noqa: F401
from celery import Celery

app = Celery("kapp", broker="rocketmq://{store}", backend="file://{results}")
app.conf.broker_connection_retry_on_startup = True


@app.task
def add(x, y):
    return x + y
"""


def test_celery_worker_answers_remote_control_and_runs_tasks(tmp_path: Path) -> None:
    """A Celery worker process on `rocketmq:///path` (Celery fills in kombu's default host and port, the path
    still names the store): `inspect ping` (fanout to the worker, direct reply to the client's queue) and
    task round trips from another process."""
    store, results = tmp_path / "store", tmp_path / "results"
    results.mkdir()
    (tmp_path / "kapp.py").write_text(CELERY_APP.format(store=store, results=results))
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
    celery = [sys.executable, "-m", "celery", "-A", "kapp"]
    worker = subprocess.Popen([*celery, "worker", "-P", "solo", "--without-mingle", "--without-gossip", "-l",
                               "warning"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            r = subprocess.run([*celery, "inspect", "ping", "-t", "2"], cwd=tmp_path, env=env, capture_output=True,
                               text=True, timeout=60)
            if "pong" in r.stdout:
                break
            assert time.monotonic() < deadline, r.stdout + r.stderr
        r = subprocess.run([sys.executable, "-c", "from kapp import add; "
                            "print(sum(add.delay(i, i).get(timeout=30) for i in range(10)))"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=90)
        assert r.stdout.strip() == "90", r.stderr
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
        stop_local_broker(store)
