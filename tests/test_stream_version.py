"""Expected-version appends: versions numbered by the broker, conflicts that store nothing, batches all or
none, versions re-derived from the store after a restart, reservations of open transactions, racing writers
across processes, and a clear refusal from a broker that lacks the extension."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_eventstore.broker import RunningBroker, serve_in_thread
from rmq_eventstore.client import (
    Admin,
    ConcurrencyError,
    ExtensionNotSupportedError,
    Message,
    Producer,
    TransactionProducer,
    TransactionState,
)
from rmq_eventstore.remoting import RequestCode
from rmq_eventstore.store import MessageStore

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}
RACE_ROUNDS = int(os.environ.get("STREAM_RACE_ROUNDS", "30"))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    with serve_in_thread(tmp_path / "store", **SMALL) as rb:
        yield rb


def stream_events(rb: RunningBroker, topic: str, stream: str) -> list[tuple[int, bytes]]:
    """All events of a stream, in order: one index query plus a sort."""
    rb.store.wait_for_dispatch()
    return [(int(m.properties["STREAM_VERSION"]), bytes(m.body))
            for m in rb.broker.stream_versions.read(topic, stream)]


def test_versions_are_numbered_and_checked(broker: RunningBroker) -> None:
    with Producer(broker.namesrv_address, "orders-app") as p:
        r1 = p.send(Message("orders", b"placed"), stream="order-1", expected_version=0)
        r2 = p.send(Message("orders", b"paid", keys="pay-7"), stream="order-1", expected_version=1)
        r3 = p.send(Message("orders", b"note"), stream="order-1")  # no check: the next version all the same
        assert (r1.stream_version, r2.stream_version, r3.stream_version) == (1, 2, 3)
        with pytest.raises(ConcurrencyError) as e:
            p.send(Message("orders", b"stale"), stream="order-1", expected_version=1)
        assert (e.value.stream, e.value.expected_version, e.value.current_version) == ("order-1", 1, 3)
        assert "expected 1, current 3" in str(e.value)
        with pytest.raises(ConcurrencyError):
            p.send(Message("orders", b"dup create"), stream="order-1", expected_version=0)
        assert p.send(Message("orders", b"other"), stream="order-2", expected_version=0).stream_version == 1
        assert len({r1.queue_id, r2.queue_id, r3.queue_id}) == 1  # a stream keeps to one queue
    assert stream_events(broker, "orders", "order-1") == [(1, b"placed"), (2, b"paid"), (3, b"note")]
    paid = Admin(broker.namesrv_address).query_message("orders", "pay-7")[0]
    assert paid.keys_list() == ["pay-7", "order-1"]  # the user's keys are kept, the stream id added


def test_a_batch_is_all_or_nothing(broker: RunningBroker) -> None:
    with Producer(broker.namesrv_address, "orders-app") as p:
        r = p.send_batch([Message("orders", b"a"), Message("orders", b"b"), Message("orders", b"c")],
                         stream="order-9", expected_version=0)
        assert r.stream_version == 3
        with pytest.raises(ConcurrencyError):
            p.send_batch([Message("orders", b"x"), Message("orders", b"y")], stream="order-9", expected_version=2)
        r = p.send_batch([Message("orders", b"d"), Message("orders", b"e")], stream="order-9", expected_version=3)
        assert r.stream_version == 5
    assert [v for v, _ in stream_events(broker, "orders", "order-9")] == [1, 2, 3, 4, 5]
    assert broker.broker.stream_versions.read("orders", "order-9", from_version=4)[-1].body == b"e"


@pytest.mark.parametrize("bad", ["", "has space", "a\x01b", "x" * 256])
def test_bad_stream_ids_are_refused(broker: RunningBroker, bad: str) -> None:
    from rmq_eventstore.client import MQBrokerError

    with Producer(broker.namesrv_address, "orders-app") as p, pytest.raises((MQBrokerError, ValueError)):
        p.send(Message("orders", b"x"), stream=bad, queue_id=0)


def test_system_and_retry_topics_take_no_stream_appends(broker: RunningBroker) -> None:
    code, remark, _ = broker.broker.send_messages([Message("%RETRY%g", b"x", properties_string="")],
                                                  stream="s", expected_version=None)
    assert code != 0 and "takes no stream appends" in (remark or "")


def test_versions_survive_a_restart_from_the_store_alone(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with serve_in_thread(root, **SMALL) as rb, Producer(rb.namesrv_address, "app") as p:
        for i in range(40):  # more events than one index probe reads, with non-stream uses of the same key
            p.send(Message("orders", f"e{i}".encode()), stream="order-5", expected_version=i)
            p.send(Message("orders", b"noise", keys="order-5"))
    assert not (root / "config" / "streams.json").exists()
    with serve_in_thread(root, **SMALL) as rb, Producer(rb.namesrv_address, "app") as p:
        with pytest.raises(ConcurrencyError) as e:
            p.send(Message("orders", b"stale"), stream="order-5", expected_version=39)
        assert e.value.current_version == 40
        assert p.send(Message("orders", b"e40"), stream="order-5", expected_version=40).stream_version == 41


def test_an_open_transaction_reserves_its_version(tmp_path: Path) -> None:
    root = tmp_path / "store"
    decided: dict[str, TransactionState] = {}
    with serve_in_thread(root, **SMALL, transaction_timeout=60_000) as rb:
        with TransactionProducer(rb.namesrv_address, "app", lambda m: decided.get(m.keys_list()[0],
                                                                                  TransactionState.UNKNOWN)) as tp, \
                Producer(rb.namesrv_address, "app") as p:
            p.send(Message("orders", b"created"), stream="order-3", expected_version=0)

            def while_open(msg: Message) -> TransactionState:
                with pytest.raises(ConcurrencyError) as e:
                    p.send(Message("orders", b"meanwhile"), stream="order-3", expected_version=1)
                assert "pending transaction" in str(e.value) and e.value.current_version == 2
                return TransactionState.ROLLBACK

            r = tp.send_in_transaction(Message("orders", b"rolled back", keys="t1"), while_open,
                                       stream="order-3", expected_version=1)
            assert r.stream_version == 2 and r.local_transaction_state is TransactionState.ROLLBACK
            deadline = time.monotonic() + 5
            while rb.broker.stream_versions.pending_count() and time.monotonic() < deadline:
                time.sleep(0.02)
            # the rollback freed version 2: no hole in the numbering
            assert p.send(Message("orders", b"shipped"), stream="order-3", expected_version=1).stream_version == 2
            # an open (UNKNOWN) transaction holding version 3 ...
            tp.send_in_transaction(Message("orders", b"late", keys="t2"), lambda m: TransactionState.UNKNOWN,
                                   stream="order-3", expected_version=2)
    # ... still holds it after a restart (reservations are rebuilt from the half queue) ...
    with serve_in_thread(root, **SMALL, transaction_timeout=200, transaction_check_interval=100) as rb:
        assert rb.broker.stream_versions.pending_count() == 1
        with Producer(rb.namesrv_address, "app") as p:
            with pytest.raises(ConcurrencyError):
                p.send(Message("orders", b"x"), stream="order-3", expected_version=2)
            # ... until the check-back commits it
            decided["t2"] = TransactionState.COMMIT
            with TransactionProducer(rb.namesrv_address, "app", lambda m: decided[m.keys_list()[0]]) as tp:
                tp._base.route("orders")
                deadline = time.monotonic() + 10
                while rb.broker.stream_versions.pending_count() and time.monotonic() < deadline:
                    time.sleep(0.05)
            assert p.send(Message("orders", b"after"), stream="order-3", expected_version=3).stream_version == 4
        assert [b for _, b in stream_events(rb, "orders", "order-3")] == [b"created", b"shipped", b"late", b"after"]


def test_a_broker_without_the_extension_is_refused_before_sending(broker: RunningBroker) -> None:
    broker.broker._processors.pop(RequestCode.GET_BROKER_EXTENSIONS)  # what an Apache RocketMQ broker answers
    with Producer(broker.namesrv_address, "app") as p:
        before = broker.store.get_max_phy_offset()
        with pytest.raises(ExtensionNotSupportedError) as e:
            p.send(Message("orders", b"x"), stream="order-1", expected_version=0)
        assert "nothing was sent" in str(e.value) and "TransactionProducer" in str(e.value)
        assert broker.store.get_max_phy_offset() == before
        assert p.send(Message("orders", b"plain")).status == "SEND_OK"  # plain sends still work


RACER = textwrap.dedent("""
    import sys
    from rmq_eventstore.client import ConcurrencyError, Message, Producer
    namesrv, me, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with Producer(namesrv, "racers") as p:
        p.send(Message("race", b"warm-up"), stream=f"warm-{me}")
        print("ready", flush=True)
        for line in sys.stdin:
            r = int(line)
            try:
                p.send(Message("race", f"{me}:{r}".encode()), stream="contested", expected_version=r)
                print(f"won {r}", flush=True)
            except ConcurrencyError:
                print(f"lost {r}", flush=True)
