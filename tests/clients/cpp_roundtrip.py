"""Drive the Apache RocketMQ C++ client (PyPI wheel ``rocketmq==0.4.4``, ctypes) against a broker.

Run by ``tests/test_client_cpp.py`` in a subprocess, because the C++ library starts its own threads,
logs under ``$HOME/logs/rocketmq-cpp`` and may hang or crash while shutting down. Prints one JSON
object per line on stdout (``sent`` / ``received`` / ``error`` / ``done`` / ``timeout``) and exits
with 0 on success, 1 on an error and 2 on a timeout::

    python cpp_roundtrip.py produce --namesrv 127.0.0.1:9876 --topic T --group G --spec '[{...}]'
    python cpp_roundtrip.py consume --namesrv 127.0.0.1:9876 --topic T --group G --expect 3 [--sub 'A || B']
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time


def emit(obj: dict) -> None:
    """Write one JSON line and flush (the parent reads it even if we are killed afterwards)."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _text(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _bounded(fn, seconds: float, what: str) -> None:
    """Run ``fn`` in a daemon thread and give up after ``seconds`` (C++ shutdown can hang)."""
    t = threading.Thread(target=fn, name=what, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        emit({"event": "warning", "message": f"{what} did not return within {seconds}s"})


def produce(args: argparse.Namespace) -> int:
    from rocketmq.client import Message, Producer

    specs = json.loads(args.spec)
    producer = Producer(args.group, timeout=3000)
    producer.set_namesrv_addr(args.namesrv)
    producer.start()
    try:
        for spec in specs:
            msg = Message(args.topic)
            if spec.get("tags"):
                msg.set_tags(spec["tags"])
            if spec.get("keys"):
                msg.set_keys(" ".join(spec["keys"]))
            for k, v in spec.get("properties", {}).items():
                msg.set_property(k, v)
            body = spec["body"] * spec.get("bodyRepeat", 1)
            msg.set_body(body)
            result = producer.send_sync(msg)
            emit({"event": "sent", "status": result.status.name, "msgId": result.msg_id,
                  "queueOffset": result.offset, "tags": spec.get("tags"), "keys": spec.get("keys", []),
                  "bodyLength": len(body.encode())})
    finally:
        _bounded(producer.shutdown, 5.0, "producer shutdown")
    emit({"event": "done", "sent": len(specs)})
    return 0


def consume(args: argparse.Namespace) -> int:
    from rocketmq.client import PushConsumer

    received: list[dict] = []
    lock = threading.Lock()
    enough = threading.Event()

    def on_message(msg) -> None:
        record = {
            "event": "received",
            "topic": msg.topic,
            "tags": _text(msg.tags),
            "keys": (_text(msg.keys) or "").split(),
            "body": msg.body.decode("utf-8", "replace"),
            "bodyLength": len(msg.body),
            "msgId": msg.id,
            "queueId": msg.queue_id,
            "queueOffset": msg.queue_offset,
            "commitLogOffset": msg.commit_log_offset,
            "reconsumeTimes": msg.reconsume_times,
            "storeSize": msg.store_size,
            "uniqKey": _text(msg.get_property("UNIQ_KEY")),
        }
        with lock:
            received.append(record)
            emit(record)
            if len(received) >= args.expect:
                enough.set()

    consumer = PushConsumer(args.group)
    consumer.set_namesrv_addr(args.namesrv)
    consumer.set_thread_count(1)
    consumer.subscribe(args.topic, on_message, args.sub)
    consumer.start()
    emit({"event": "ready"})
    ok = enough.wait(args.timeout)
    if not ok:
        emit({"event": "timeout", "what": f"consume {args.expect} messages", "received": len(received)})
    else:
        # Give the client one offset-persist round (UPDATE_CONSUMER_OFFSET) before leaving.
        time.sleep(0.5)
    _bounded(consumer.shutdown, 8.0, "consumer shutdown")
    emit({"event": "done", "received": len(received)})
    return 0 if ok else 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["produce", "consume"])
    parser.add_argument("--namesrv", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--spec", default="[]", help="produce: JSON list of {tags, keys, body, bodyRepeat}")
    parser.add_argument("--expect", type=int, default=0, help="consume: how many messages to wait for")
    parser.add_argument("--sub", default="*", help="consume: subscription expression")
    parser.add_argument("--timeout", type=float, default=30.0, help="consume: seconds to wait")
    args = parser.parse_args(argv)
    try:
        code = produce(args) if args.mode == "produce" else consume(args)
    except Exception as exc:  # report any client failure as a JSON line, then fail
        emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        code = 1
    # The C++ library's static destructors may crash or block at interpreter exit: leave now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
