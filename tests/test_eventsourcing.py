"""The `eventsourcing` library's own reusable test cases against `rmq_eventstore.eventsourcing`, twice:
embedded (the broker on a thread of this process, `ROCKETMQ_EMBEDDED`) and through a broker process that
owns a shared local store (`file://`, found through its `broker.json`). Plus what is ours: topic names,
environment keys, errors, multi-aggregate atomicity, a subscription woken without polling, tracking
atomicity, and two processes writing one application."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from typing import Any, ClassVar
from unittest import TestCase, mock

import pytest

pytest.importorskip("eventsourcing")

from eventsourcing.application import Application  # noqa: E402
from eventsourcing.domain import Aggregate, event  # noqa: E402
from eventsourcing.persistence import (  # noqa: E402
    InfrastructureFactory,
    IntegrityError,
    OperationalError,
    ProgrammingError,
    StoredEvent,
    Tracking,
)
from eventsourcing.tests.application import ExampleApplicationTestCase  # noqa: E402
from eventsourcing.tests.persistence import (  # noqa: E402
    AggregateRecorderTestCase,
    ApplicationRecorderTestCase,
    InfrastructureFactoryTestCase,
    NonInterleavingNotificationIDsBaseCase,
    ProcessRecorderTestCase,
    TrackingRecorderTestCase,
)
from eventsourcing.utils import Environment, clear_topic_cache, get_topic  # noqa: E402

from rmq_eventstore.client import ensure_local_broker, stop_local_broker  # noqa: E402
from rmq_eventstore.eventsourcing import (  # noqa: E402
    _EMBEDDED,
    RocketMQAggregateRecorder,
    RocketMQApplicationRecorder,
    RocketMQFactory,
    RocketMQProcessRecorder,
    RocketMQTrackingRecorder,
    application_name_of,
    topic_for,
)

SMALL = {"mapped_file_size_commit_log": 4 << 20, "mapped_file_size_consume_queue": 200_000,
         "max_hash_slot_num": 4096, "max_index_num": 16384}
MODULE = "rmq_eventstore.eventsourcing"
_DIRS: dict[str, str] = {}


def setUpModule() -> None:  # noqa: N802 (unittest's name)
    root = tempfile.mkdtemp(prefix="es-test-")
    _DIRS["root"] = root
    _DIRS["embedded"] = os.path.join(root, "embedded")
    _DIRS["process"] = os.path.join(root, "process")
    # one embedded broker for the module (factories share it: the registry counts them)
    _EMBEDDED.acquire(_DIRS["embedded"], dict(SMALL))
    # one broker process owning the shared store, found by every factory through <store>/broker.json
    ensure_local_broker(_DIRS["process"], broker_options=dict(SMALL), idle_exit=None, timeout=60)


def tearDownModule() -> None:  # noqa: N802
    try:
        _EMBEDDED.release(_DIRS["embedded"])
    finally:
        try:
            stop_local_broker(_DIRS["process"])
        finally:
            shutil.rmtree(_DIRS["root"], ignore_errors=True)


def env_for(mode: str, name: str = "", **extra: str) -> dict[str, str]:
    env = {"PERSISTENCE_MODULE": MODULE, "ROCKETMQ_URL": "file://" + _DIRS[mode],
           "ROCKETMQ_BROKER_OPTIONS": json.dumps(SMALL)}
    if mode == "embedded":
        env["ROCKETMQ_EMBEDDED"] = "y"
    env.update(extra)
    return env


class _Recorders:
    """Every recorder on a factory of its own, for an application of its own (a fresh topic: ids from 1)."""

    mode: ClassVar[str] = "embedded"
    purpose: ClassVar[str] = "application"

    def factory(self) -> RocketMQFactory:
        f = RocketMQFactory(Environment(f"App{uuid.uuid4().hex[:12]}", env_for(self.mode)))
        self.addCleanup(f.close)  # type: ignore[attr-defined]
        return f

    def create_recorder(self) -> Any:
        f = self.factory()
        if self.purpose == "aggregate":
            return f.aggregate_recorder("snapshots")
        if self.purpose == "tracking":
            return f.tracking_recorder()
        if self.purpose == "process":
            return f.process_recorder()
        return f.application_recorder()


class TestAggregateRecorderEmbedded(_Recorders, AggregateRecorderTestCase):
    purpose = "aggregate"


class TestApplicationRecorderEmbedded(_Recorders, ApplicationRecorderTestCase[RocketMQApplicationRecorder]):
    test_insert_subscribe = ApplicationRecorderTestCase.optional_test_insert_subscribe


class TestTrackingRecorderEmbedded(_Recorders, TrackingRecorderTestCase):
    purpose = "tracking"


class TestProcessRecorderEmbedded(_Recorders, ProcessRecorderTestCase):
    purpose = "process"


class TestNonInterleavingEmbedded(_Recorders, NonInterleavingNotificationIDsBaseCase):
    insert_num = 1000


class TestAggregateRecorderProcess(TestAggregateRecorderEmbedded):
    mode = "process"


class TestApplicationRecorderProcess(TestApplicationRecorderEmbedded):
    mode = "process"


class TestTrackingRecorderProcess(TestTrackingRecorderEmbedded):
    mode = "process"


class TestProcessRecorderProcess(TestProcessRecorderEmbedded):
    mode = "process"


class TestNonInterleavingProcess(TestNonInterleavingEmbedded):
    mode = "process"


class _Subclass(RocketMQTrackingRecorder):
    pass


class TestFactoryEmbedded(InfrastructureFactoryTestCase[RocketMQFactory]):
    mode = "embedded"

    def setUp(self) -> None:
        self.env = Environment("TestCase", env_for(self.mode))
        super().setUp()

    def expected_factory_class(self) -> type[RocketMQFactory]:
        return RocketMQFactory

    def expected_aggregate_recorder_class(self) -> type[RocketMQAggregateRecorder]:
        return RocketMQAggregateRecorder

    def expected_application_recorder_class(self) -> type[RocketMQApplicationRecorder]:
        return RocketMQApplicationRecorder

    def expected_tracking_recorder_class(self) -> type[RocketMQTrackingRecorder]:
        return RocketMQTrackingRecorder

    def tracking_recorder_subclass(self) -> type[RocketMQTrackingRecorder]:
        return _Subclass

    def expected_process_recorder_class(self) -> type[RocketMQProcessRecorder]:
        return RocketMQProcessRecorder


class TestFactoryProcess(TestFactoryEmbedded):
    mode = "process"


class _Example(ExampleApplicationTestCase):
    mode: ClassVar[str] = "embedded"
    expected_factory_topic = get_topic(RocketMQFactory)

    def setUp(self) -> None:
        clear_topic_cache()
        self._saved = dict(os.environ)
        # one store per mode, one BankAccounts per store: a topic of its own per test class
        os.environ.update(env_for(self.mode, BANKACCOUNTS_ROCKETMQ_TOPIC=f"ES_Bank_{uuid.uuid4().hex[:10]}"))
        factories: list[RocketMQFactory] = []
        init = RocketMQFactory.__init__

        def tracked(f: RocketMQFactory, *a: Any, **kw: Any) -> None:
            init(f, *a, **kw)
            factories.append(f)

        patcher = mock.patch.object(RocketMQFactory, "__init__", tracked)
        patcher.start()
        self.addCleanup(patcher.stop)
        self.addCleanup(lambda: [f.close() for f in factories])

    def tearDown(self) -> None:
        os.environ.clear()
        os.environ.update(self._saved)
        clear_topic_cache()


class TestExampleApplicationEmbedded(_Example):
    mode = "embedded"


class TestExampleApplicationProcess(_Example):
    mode = "process"


# -- ours -----------------------------------------------------------------------------------------------------
class TestNames(TestCase):
    def test_topic_names_are_legal_and_reversible(self) -> None:
        for name in ["BankAccounts", "bank_accounts", "bank-accounts", "Bank Accounts", "Zoë", "a--b", "", "x.y:z"]:
            for purpose in ("events", "snapshots"):
                topic = topic_for(name, purpose)
                self.assertRegex(topic, r"^[A-Za-z0-9_-]+$")
                self.assertEqual(application_name_of(topic), (name, purpose))
        self.assertEqual(topic_for("BankAccounts"), "ES_BankAccounts")
        self.assertEqual(topic_for("BankAccounts", "snapshots"), "ES_BankAccounts--snapshots")
        self.assertNotEqual(topic_for("a-b"), topic_for("a_b"))
        self.assertNotEqual(topic_for("a", "snapshots"), topic_for("a--snapshots"))
        with self.assertRaises(ProgrammingError):
            topic_for("x" * 200)


class TestEnvironment(TestCase):
    def test_module_is_selected_and_prefixed_keys_win(self) -> None:
        env = {"PERSISTENCE_MODULE": MODULE, "ROCKETMQ_URL": "rmq://127.0.0.1:1",
               "MYAPP_ROCKETMQ_URL": "file://" + _DIRS["process"], "MYAPP_ROCKETMQ_TOPIC": "ES_custom_topic"}
        f = InfrastructureFactory.construct(Environment("MyApp", env))
        try:
            self.assertIsInstance(f, RocketMQFactory)
            self.assertEqual(f.application_recorder().topic, "ES_custom_topic")
            self.assertEqual(f.aggregate_recorder("snapshots").topic, "ES_custom_topic--snapshots")
        finally:
            f.close()

    def test_missing_url_and_unreachable_broker(self) -> None:
        with self.assertRaises(OSError) as cm:
            RocketMQFactory(Environment("Nope", {}))
        self.assertIn("NOPE_ROCKETMQ_URL", str(cm.exception))
        with self.assertRaises(OperationalError):
            RocketMQFactory(Environment("Nope", {"ROCKETMQ_URL": "rmq://127.0.0.1:1"})).application_recorder()

    def test_create_topic_off(self) -> None:
        f = RocketMQFactory(Environment(f"N{uuid.uuid4().hex[:8]}", env_for("embedded", CREATE_TOPIC="n")))
        try:
            with self.assertRaises(ProgrammingError) as cm:
                f.application_recorder()
            self.assertIn("CREATE_TOPIC", str(cm.exception))
        finally:
            f.close()

    def test_embedded_broker_is_started_and_stopped(self) -> None:
        path = os.path.join(_DIRS["root"], "own")
        f = RocketMQFactory(Environment("Own", {"ROCKETMQ_URL": "file://" + path, "ROCKETMQ_EMBEDDED": "y",
                                                "ROCKETMQ_BROKER_OPTIONS": json.dumps(SMALL)}))
        r = f.application_recorder()
        self.assertEqual(r.insert_events([StoredEvent(uuid.uuid4(), 1, "t", b"x")]), [1])
        self.assertTrue(os.path.exists(os.path.join(path, "broker.json")))
        f.close()
        self.assertFalse(os.path.exists(os.path.join(path, "broker.json")))


class _Ours(_Recorders):
    def test_multi_aggregate_insert_is_all_or_nothing(self) -> None:
        r = self.create_recorder()
        a, b = uuid.uuid4(), uuid.uuid4()
        self.assertEqual(r.insert_events([StoredEvent(a, 1, "A", b"a1")]), [1])
        with self.assertRaises(IntegrityError):  # b is new, a's version 1 is taken: nothing of b is stored
            r.insert_events([StoredEvent(b, 1, "B", b"b1"), StoredEvent(a, 1, "A", b"a1 again")])
        self.assertEqual(r.select_events(b), [])
        self.assertEqual(r.max_notification_id(), 1)
        ids = r.insert_events([StoredEvent(b, 1, "B", b"b1"), StoredEvent(a, 2, "A", b"a2"),
                               StoredEvent(b, 2, "B", b"b2")])
        self.assertEqual(ids, [2, 3, 4])
        self.assertEqual([(n.id, n.originator_id, n.originator_version) for n in r.select_notifications(2, 10)],
                         [(2, b, 1), (3, a, 2), (4, b, 2)])

    def test_another_writer_is_detected_without_a_shared_cache(self) -> None:
        f1, name = self.factory(), None
        name = f1.env.name
        f2 = RocketMQFactory(Environment(name, env_for(self.mode)))
        self.addCleanup(f2.close)
        r1, r2 = f1.application_recorder(), f2.application_recorder()
        a = uuid.uuid4()
        r1.insert_events([StoredEvent(a, 1, "A", b"1")])
        self.assertEqual(len(r2.select_events(a)), 1)
        r1.insert_events([StoredEvent(a, 2, "A", b"2 by r1")])
        with self.assertRaises(IntegrityError):  # r2 saw version 1 only: the broker's check catches it
            r2.insert_events([StoredEvent(a, 2, "A", b"2 by r2")])
        r2.insert_events([StoredEvent(a, 3, "A", b"3 by r2")])
        self.assertEqual([e.state for e in r1.select_events(a)], [b"1", b"2 by r1", b"3 by r2"])

    def test_process_recorder_tracking_is_atomic_with_events(self) -> None:
        r = self.create_recorder() if self.purpose == "process" else self.factory().process_recorder()
        a, b = uuid.uuid4(), uuid.uuid4()
        r.insert_events([StoredEvent(a, 1, "A", b"")], tracking=Tracking("up", 5))
        with self.assertRaises(IntegrityError):  # the tracking record is stale: the new events are not stored
            r.insert_events([StoredEvent(b, 1, "B", b"")], tracking=Tracking("up", 5))
        self.assertEqual(r.select_events(b), [])
        with self.assertRaises(IntegrityError):  # an event conflicts: the tracking record is not stored
            r.insert_events([StoredEvent(a, 1, "A", b"")], tracking=Tracking("up", 6))
        self.assertEqual(r.max_tracking_id("up"), 5)
        self.assertEqual(r.insert_events([], tracking=Tracking("up", 6)), [])
        self.assertEqual(r.max_notification_id(), 1)  # tracking records take no notification id

    def test_subscription_is_woken_by_long_polling(self) -> None:
        r = self.create_recorder()
        got: list[tuple[int, float]] = []
        with r.subscribe(gt=None) as sub:
            def consume() -> None:
                for n in sub:
                    got.append((n.id, time.monotonic()))
                    if len(got) == 3:
                        return
            t = threading.Thread(target=consume)
            t.start()
            latencies = []
            for i in range(3):
                time.sleep(0.3)  # the subscriber is parked in a held pull by now
                sent = time.monotonic()
                r.insert_events([StoredEvent(uuid.uuid4(), 1, "T", str(i).encode())])
                deadline = time.monotonic() + 5
                while len(got) <= i and time.monotonic() < deadline:
                    time.sleep(0.005)
                latencies.append(got[i][1] - sent)
            t.join(5)
        self.assertEqual([g[0] for g in got], [1, 2, 3])
        self.assertLess(max(latencies), 0.5, latencies)  # the held pull answered, not a 1 s re-poll

    def test_two_processes_write_one_application(self) -> None:
        name = f"Shared{uuid.uuid4().hex[:8]}"
        child = textwrap.dedent(f"""
            import json, sys, uuid
            from eventsourcing.persistence import StoredEvent
            from eventsourcing.utils import Environment
            from rmq_eventstore.eventsourcing import RocketMQFactory
            env = json.loads(sys.argv[1])
            f = RocketMQFactory(Environment({name!r}, env))
            r = f.application_recorder()
            ids = []
            for i in range(20):
                oid = uuid.uuid4()
                ids += r.insert_events([StoredEvent(oid, v, "T", b"x") for v in range(1, 6)])
            print(json.dumps(ids))
            f.close()
        """)
        env = env_for("process")
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        penv = {**os.environ, "PYTHONPATH": root}
        procs = [subprocess.Popen([sys.executable, "-c", child, json.dumps(env)], stdout=subprocess.PIPE,
                                  env=penv, text=True) for _ in range(2)]
        outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
        all_ids = sorted(outs[0] + outs[1])
        self.assertEqual(all_ids, list(range(1, 201)))  # contiguous across processes
        for ids in outs:  # each insert of 5 got 5 consecutive ids
            for k in range(0, len(ids), 5):
                self.assertEqual(ids[k:k + 5], list(range(ids[k], ids[k] + 5)))


class TestOursEmbedded(_Ours, TestCase):
    pass


class TestOursProcess(_Ours, TestCase):
    mode = "process"


class _App(Application):
    pass


class Counter(Aggregate):
    def __init__(self) -> None:
        self.n = 0

    @event("Incremented")
    def inc(self) -> None:
        self.n += 1


class TestApplicationSave(TestCase):
    def test_save_of_several_aggregates_is_one_atomic_batch(self) -> None:
        app = _App(env=env_for("embedded", _APP_ROCKETMQ_TOPIC=f"ES_save_{uuid.uuid4().hex[:8]}"))
        try:
            c1, c2 = Counter(), Counter()
            recs = app.save(c1, c2)
            self.assertEqual([r.notification.id for r in recs], [1, 2])
            stale = app.repository.get(c1.id)
            c1.inc()
            app.save(c1)
            stale.inc()
            c2.inc()
            with self.assertRaises(IntegrityError):
                app.save(c2, stale)
            self.assertEqual(app.repository.get(c2.id).n, 0)  # c2's event went with the failed batch
            self.assertEqual(app.recorder.max_notification_id(), 3)
        finally:
            app.close()


del AggregateRecorderTestCase, ApplicationRecorderTestCase, TrackingRecorderTestCase, ProcessRecorderTestCase
del NonInterleavingNotificationIDsBaseCase, InfrastructureFactoryTestCase, ExampleApplicationTestCase


def test_example_shop_runs_twice_on_one_store(tmp_path: Any) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(root, "examples", "eventsourcing_shop.py")
    outs = [subprocess.run([sys.executable, script, "--store", str(tmp_path / "store")], capture_output=True,
                           text=True, timeout=120, check=True).stdout for _ in range(2)]
    assert "notifications: 5; the projection reached 5" in outs[0]
    assert "orders placed 6, paid 4, revenue 105.00" in outs[1]  # the second run rebuilt the view from #1
