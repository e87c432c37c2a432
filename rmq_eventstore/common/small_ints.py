"""Text of the small ints a send's header carries (queue ids, flags, queue counts), both ways, from tables.

`str(i)` and `int(s)` cost a call and an allocation each; a send's header has four such fields on each
side of the wire. The client (`Producer`) and the broker's send lane look them up here instead; anything
outside the table (or not in its canonical text) goes through `str()` / `int()` as before.
"""

from __future__ import annotations

INT_TEXT: dict[int, str] = {i: str(i) for i in range(-1, 1024)}  # str(i)
TEXT_INT: dict[str, int] = {t: i for i, t in INT_TEXT.items()}  # int(t) of the canonical texts only
