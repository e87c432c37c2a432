"""Broker demo: `rmq-eventstore serve` on ./var/store, a producer and a long-polling consumer.

Starts the broker as its own process (one process owns the store; everything else talks to it over
RocketMQ's remoting protocol), sends domain events from a producer thread (one of them delayed by
delay level 1 = 1 s, one batch), consumes them with a long-polling pull consumer that commits its
offsets on the broker, sends one "poison" event back for retry, then stops the broker with SIGTERM.
Run it twice: the consumer group resumes from the offsets the broker kept in consumerOffset.json.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import threading
import time

from rmq_eventstore.client import FOUND, Message, Producer, PullConsumer

TOPIC = "orders"
GROUP = "order-projector"


def start_broker(store: str, namesrv_port: int, broker_port: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rmq_eventstore", "serve", "--store", store, "--namesrv-port", str(namesrv_port),
         "--broker-port", str(broker_port), "--log-level", "WARNING"],
        stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    m = re.search(r"name server (\S+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"the broker did not start: {line!r}")
    print(f"[broker]   {line.strip()}  (pid {proc.pid})")
    return proc, m.group(1)


def produce(namesrv: str, events: int) -> None:
    with Producer(namesrv, "order-service") as producer:
        for i in range(events):
            order = f"order-{i % 7}"
            kind = ("OrderPlaced", "OrderPaid", "OrderShipped")[i % 3]
            body = json.dumps({"type": kind, "order": order, "n": i}).encode()
            r = producer.send(Message(TOPIC, body, tags=kind, keys=[order]))
            if i < 3:
                print(f"[producer] {kind} {order} -> queue {r.queue_id} offset {r.queue_offset} id {r.msg_id}")
        r = producer.send_batch([Message(TOPIC, json.dumps({"type": "OrderArchived", "order": f"order-{k}"}).encode(),
                                         tags="OrderArchived", keys=[f"order-{k}"]) for k in range(5)], queue_id=0)
        print(f"[producer] batch of 5 -> queue {r.queue_id} from offset {r.queue_offset}")
        r = producer.send(Message(TOPIC, b'{"type": "OrderReminder"}', tags="OrderReminder"), delay_level=1)
        print(f"[producer] OrderReminder with delay level 1 (1 s) at {time.strftime('%X')}")
        print(f"[producer] sent {events + 6} events")


def consume(namesrv: str, expected: int, stop: threading.Event, seen: list) -> None:
    with PullConsumer(namesrv, GROUP) as consumer:
        queues = consumer.queues(TOPIC)
        offsets = {q: max(consumer.fetch_offset(TOPIC, q), 0) for q in queues}
        print(f"[consumer] resuming {GROUP} at offsets {offsets}")
        poisoned = False
        while not stop.is_set() and len(seen) < expected:
            for q in queues:
                res = consumer.pull(TOPIC, q, offsets[q], suspend_timeout_ms=200)
                if res.status != FOUND:
                    offsets[q] = res.next_begin_offset if res.status != "NO_NEW_MSG" else offsets[q]
                    continue
                for m in res.messages:
                    event = json.loads(m.body)
                    if event["type"] == "OrderReminder":
                        print(f"[consumer] OrderReminder arrived at {time.strftime('%X')} "
                              f"({m.store_timestamp - m.born_timestamp} ms after it was sent)")
                    if not poisoned and event["type"] == "OrderShipped":
                        consumer.send_back(m, delay_level=1)  # pretend the projection failed once
                        poisoned = True
                        print(f"[consumer] could not project {event}; sent back to %RETRY%{GROUP}")
                    seen.append(event)
                offsets[q] = res.next_begin_offset
                consumer.commit_offset(TOPIC, q, offsets[q])
        print(f"[consumer] consumed {len(seen)} events; committed offsets {offsets}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--store", default="var/store")
    ap.add_argument("--events", type=int, default=300)
    ap.add_argument("--namesrv-port", type=int, default=0, help="0 = any free port (default)")
    ap.add_argument("--broker-port", type=int, default=0)
    args = ap.parse_args()
    proc, namesrv = start_broker(args.store, args.namesrv_port, args.broker_port)
    try:
        stop = threading.Event()
        seen: list = []
        t0 = time.perf_counter()
        consumer = threading.Thread(target=consume, args=(namesrv, args.events + 6, stop, seen))
        consumer.start()
        produce(namesrv, args.events)
        consumer.join(timeout=30)
        stop.set()
        consumer.join()
        print(f"[demo]     {len(seen)} events through the broker in {time.perf_counter() - t0:.2f} s")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        print(f"[broker]   stopped (exit code {proc.returncode}); store and offsets are in {args.store}")


if __name__ == "__main__":
    main()
