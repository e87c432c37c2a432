#!/usr/bin/env python3
"""The broker's POP + BATCH_ACK processing in ONE process, without sockets: CPU of the calling thread
(`time.thread_time`) per pop+ack pair and per message, for the batch sizes given. What a per-message or
per-request change in the processors (processor/pop.py, pop_service.py, pop_buffer.py) saves, without the
kernel's loopback writes and the framing that profile_broker.py's numbers include, and with far less noise
on a loaded machine. The client side of the same pair without sockets: the ack body is built by our
`PopConsumer._ack_requests` from the messages that `PopConsumer.pop` makes of the response.

    python benchmarks/profile_pop_inproc.py [32 1 ...] [--n N] [--queues Q] [--cprofile]

With --cprofile, `PROFILE_SORT` (a pstats key, default tottime) and `PROFILE_TOP` (default 25) choose the listing.

A profiling tool, not a benchmark: nothing here is compared with a peer.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rmq_eventstore.broker import Broker  # noqa: E402
from rmq_eventstore.broker.processor.pop import AckMessageProcessor, PopMessageProcessor  # noqa: E402
from rmq_eventstore.client.pop_consumer import PopConsumer  # noqa: E402
from rmq_eventstore.common import Message  # noqa: E402
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode  # noqa: E402
from rmq_eventstore.store import MessageStore  # noqa: E402


class _Route:
    def __init__(self, name: str) -> None:
        self.broker_addrs = {name: "127.0.0.1:0"}


class _Base:
    """The client's connection layer replaced by a call into the processors (no socket, no framing)."""

    timeout = 3.0

    def __init__(self, broker: Broker) -> None:
        self.pop = PopMessageProcessor(broker)
        self.acker = AckMessageProcessor(broker)
        self.name = broker.config.broker_name

    def broker_for(self, topic: str) -> str:
        return "127.0.0.1:0"

    def route(self, topic: str) -> _Route:
        return _Route(self.name)

    def invoke(self, addr: str, cmd: RemotingCommand, timeout: float = 3.0, ok: tuple = ()) -> RemotingCommand:
        p = self.pop if cmd.code == RequestCode.POP_MESSAGE else self.acker
        r = p.process(cmd, None)
        if r.code not in (ok or (ResponseCode.SUCCESS,)):
            raise RuntimeError(f"{r.code} {r.remark}")
        return r


def run(batch: int, n: int, queues: int, prof: cProfile.Profile | None) -> tuple[float, float]:
    tmp = tempfile.mkdtemp(prefix="pop-inproc-")
    try:
        with MessageStore.open(Path(tmp) / "s", max_transfer_count_on_message_in_memory=1024) as store:
            b = Broker(store)
            b.start()
            try:
                b.topic_manager.ensure("PopI", queues)
                for i in range(0, n, 100):
                    store.put_messages([Message("PopI", b"x" * 200, tags="t", queue_id=0)] * min(100, n - i))
                deadline = time.monotonic() + 10
                while store.get_max_offset_in_queue("PopI", 0) < n and time.monotonic() < deadline:
                    time.sleep(0.01)
                c = PopConsumer.__new__(PopConsumer)
                c.group, c._base = "inproc", _Base(b)
                # timed: the broker's share and the client's share of each pair, on this thread
                broker_t = client_t = 0.0
                got = 0
                if prof is not None:
                    prof.enable()
                while got < n:
                    cmd = RemotingCommand.request(RequestCode.POP_MESSAGE, {
                        "consumerGroup": "inproc", "topic": "PopI", "queueId": -1, "maxMsgNums": batch,
                        "invisibleTime": 60_000, "pollTime": 0, "bornTime": 0, "initMode": 1, "expType": "TAG",
                        "exp": "*", "order": False})
                    t0 = time.thread_time()
                    r = c._base.pop.process(cmd, None)
                    t1 = time.thread_time()
                    c._base.invoke = lambda *a, r=r, **k: r
                    msgs = c.pop("PopI", max_nums=batch)
                    ack = c._ack_requests(msgs)["127.0.0.1:0"]
                    t2 = time.thread_time()
                    assert c._base.acker.process(ack, None).code == ResponseCode.SUCCESS
                    t3 = time.thread_time()
                    broker_t += (t1 - t0) + (t3 - t2)
                    client_t += t2 - t1
                    got += len(msgs)
                if prof is not None:
                    prof.disable()
            finally:
                b.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return broker_t / n * 1e6, client_t / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("batches", nargs="*", type=int, default=[32, 1])
    ap.add_argument("--n", type=int, default=8000)
    ap.add_argument("--queues", type=int, default=4, help="read queues of the topic (messages in queue 0)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cprofile", action="store_true")
    args = ap.parse_args()
    with open("/proc/loadavg") as f:
        print("load average:", " ".join(f.read().split()[:3]))
    for batch in args.batches:
        prof = cProfile.Profile(time.thread_time) if args.cprofile else None  # CPU, not wall: load-proof
        rows = sorted(run(batch, args.n, args.queues, prof) for _ in range(args.rounds))
        best_b = min(r[0] for r in rows)
        best_c = min(r[1] for r in rows)
        print(f"batch {batch:3d}: broker {best_b:6.2f} us/msg ({best_b * batch:6.1f} us per pop+ack)   client "
              f"pop()+_ack_requests {best_c:6.2f} us/msg   (best of {args.rounds}, thread CPU, no sockets)")
        if prof is not None:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(__import__("os").environ.get("PROFILE_SORT", "tottime")).print_stats(int(__import__("os").environ.get("PROFILE_TOP", "25")))
            print("\n".join(ln for ln in s.getvalue().splitlines() if ln.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
