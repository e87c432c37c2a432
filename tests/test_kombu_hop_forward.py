"""A Celery eta farther than the broker's timer maximum is chained through hops: a worker pops a hop and sends
the next one on (`Channel._forward_hops`). A send that timed out may still have been stored; the hop then comes
back and is forwarded again. The next hop is keyed by the hop it came from (`_hop_key`), and a hop that came
back is sent on only when the broker's index holds no such key: the task arrives once, not twice."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection, Producer, Queue

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.cli.app import main as cli_main
from rmq_eventstore.client.remoting_client import RemotingTimeoutError
from rmq_eventstore.kombu import transport as transport_mod
from rmq_eventstore.kombu.names import system_topic, topic_name
from rmq_eventstore.kombu.transport import Channel

ACL = """\
accounts:
  - accessKey: opsKey
    secretKey: opsSecret1
    admin: true
  - accessKey: celeryKey
    secretKey: celerySecret1
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
    topicPerms: [rmq_sys_wheel_timer=DENY]
"""


def _acl_broker(tmp_path: Path) -> tuple[dict[str, Any], str]:
    """A broker under ACL whose Celery account may neither create topics nor read the timer topic: the
    queue's topics made by an operator with `rmq-eventstore topic-create` (a real admin account)."""
    (tmp_path / "plain_acl.yml").write_text(ACL)
    return {"acl_enable": True, "acl_file": str(tmp_path / "plain_acl.yml")}, "celeryKey:celerySecret1@"


def _create_topics(namesrv: str, topics: list[str]) -> None:
    for topic in topics:
        assert cli_main(["topic-create", topic, "--queues", "1", "--namesrv", namesrv,
                         "--access-key", "opsKey", "--secret-key", "opsSecret1"]) == 0


@pytest.mark.parametrize("stored, acl", [(True, False), (False, False), (False, True)],
                         ids=["stored", "lost", "lost-acl"])
def test_a_hop_whose_send_timed_out_is_sent_on_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture, stored: bool,
                                                   acl: bool) -> None:
    """The first forwarding of a hop times out: after the message was stored (`stored`: the broker answered
    too late) or before it was (`lost`: never sent). Either way the task reaches the consumer once, after its
    eta less the lead, and the hop came back to be looked up. An account the ACL does not let read the timer
    topic cannot look it up: the hop is sent on again (at least once) rather than held back for ever."""
    monkeypatch.setattr(transport_mod, "HOP_RETRY", 0.5)
    send = Channel._send
    faults: list[str] = []

    def flaky(self: Channel, topic: str, body: bytes, props: dict[str, str], lane: int,
              due_at: float | None, keys: str | None = None) -> bool:
        if threading.current_thread().name.startswith("kombu-rocketmq-hops") and not faults:
            faults.append(keys or "")
            if stored:
                send(self, topic, body, props, lane, due_at, keys)
            raise RemotingTimeoutError("simulated: no answer in time")
        return send(self, topic, body, props, lane, due_at, keys)

    monkeypatch.setattr(Channel, "_send", flaky)
    caplog.set_level(logging.INFO, logger="rmq_eventstore.kombu.transport")
    acl_kw, user = _acl_broker(tmp_path) if acl else ({}, "")
    with serve_in_thread(tmp_path / "s", announce=False, **acl_kw) as running, \
            Connection(f"rocketmq://{user}{running.namesrv_address}//",
                       transport_options={"eta_max_delay": 2, "eta_lead": 0.5}) as conn:
        if acl:
            _create_topics(running.namesrv_address, [system_topic("bindings"), system_topic("bindings_snapshot"),
                                                     topic_name("hops")])
        queue = Queue("hops", routing_key="hops")
        eta = time.time() + 6
        Producer(conn).publish({"n": 1}, routing_key="hops", declare=[queue],
                               headers={"eta": datetime.fromtimestamp(eta, UTC).isoformat()})
        got: list[tuple[float, Any]] = []
        with conn.SimpleQueue(queue) as q:
            while time.time() < eta + 3:
                try:
                    m = q.get(timeout=0.5)
                except q.Empty:
                    continue
                got.append((time.time(), m.payload))
                m.ack()
    assert faults and faults[0].startswith("kombu-hop-")
    assert [p for _, p in got] == [{"n": 1}], got
    assert got[0][0] >= eta - 0.5 - 1.0  # no earlier than its lead and a timer tick
    looked_up = [r for r in caplog.records if "was sent before" in r.getMessage()]
    assert len(looked_up) == (1 if stored else 0)
    refused = [r for r in caplog.records if "could not look up hop" in r.getMessage()]
    assert len(refused) == (1 if acl else 0)


def test_an_account_that_may_not_create_topics_uses_the_ones_made_for_it(tmp_path: Path) -> None:
    """Under ACL a Celery account need not be an admin: a queue whose topic an operator made works; one whose
    topic is missing (a broker that does not create topics on first use) fails with the command that makes
    it."""
    acl_kw, user = _acl_broker(tmp_path)
    with serve_in_thread(tmp_path / "s", announce=False, auto_create_topic_enable=False, **acl_kw) as running:
        url = f"rocketmq://{user}{running.namesrv_address}//"
        with Connection(url) as conn, pytest.raises(Exception) as e:
            conn.SimpleQueue("made").put({"n": 1})
        assert f"rmq-eventstore topic-create {system_topic('bindings')} --queues 1" in str(e.value)
        _create_topics(running.namesrv_address, [system_topic("bindings"), system_topic("bindings_snapshot"),
                                                 topic_name("made")])
        with Connection(url) as conn:
            with conn.SimpleQueue("made") as q:
                q.put({"n": 1})
                m = q.get(timeout=10)
                assert m.payload == {"n": 1}
                m.ack()
            with pytest.raises(Exception) as e:
                conn.SimpleQueue("missing").put({"n": 2})
            assert f"rmq-eventstore topic-create {topic_name('missing')} --queues 1" in str(e.value)
