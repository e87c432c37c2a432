#!/usr/bin/env python3
"""CPU of the broker's single send without the network: `SendMessageProcessor.process` called in-process
on SEND_MESSAGE_V2 requests shaped as our Producer sends them (100-byte body, TAGS / KEYS / UNIQ_KEY /
WAIT properties), against a fresh store in a temporary directory.

    python benchmarks/profile_send_inprocess.py [N] [--prof]

Prints the best of three runs of N sends (default 20,000) as CPU µs per send of the whole process
(`time.process_time`: the calling thread plus the store's dispatch thread), and with `--prof` a cProfile of
one more run by own time. No socket, no event loop: what the processor, the commitlog put and the
dispatch cost, steadier on a loaded machine than `profile_broker.py single`.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import tempfile
import time

from rmq_eventstore.broker.broker import Broker
from rmq_eventstore.remoting import RemotingCommand, RequestCode
from rmq_eventstore.store import MessageStore

PROPS = "TAGS\x01t\x02KEYS\x01k1\x02UNIQ_KEY\x0100000000000000000000000000000001\x02WAIT\x01true\x02"


class _Channel:
    remote_address = "127.0.0.1:5555"


def _request() -> RemotingCommand:
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
        "a": "pg", "b": "Bench", "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": str(int(time.time() * 1000)),
        "h": "0", "i": PROPS, "j": "0", "k": "false", "l": "16"}, body=b"x" * 100)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20000
    with tempfile.TemporaryDirectory() as d, MessageStore.open(d) as store:
        broker = Broker(store)
        broker.start()
        try:
            proc = broker.processor_for(RequestCode.SEND_MESSAGE_V2)
            ch = _Channel()
            for r in [_request() for _ in range(1000)]:  # warm-up: topic and queues created
                proc.process(r, ch)
            best = float("inf")
            for _ in range(3):
                reqs = [_request() for _ in range(n)]
                t = time.process_time()
                for r in reqs:
                    proc.process(r, ch)
                best = min(best, (time.process_time() - t) / n * 1e6)
            print(f"process(): {best:.2f} us CPU per send (best of 3 x {n}, whole process incl. the dispatch thread)")
            if "--prof" in sys.argv:
                reqs = [_request() for _ in range(n)]
                prof = cProfile.Profile()
                prof.enable()
                for r in reqs:
                    proc.process(r, ch)
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(20)
        finally:
            broker.shutdown()


if __name__ == "__main__":
    main()
