"""What this broker serves beyond Apache RocketMQ (GET_BROKER_EXTENSIONS, our request code 4400), and the
extension requests themselves (QUERY_STREAM, 4401; with ``last`` N, a stream's newest N events only).

Clients ask before using an extension: an Apache RocketMQ broker answers REQUEST_CODE_NOT_SUPPORTED, and
since it ignores header fields it does not know, a client that skipped the question would have its
expected-version append stored unchecked. The answer is a JSON object of feature names.

GET_BROKER_STATS_HISTORY (4402) answers the samples of `BrokerStatsService` (every few seconds, the last
hour): ``{"intervalMillis": 5000, "samples": [{"t", "msgPutTotal", "commitLogMaxOffset",
"dispatchBehindBytes", "groupLag": {group: messages}}, ...]}``, oldest first; ``since`` (ms) keeps the
samples taken after it.

QUERY_TRANSACTION_ENDS (4403): the body ``{"ids": [transaction id, ...]}`` (at most 10,000) is answered
``{"ends": {id: "COMMIT" | "ROLLBACK" | "DISCARDED"}}`` for the ids whose end this broker has recorded in
memory with its op message written (`TransactionalMessageService.known_end`); an id it does not know there
(ended before a restart, or long ago) is left out, and the asker looks it up as before (QUERY_MESSAGE). One
request instead of one look-up per transaction: what the Django face's marker cleanup asks every few seconds."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...common.topic import validate_topic
from ...remoting import RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from ..broker import Broker

EXTENSIONS = {"expectedVersionAppend": 1, "queryStream": 1, "statsHistory": 1, "multiStreamAppend": 1,
              "queryStreamLast": 1, "transactionEnds": 1}
MAX_TRANSACTION_IDS = 10_000  # ids one QUERY_TRANSACTION_ENDS may ask about
MAX_STREAM_EVENTS = 100_000  # one answer; a longer stream is read in pages with fromVersion
QUICK_STREAM_EVENTS = 64  # a stream read known to be at most this long is served on the event loop


class ExtensionProcessor:
    """GET_BROKER_EXTENSIONS; QUERY_STREAM: a stream's events from a version on, in version order, or every
    message of a key, oldest first, as stored records (RocketMQ's QUERY_MESSAGE caps an index lookup at 64
    messages, too few for a stream or a busy key)."""

    CODES = (RequestCode.GET_BROKER_EXTENSIONS, RequestCode.QUERY_STREAM, RequestCode.GET_BROKER_STATS_HISTORY,
             RequestCode.QUERY_TRANSACTION_ENDS)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def process(self, req: RemotingCommand, channel: Any, wait: bool = True) -> RemotingCommand | None:
        """The response; with `wait` False, None for a QUERY_STREAM that would wait for the dispatcher or
        read an unknown or large number of events (the server then serves it on a worker thread)."""
        if req.code == RequestCode.QUERY_STREAM:
            return self._query_stream(req, wait)
        if req.code == RequestCode.QUERY_TRANSACTION_ENDS:
            return self._transaction_ends(req)
        if req.code == RequestCode.GET_BROKER_STATS_HISTORY:
            stats = self.broker.stats_service
            doc = {"brokerName": self.broker.config.broker_name, "intervalMillis": int(stats.interval * 1000),
                   "samples": stats.history(req.get_int("since", 0))}
            return req.response(body=json.dumps(doc, separators=(",", ":")).encode())
        return req.response(body=json.dumps({"broker": "rmq_eventstore", "extensions": EXTENSIONS}).encode())

    def _transaction_ends(self, req: RemotingCommand) -> RemotingCommand:
        try:
            ids = json.loads(req.body or b"{}").get("ids")
        except (ValueError, AttributeError):
            ids = None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return req.response(ResponseCode.SYSTEM_ERROR,
                                'QUERY_TRANSACTION_ENDS needs a body {"ids": [transaction id, ...]}')
        if len(ids) > MAX_TRANSACTION_IDS:
            return req.response(ResponseCode.SYSTEM_ERROR,
                                f"QUERY_TRANSACTION_ENDS asks about at most {MAX_TRANSACTION_IDS} ids, not {len(ids)}")
        known = self.broker.transaction_service.known_end
        ends = {}
        for txid in ids:
            outcome = known(txid)
            if outcome is not None:
                ends[txid] = outcome
        return req.response(body=json.dumps({"ends": ends}, separators=(",", ":")).encode())

    def _query_stream(self, req: RemotingCommand, wait: bool = True) -> RemotingCommand | None:
        topic = req.get_str("topic", "")
        stream = req.get_str("stream", "")
        key = req.get_str("key", "")
        try:
            validate_topic(topic)
        except ValueError as e:
            return req.response(ResponseCode.SYSTEM_ERROR, str(e))
        if not stream and not key:
            return req.response(ResponseCode.SYSTEM_ERROR, "QUERY_STREAM needs a stream or a key")
        from_version = max(req.get_int("fromVersion", 1), 1)
        max_num = min(max(req.get_int("maxNum", MAX_STREAM_EVENTS), 1), MAX_STREAM_EVENTS)
        store = self.broker.store
        last = req.get_int("last", 0)
        if not wait:  # quick only when nothing is to be waited for and the stream is known to be short
            if key and not stream or store.dispatch_behind_bytes() > 0:
                return None
            if last > 0:
                if last > QUICK_STREAM_EVENTS:
                    return None
            else:
                known = self.broker.stream_versions.cached(topic, stream)
                if known is None or known - from_version >= QUICK_STREAM_EVENTS:
                    return None
        store.wait_for_dispatch(5.0)  # what was appended before the request is indexed
        if stream and last > 0:  # the newest `last` events (queryStreamLast)
            events = self.broker.stream_versions.read_last(topic, stream, min(last, MAX_STREAM_EVENTS))
        elif stream:
            events = self.broker.stream_versions.read(topic, stream, from_version, MAX_STREAM_EVENTS)[:max_num]
        else:  # every message of the key (KEYS token or UNIQ_KEY, verified by the store), oldest first
            events = sorted(store.query_message(topic, key, max_num, batch_limit=max_num).messages,
                            key=lambda m: m.commit_log_offset)
        bufs = [b for b in (store.select_one_message_by_offset(m.commit_log_offset) for m in events) if b]
        if not bufs:
            return req.response(ResponseCode.QUERY_NOT_FOUND, f"no messages of {topic} for {stream or key!r}")
        return req.response(body=b"".join(bufs))
