"""Consumer-group operations (lag, reset, replay) through the CLI and Django's `manage.py eventhandlers`,
against a real broker and a real ClusterConsumer group."""

from __future__ import annotations

import datetime
import json
import time
from io import StringIO

import pytest

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.cli import main
from rmq_eventstore.client import Admin, ClusterConsumer, Message, Producer
from tests import replay_handlers

SMALL = {"mapped_file_size_commit_log": 4 << 20, "mapped_file_size_consume_queue": 200_000,
         "max_hash_slot_num": 4096, "max_index_num": 16_384}


@pytest.fixture
def broker(tmp_path):
    with serve_in_thread(tmp_path / "store", **SMALL) as rb:
        with Admin(rb.namesrv_address) as admin:
            admin.create_topic("ops-events", 4)
        yield rb


def produce(namesrv, start, n):
    with Producer(namesrv, "p") as p:
        for i in range(start, start + n):
            p.send(Message("ops-events", json.dumps({"n": i}).encode(), tags="Even" if i % 2 == 0 else "Odd"),
                   queue_id=i % 4)


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def consume_all(namesrv, group, expected):
    got = []
    with ClusterConsumer(namesrv, group, got.append, {"ops-events": "*"}, poll_timeout_ms=200):
        deadline = time.monotonic() + 20
        while len(got) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
    return got


def test_lag_reset_and_replay_through_the_cli(broker, capsys):
    ns = broker.namesrv_address
    produce(ns, 0, 40)
    assert len(consume_all(ns, "ops", 40)) == 40
    code, out, _ = cli(capsys, "group-lag", "ops", "--topic", "ops-events", "--namesrv", ns, "--json")
    assert code == 0 and json.loads(out)["lag"] == 0
    produce(ns, 40, 8)
    time.sleep(0.2)
    code, out, _ = cli(capsys, "group-lag", "ops", "--namesrv", ns, "--json")
    doc = json.loads(out)
    assert doc["lag"] == 8 and {q["queueId"]: q["lag"] for q in doc["queues"]} == {0: 2, 1: 2, 2: 2, 3: 2}
    code, out, _ = cli(capsys, "group-reset", "ops", "--topic", "ops-events", "--to-offset", "0", "--namesrv", ns)
    assert code == 0
    code, out, _ = cli(capsys, "group-lag", "ops", "--namesrv", ns, "--json")
    assert json.loads(out)["lag"] == 48
    # a live member refuses the reset; --force does it anyway
    with ClusterConsumer(ns, "ops", lambda m: time.sleep(0.01), {"ops-events": "*"}, poll_timeout_ms=200):
        code, _, err = cli(capsys, "group-reset", "ops", "--topic", "ops-events", "--to-offset", "0", "--namesrv", ns)
        assert code == 2 and "live member" in err
    # by time: everything stored from now on
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=1)
    code, _, _ = cli(capsys, "group-reset", "ops", "--topic", "ops-events", "--to-time", later.isoformat(), "--namesrv", ns)
    assert code == 0
    code, out, _ = cli(capsys, "group-lag", "ops", "--namesrv", ns, "--json")
    assert json.loads(out)["lag"] == 0
    replay_handlers.seen.clear()
    code, out, err = cli(capsys, "group-replay", "--handler", "tests.replay_handlers:collect", "--topic", "ops-events",
                         "--namesrv", ns)
    assert code == 0 and "replayed 48" in out, err
    assert sorted(n for _, n in replay_handlers.seen) == list(range(48))
    replay_handlers.seen.clear()
    code, out, err = cli(capsys, "group-replay", "--handler", "tests.replay_handlers:even", "--namesrv", ns)
    assert code == 0 and "replayed 24" in out, err  # the @event_handler's topic and tags
    assert sorted(x[1] for x in replay_handlers.seen) == list(range(0, 48, 2))
    code, _, err = cli(capsys, "group-replay", "--handler", "tests.replay_handlers:nope", "--namesrv", ns)
    assert code == 2 and "nope" in err


@pytest.mark.django_db
def test_manage_py_eventhandlers(broker, settings):
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from rmq_eventstore.django.connection import stores

    ns = broker.namesrv_address
    settings.RMQ_EVENTSTORE = {"default": {"URL": f"rmq://{ns}"}}
    try:
        produce(ns, 0, 12)
        consume_all(ns, "ops2", 12)
        produce(ns, 12, 4)
        time.sleep(0.2)
        out = StringIO()
        call_command("eventhandlers", "lag", "ops2", "--json", stdout=out)
        assert json.loads(out.getvalue())["lag"] == 4
        out = StringIO()
        call_command("eventhandlers", "reset", "ops2", "--topic", "ops-events", "--to-offset", "0", stdout=out)
        assert "reset ops2 on 4 queue(s)" in out.getvalue()
        replay_handlers.seen.clear()
        out = StringIO()
        call_command("eventhandlers", "replay", "--handler", "tests.replay_handlers:even", stdout=out)
        assert "replayed 8" in out.getvalue()
        with pytest.raises(CommandError, match="no time zone"):
            call_command("eventhandlers", "reset", "ops2", "--topic", "ops-events", "--to-time", "2026-01-01T00:00")
    finally:
        stores.close_all()