""")


def test_racing_writers_across_processes_exactly_one_wins_each_round(broker: RunningBroker, tmp_path: Path) -> None:
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    racers = [subprocess.Popen([sys.executable, str(script), broker.namesrv_address, str(i), str(RACE_ROUNDS)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(16)]
    try:
        for r in racers:
            assert r.stdout is not None and r.stdout.readline().strip() == "ready"
        for rnd in range(RACE_ROUNDS):
            for r in racers:
                assert r.stdin is not None
                r.stdin.write(f"{rnd}\n")
                r.stdin.flush()
            answers = [r.stdout.readline().split()[0] for r in racers if r.stdout is not None]
            assert answers.count("won") == 1, (rnd, answers)
    finally:
        for r in racers:
            if r.stdin is not None:
                r.stdin.close()
            r.wait(30)
    versions = [v for v, _ in stream_events(broker, "race", "contested")]
    assert versions == list(range(1, RACE_ROUNDS + 1))


CRASH_RACER = textwrap.dedent("""
    import sys
    from rmq_eventstore.client import ConcurrencyError, Message, Producer, RemotingError
    namesrv, me = sys.argv[1], sys.argv[2]
    with Producer(namesrv, "racers", send_timeout_ms=2000, retry_times_when_send_failed=0) as p:
        print("ready", flush=True)
        for line in sys.stdin:
            r = int(line)
            try:
                p.send(Message("race", f"{me}:{r}".encode()), stream="contested", expected_version=r)
                print(f"won {r}", flush=True)
            except ConcurrencyError as e:
                print(f"lost {r} {e.current_version}", flush=True)
            except Exception as e:
                print(f"error {r} {type(e).__name__}", flush=True)
