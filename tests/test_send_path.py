"""The single-send path's shortcuts give what the general code gave: the store's reading of a message's WAIT
property (a string search when there is one candidate, else the full properties parse) agrees with the parse
for any properties string, duplicates, empty values and look-alike keys included."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.common import Message, codec
from rmq_eventstore.store.commitlog import _wait_store_msg_ok


def _by_parse(m: Message) -> bool:
    s = m.properties_string
    if s and "WAIT\x01" in s:
        v = codec.string_to_properties(s).get(codec.PROPERTY_WAIT_STORE_MSG_OK)
        if v is not None:
            return v.lower() == "true"
    return True


segments = st.sampled_from(["WAIT\x01true", "WAIT\x01false", "WAIT\x01", "XWAIT\x01true", "WAIT\x01TRUE",
                            "WAIT\x01tr\x01ue", "TAGS\x01a", "", "\x01WAIT", "KEYS\x01WAIT\x01true"]) | st.text(
    alphabet="WAIT\x01\x02truefls", max_size=12)


@settings(max_examples=500)
@given(st.lists(segments, max_size=6), st.booleans())
def test_wait_property_is_read_as_the_parse_reads_it(segs: list[str], trailing: bool) -> None:
    s = "\x02".join(segs) + ("\x02" if trailing else "")
    m = Message("T", b"x", properties_string=s)
    assert _wait_store_msg_ok(m) == _by_parse(m), repr(s)
