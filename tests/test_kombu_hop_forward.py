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
from rmq_eventstore.client.remoting_client import RemotingTimeoutError
from rmq_eventstore.kombu import transport as transport_mod
from rmq_eventstore.kombu.transport import Channel


@pytest.mark.parametrize("stored", [True, False], ids=["stored", "lost"])
def test_a_hop_whose_send_timed_out_is_sent_on_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture, stored: bool) -> None:
    """The first forwarding of a hop times out: after the message was stored (`stored`: the broker answered
    too late) or before it was (`lost`: never sent). Either way the task reaches the consumer once, after its
    eta less the lead, and the hop came back to be looked up."""
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
    with serve_in_thread(tmp_path / "s", announce=False) as running, \
            Connection(f"rocketmq://{running.namesrv_address}//",
                       transport_options={"eta_max_delay": 2, "eta_lead": 0.5}) as conn:
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
