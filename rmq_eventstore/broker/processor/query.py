"""Lookups (`QueryMessageProcessor`): QUERY_MESSAGE by key through the index, VIEW_MESSAGE_BY_ID by offset."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...remoting import RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from ..broker import Broker


class QueryMessageProcessor:
    """Messages by key (verified against the record) and by commitlog offset, as stored bytes."""

    CODES = (RequestCode.QUERY_MESSAGE, RequestCode.VIEW_MESSAGE_BY_ID)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def process(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        if req.code == RequestCode.QUERY_MESSAGE:
            return self._query_message(req)
        return self._view_message_by_id(req)

    def _query_message(self, req: RemotingCommand) -> RemotingCommand:
        store = self.broker.store
        topic = req.get_str("topic")
        key = req.get_str("key")
        max_num = min(max(req.get_int("maxNum", 32), 1), self.broker.config.default_query_max_num)
        begin = req.get_int("beginTimestamp", 0)
        end = req.get_int("endTimestamp", 2**62)
        r = store.query_message(topic, key, max_num, begin, end)
        bufs = [b for b in (store.select_one_message_by_offset(m.commit_log_offset) for m in r.messages) if b]
        ext = {"indexLastUpdateTimestamp": r.index_last_update_timestamp,
               "indexLastUpdatePhyoffset": r.index_last_update_phyoffset}
        if not bufs:
            return req.response(ResponseCode.QUERY_NOT_FOUND,
                                "can not find message, maybe time range not correct", ext)
        return req.response(ext_fields=ext, body=b"".join(bufs))

    def _view_message_by_id(self, req: RemotingCommand) -> RemotingCommand:
        offset = req.get_int("offset")
        buf = self.broker.store.select_one_message_by_offset(offset) if offset >= 0 else None
        if not buf:
            return req.response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return req.response(body=buf)
