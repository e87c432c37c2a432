"""`rng`: the package's own random number generator, apart from the `random` module's global one.

An application that seeds the global generator (tests, simulations: `random.seed(0)`) does not make our
queue choices, name-server order or message-id salts repeat from run to run, and our threads never move the
global state under the application (Hypothesis, for one, reports a draw during which it moved). Seeded from
the OS at import and again in a forked child, as the global generator is.
"""

from __future__ import annotations

import os
import random

rng = random.Random()
os.register_at_fork(after_in_child=rng.seed)

__all__ = ["rng"]
