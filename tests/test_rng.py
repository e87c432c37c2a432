"""The package draws from its own generator (`rmq_eventstore.common.rng`), never the `random` module's
global one: an application that seeds the global generator does not make our message-id salts repeat,
our draws leave its state alone, and a forked child draws differently from its parent."""

from __future__ import annotations

import os
import random

from rmq_eventstore.common.message_id import UniqueIdGenerator
from rmq_eventstore.common.rng import rng


def test_seeding_the_global_generator_does_not_repeat_message_id_salts() -> None:
    salts = []
    for _ in range(3):
        random.seed(1234)
        salts.append(UniqueIdGenerator(ip=b"\x7f\x00\x00\x01", pid=1)._prefix)
    assert len(set(salts)) == 3  # each process-wide prefix is its own (2^-32 odds of a false failure)


def test_our_draws_leave_the_global_state_alone() -> None:
    state = random.getstate()
    UniqueIdGenerator().create()
    rng.random()
    assert random.getstate() == state


def test_a_forked_child_draws_differently_from_its_parent() -> None:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first draw after the fork, then out without running the parent's teardown
        try:
            os.write(w, repr(rng.getrandbits(64)).encode())
        finally:
            os._exit(0)
    os.close(w)
    child = int(os.read(r, 64))
    os.close(r)
    os.waitpid(pid, 0)
    assert child != rng.getrandbits(64)
