"""Child process of the crash suite (tests/test_crash.py): puts messages under SYNC_FLUSH until killed.

Usage: `crash_child.py STORE ACKS_FILE ROUND SEED [--threads N] [--mode produce|undispatched]`.

It opens the store with small files (commitlog segments roll every few dozen messages), prints `READY`
on stdout once open, then N producer threads put single messages and small batches over several
topics and queues, each with a unique key, and append one line per acknowledged (PUT_OK) message to
ACKS_FILE: `topic qid queue_offset key commitlog_offset` (and an `UNFLUSHED ...` line if a PUT_OK came
back before the commitlog's flushed position passed the message). The parent kills it with SIGKILL at
a random instant. Message bodies and tags are a function of the key, so the parent can check them.

`--mode undispatched` (RocketMQ #467): stop the reput service first, so what follows is in the commitlog
(flushed) but in no consume queue or index when the process dies; it then kills itself.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading

from rmq_eventstore.store import Message, MessageStore, PutMessageStatus

CRASH_GEOMETRY: dict[str, object] = {
    "mapped_file_size_commit_log": 64 * 1024,
    "mapped_file_size_consume_queue": 20 * 100,
    "max_hash_slot_num": 64,
    "max_index_num": 256,
    "flush_disk_type": "SYNC_FLUSH",
    "flush_interval_consume_queue": 100,
}
TOPICS = ("CrashA", "CrashB", "CrashC")
QUEUES = 3


def body_of(key: str) -> bytes:
    """The body of message `key` (sizes 20 B .. ~3 KB, so records straddle segment ends often)."""
    n = 1 + (sum(key.encode()) * 7919) % 150
    return (key + "|").encode() * n


def tags_of(key: str) -> str:
    return "T" + str(sum(key.encode()) % 4)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("acks")
    p.add_argument("round", type=int)
    p.add_argument("seed", type=int)
    p.add_argument("--threads", type=int, default=3)
    p.add_argument("--mode", default="produce", choices=("produce", "undispatched"))
    p.add_argument("--count", type=int, default=0, help="messages per thread (0: until killed)")
    p.add_argument("--no-index", action="store_true", help="message_index_enable=False")
    args = p.parse_args()
    store = MessageStore.open(args.store, **CRASH_GEOMETRY, message_index_enable=not args.no_index)
    ack_fd = os.open(args.acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    if args.mode == "undispatched":
        store.wait_for_dispatch()
        store.reput_message_service.shutdown()

    def produce(tid: int) -> None:
        rnd = random.Random(args.seed * 1000 + tid)
        i = 0
        while args.count == 0 or i < args.count:
            topic = rnd.choice(TOPICS)
            qid = rnd.randrange(QUEUES)
            n = 1 if rnd.random() < 0.6 else rnd.randint(2, 6)
            keys = [f"r{args.round}t{tid}m{i + j}" for j in range(n)]
            msgs = [Message(topic=topic, body=body_of(k), queue_id=qid, tags=tags_of(k), keys=[k]) for k in keys]
            i += n
            r = store.put_message(msgs[0]) if n == 1 else store.put_messages(msgs)
            if r.status != PutMessageStatus.PUT_OK:
                continue
            a = r.append_result
            lines = "".join(f"{topic} {qid} {a.logics_offset + j} {k} {a.offsets[j]}\n" for j, k in enumerate(keys))
            # SYNC_FLUSH's promise, checked where a kill cannot: PUT_OK only once the bytes were forced
            flushed = store.commit_log.mapped_file_queue.flushed_where
            if flushed < a.wrote_offset + a.wrote_bytes:
                lines += f"UNFLUSHED {a.wrote_offset} {a.wrote_bytes} flushed_where={flushed}\n"
            os.write(ack_fd, lines.encode())

    threads = [threading.Thread(target=produce, args=(t,), daemon=True) for t in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if args.mode == "undispatched":
        os.kill(os.getpid(), signal.SIGKILL)
    store.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