""")


def test_racing_writers_through_broker_kills(tmp_path: Path) -> None:
    """The race again, with the broker process SIGKILLed in the middle of rounds and restarted: no round has
    two winners, and the stream's events are numbered 1..n with each version written by its own round."""
    import random
    import signal

    from tests.test_transaction_crash import Broker

    rng = random.Random(int(os.environ.get("STREAM_CRASH_SEED", str(random.randrange(1 << 30)))))
    broker = Broker(tmp_path)
    broker.start()
    script = tmp_path / "racer.py"
    script.write_text(CRASH_RACER)
    racers = [subprocess.Popen([sys.executable, str(script), broker.namesrv, str(i)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True) for i in range(8)]
    kills = 0
    try:
        for r in racers:
            assert r.stdout is not None and r.stdout.readline().strip() == "ready"
        current = 0
        for rnd in range(RACE_ROUNDS):
            kill_now = rnd in (5, 17) or rng.random() < 0.15
            for r in racers:
                assert r.stdin is not None
                r.stdin.write(f"{current}\n")
                r.stdin.flush()
            if kill_now:
                time.sleep(rng.uniform(0, 0.01))
                assert broker.proc is not None
                broker.proc.send_signal(signal.SIGKILL)
                broker.proc.wait(30)
                kills += 1
            answers = [r.stdout.readline().split() for r in racers if r.stdout is not None]
            assert sum(a[0] == "won" for a in answers) <= 1, answers
            if kill_now:
                broker.start()
            # the stream's version now: from a conflict answer, or by asking with an impossible expectation
            with Producer(broker.namesrv, "probe") as p:
                try:
                    p.send(Message("race", b"probe"), stream="contested", expected_version=10**9)
                except ConcurrencyError as e:
                    assert e.current_version is not None
                    current = e.current_version
    finally:
        for r in racers:
            if r.stdin is not None:
                r.stdin.close()
            r.wait(30)
    broker.stop()
    with MessageStore.open(tmp_path / "store", mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=2000,
                           max_hash_slot_num=512, max_index_num=2048) as store:
        events = [m for m in store.query_message("race", "contested", 100_000, batch_limit=100_000).messages
                  if m.properties.get("STREAM_ID") == "contested"]
    print(f"{kills} kills in {RACE_ROUNDS} rounds, stream at version {current}")
    assert kills >= 2
    versions = sorted(int(m.properties["STREAM_VERSION"]) for m in events)
    assert versions == list(range(1, current + 1)), (kills, versions)
    for m in events:  # the event numbered v was written in the round that expected v - 1
        assert int(bytes(m.body).decode().split(":")[1]) == int(m.properties["STREAM_VERSION"]) - 1


def test_half_messages_of_one_group_chain_on_a_stream(tmp_path: Path) -> None:
    """Half messages tagged with one STREAM_TX_GROUP (one database transaction) take consecutive versions of a
    stream; others wait for the group to end; the chain survives a broker restart; reads see it after commit."""
    root = tmp_path / "store"

    def half(p: TransactionProducer, body: bytes, group: str | None, expected: int | None):
        props = {"STREAM_TX_GROUP": group} if group else None
        return p.prepare(Message("orders", body, properties=props), stream="s", expected_version=expected)

    with serve_in_thread(root, **SMALL, transaction_timeout=600_000) as rb, \
            TransactionProducer(rb.namesrv_address, "app", lambda m: TransactionState.UNKNOWN) as p:
        a = half(p, b"a", "g1", 0)
        b = half(p, b"b", "g1", 1)
        assert (a.stream_version, b.stream_version) == (1, 2)
        with pytest.raises(ConcurrencyError, match="pending transaction"):
            half(p, b"other group", "g2", None)
        with pytest.raises(ConcurrencyError, match="pending transaction"):
            p.send(Message("orders", b"plain"), stream="s")
        with pytest.raises(ConcurrencyError, match="expected 1, current 2"):
            half(p, b"stale in group", "g1", 1)
        assert rb.broker.stream_versions.pending_count() == 2
        ports = (int(rb.namesrv_address.rsplit(":", 1)[1]), int(rb.broker_address.rsplit(":", 1)[1]))
    with serve_in_thread(root, "127.0.0.1", *ports, **SMALL, transaction_timeout=600_000) as rb, \
            TransactionProducer(rb.namesrv_address, "app", lambda m: TransactionState.UNKNOWN) as p:
        assert rb.broker.stream_versions.pending_count() == 2  # rebuilt from the half queue, group included
        c = half(p, b"c", "g1", 2)
        assert c.stream_version == 3
        for sent in (a, b, c):
            p.end_transaction(sent, TransactionState.COMMIT)
        deadline = time.monotonic() + 10
        while rb.broker.stream_versions.pending_count() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stream_events(rb, "orders", "s") == [(1, b"a"), (2, b"b"), (3, b"c")]
        assert p.send(Message("orders", b"d"), stream="s", expected_version=3).stream_version == 4
        with Admin(rb.namesrv_address) as admin:
            assert [m.body for m in admin.read_stream("orders", "s", from_version=2)] == [b"b", b"c", b"d"]
            assert len(admin.query_key_all("orders", "s")) == 4


# -- multi-stream batches (the eventsourcing face's inserts) ----------------------------------------------
def test_multi_stream_batch_is_all_or_nothing(broker: RunningBroker) -> None:
    with Producer(broker.namesrv_address, "multi") as p, Admin(broker.namesrv_address) as a:
        a.create_topic("multi", 2)
        r = p.append_streams([Message("multi", b"a1"), Message("multi", b"b1"), Message("multi", b"a2"),
                              Message("multi", b"t1")], ["a", "b", "a", "trk"], {"a": 0, "b": 0, "trk": 0},
                             queue_ids=[0, 0, 0, 1])
        assert (r.queue_id, r.queue_offset, r.stream_versions) == (0, 0, {"a": 2, "b": 1, "trk": 1})
        with pytest.raises(ConcurrencyError) as e:  # c is new, but b is not at 0: nothing is stored
            p.append_streams([Message("multi", b"c1"), Message("multi", b"b?")], ["c", "b"], {"c": 0, "b": 0})
        assert (e.value.stream, e.value.expected_version, e.value.current_version) == ("b", 0, 1)
        assert a.read_stream("multi", "c") == []
        assert (a.max_offset("multi", 0), a.max_offset("multi", 1)) == (3, 1)  # queue offsets per queue
        events = a.read_stream("multi", "a")
        assert [(m.body, m.queue_offset, m.properties["STREAM_VERSION"]) for m in events] == [
            (b"a1", 0, "1"), (b"a2", 2, "2")]
        assert "BATCH_QUEUE_ID" not in a.read_stream("multi", "trk")[0].properties  # removed before storing
        assert [m.body for m in a.read_stream("multi", "a", last=1)] == [b"a2"]
        # unchecked streams (None) take the next versions
        r = p.append_streams([Message("multi", b"a3"), Message("multi", b"d1")], ["a", "d"], {"a": None})
        assert r.stream_versions == {"a": 3, "d": 1}


def test_multi_stream_batches_racing_in_opposite_orders(broker: RunningBroker) -> None:
    """Two writers append to the same two streams, listed in opposite orders: the stripe-ordered locks
    never deadlock, and each round exactly one of two conditional appends at the same versions wins."""
    import threading

    with Producer(broker.namesrv_address, "race") as p, Admin(broker.namesrv_address) as a:
        a.create_topic("race2", 1)
        wins = []
        for rnd in range(20):
            barrier = threading.Barrier(2)

            def go(order: list[str], rnd: int = rnd, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                try:
                    p.append_streams([Message("race2", b"x"), Message("race2", b"y")], order,
                                     {order[0]: rnd, order[1]: rnd})
                    wins.append(order[0])
                except ConcurrencyError:
                    pass

            ts = [threading.Thread(target=go, args=(o,)) for o in (["s", "t"], ["t", "s"])]
            for t in ts:
                t.start()
            for t in ts:
                t.join(10)
            assert len(wins) == rnd + 1
        assert len(a.read_stream("race2", "s")) == len(a.read_stream("race2", "t")) == 20


def test_multi_stream_batch_refusals(broker: RunningBroker) -> None:
    from rmq_eventstore.client import MQBrokerError

    with Producer(broker.namesrv_address, "refuse") as p, Admin(broker.namesrv_address) as a:
        a.create_topic("refuse", 1)
        with pytest.raises(MQBrokerError, match="illegal"):  # queue 3 of a one-queue topic
            p.append_streams([Message("refuse", b"x")], ["s"], queue_ids=[3])
        with pytest.raises(ValueError, match="no message"):
            p.append_streams([Message("refuse", b"x")], ["s"], {"other": 0})
        assert a.max_offset("refuse", 0) == 0
