"""`RemotingCommand` and its frame codec: RocketMQ's remoting wire format.

A frame is `int32 length` (everything after this word) | `int32 header length` whose high byte is the
serialization type (0 JSON, 1 ROCKETMQ binary) and low 24 bits the header size | header | body. All
integers are big-endian. We decode both header types and always encode JSON (type 0), which every
RocketMQ client reads. `extFields` values arrive as JSON strings, numbers or booleans (ali-ons sends
numbers and booleans as they are in JavaScript); they are normalised to the strings a Java peer would
have sent (`true`/`false`, decimal integers), and always written back as strings.

Nothing here does I/O: `FrameDecoder.feed(bytes)` returns the complete commands and raises
`FrameError` for a frame that cannot be one (bad lengths, over the size limits, bad header); the
connection that sent it must then be closed.

`RemotingCommand.encode` and `FrameDecoder.feed` run in C (`rmq_eventstore._native`'s remoting block) when
the extension is built and `RMQ_EVENTSTORE_PURE` is not set (`NATIVE` says which): the C code handles the
plain shapes every peer sends (exact str/int fields; JSON headers of strings and integers) and leaves
everything else to the Python code here, which stays the definition of the bytes and of the errors.
"""

from __future__ import annotations

import itertools
import json
import json.scanner
import os
import struct
from types import ModuleType
from typing import Any

from .codes import FLAG_ONEWAY, FLAG_RESPONSE, LanguageCode, ResponseCode, SerializeType

__all__ = [
    "DEFAULT_MAX_FRAME_SIZE", "DEFAULT_MAX_HEADER_SIZE", "NATIVE", "FrameDecoder", "FrameError", "HeaderError",
    "RemotingCommand", "next_opaque",
]

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024  # NettyDecoder's default frameMaxLength (16 MiB)
DEFAULT_MAX_HEADER_SIZE = 1024 * 1024  # headers are small: the largest field is a message's properties
_LEN2 = struct.Struct(">ii")
_INT = struct.Struct(">i")
_BIN_HEAD = struct.Struct(">hbhii")  # code, language, version, opaque, flag
_SHORT = struct.Struct(">h")
_LANG_NAMES = {lc.value: lc.name for lc in LanguageCode}
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_loads = json.loads
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # the C scanner json.loads ends up in
_JSON_WS = " \t\n\r"
_opaque_counter = itertools.count(1)
OPAQUES = _opaque_counter  # next_opaque's counter, for a caller that inlines it: next(OPAQUES) & 0x7FFFFFFF


def next_opaque() -> int:
    """A process-wide request id (wraps at 2^31, as Java's AtomicInteger requestId does)."""
    return next(_opaque_counter) & 0x7FFFFFFF


class FrameError(ValueError):
    """The bytes on a connection are not a remoting frame; the connection must be closed."""


class HeaderError(ValueError):
    """A request lacks a header field it needs, or a field has the wrong form (answered SYSTEM_ERROR)."""


def _ext_value(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise FrameError(f"extFields[{key!r}] is not a finite number")
        return str(int(value)) if value.is_integer() else repr(value)
    raise FrameError(f"extFields[{key!r}] must be a string, number or boolean, not {type(value).__name__}")


def _ext_strings(fields: dict[str, Any]) -> dict[str, str]:
    """extFields as strings, None values left out; strings and ints (what nearly every field is) take no
    per-type checks."""
    out: dict[str, str] = {}
    for k, v in fields.items():
        c = v.__class__
        if c is str:
            out[k] = v
        elif c is int:
            out[k] = str(v)
        elif v is not None:
            s = _ext_value(k, v)
            if s is not None:
                out[k] = s
    return out


def _i32(h: dict[str, Any], name: str, default: int) -> int:
    v = h.get(name, default)
    if v.__class__ is not int or not -0x80000000 <= v <= 0x7FFFFFFF:
        raise FrameError(f"header field {name!r} must be a 32-bit integer, got {str(v)[:40]!r}")
    return v


_LANG_JSON: dict[str, str] = {}  # language -> its JSON text (a handful of values: cached)


def _lang_json(language: str) -> str:
    j = _LANG_JSON.get(language)
    if j is None:
        j = _dumps(language)
        if len(_LANG_JSON) < 64:
            _LANG_JSON[language] = j
    return j


class RemotingCommand:
    """One request or response (`RemotingCommand`): code, opaque id, flag bits, remark, extFields, body.

    `ext_fields` holds strings only (what a Java peer sends); the typed getters raise `HeaderError`
    with the field's name when a request lacks a field or it does not parse.
    """

    __slots__ = ("code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body",
                 "serialize_type")

    def __init__(self, code: int, ext_fields: dict[str, str] | None = None, body: bytes = b"",
                 opaque: int = 0, flag: int = 0, remark: str | None = None, language: str = "PYTHON",
                 version: int = 435, serialize_type: int = SerializeType.JSON) -> None:
        self.code = code
        self.ext_fields = ext_fields if ext_fields is not None else {}
        self.body = body
        self.opaque = opaque
        self.flag = flag
        self.remark = remark
        self.language = language
        self.version = version
        self.serialize_type = serialize_type

    # -- construction ------------------------------------------------------------------------------
    @classmethod
    def request(cls, code: int, ext_fields: dict[str, Any] | None = None, body: bytes = b"",
                oneway: bool = False) -> RemotingCommand:
        """A new request with a fresh opaque; `ext_fields` values are turned into strings."""
        if _native_new is not None and cls is RemotingCommand:  # the common case in C: slots filled, no __init__
            cmd = _native_new(code, ext_fields, body, next(_opaque_counter) & 0x7FFFFFFF, FLAG_ONEWAY if oneway else 0)
            if cmd is not None:
                return cmd
        return cls(code, _ext_strings(ext_fields) if ext_fields else {}, body, next_opaque(),
                   FLAG_ONEWAY if oneway else 0)

    def response(self, code: int = ResponseCode.SUCCESS, remark: str | None = None,
                 ext_fields: dict[str, Any] | None = None, body: bytes = b"") -> RemotingCommand:
        """The response to this request (same opaque, response flag), extFields as strings."""
        return RemotingCommand(int(code), _ext_strings(ext_fields) if ext_fields else {}, body,
                               self.opaque, FLAG_RESPONSE, remark, "JAVA", self.version)

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    # -- typed header access -------------------------------------------------------------------------
    def get_str(self, name: str, default: Any = ...) -> Any:
        v = self.ext_fields.get(name)
        if v is None:
            if default is ...:
                raise HeaderError(f"the custom field <{name}> is null")
            return default
        return v

    def get_int(self, name: str, default: Any = ...) -> Any:
        v = self.ext_fields.get(name)
        if v is None or v == "":
            if default is ...:
                raise HeaderError(f"the custom field <{name}> is null")
            return default
        try:
            return int(v)
        except ValueError:
            raise HeaderError(f"the custom field <{name}> is not an integer: {v[:64]!r}") from None

    def get_bool(self, name: str, default: Any = ...) -> Any:
        v = self.ext_fields.get(name)
        if v is None or v == "":
            if default is ...:
                raise HeaderError(f"the custom field <{name}> is null")
            return default
        return v.strip().lower() == "true"  # Java's Boolean.parseBoolean

    # -- encoding ---------------------------------------------------------------------------------------
    def header_json(self) -> bytes:
        """The JSON header, byte for byte what `json` would write for the dict {code, language, version,
        opaque, flag[, remark][, extFields], serializeTypeCurrentRPC}, built as text: only the remark and
        the extFields go through the (C) JSON encoder."""
        text = (f'{{"code":{self.code:d},"language":{_lang_json(self.language)},"version":{self.version:d},'
                f'"opaque":{self.opaque:d},"flag":{self.flag:d}')
        if self.remark is not None:
            text += ',"remark":' + _dumps(self.remark)
        if self.ext_fields:
            text += ',"extFields":' + _dumps(self.ext_fields)
        return (text + ',"serializeTypeCurrentRPC":"JSON"}').encode("utf-8")

    def encode(self) -> bytes:
        """The whole frame: length, JSON header length (type byte 0), header, body (in C when it can)."""
        if _native_encode is not None:
            frame = _native_encode(self)
            if frame is not None:
                return frame
        return self.encode_py()

    def encode_py(self) -> bytes:
        """`encode` in Python: the reference the C encoder must match."""
        header = self.header_json()
        body = self.body
        if not body:
            return _LEN2.pack(4 + len(header), len(header)) + header
        return b"".join((_LEN2.pack(4 + len(header) + len(body), len(header)), header, body))

    def __repr__(self) -> str:
        kind = "response" if self.is_response else "request"
        return (f"RemotingCommand({kind} code={self.code}, opaque={self.opaque}, flag={self.flag}, "
                f"remark={self.remark!r}, ext={self.ext_fields!r}, body={len(self.body or b'')} bytes)")


def _load_native() -> ModuleType | None:
    """The C codec (`rmq_eventstore._native`'s remoting block), unless `RMQ_EVENTSTORE_PURE` is set or it is
    not built (then None: the Python code here serves)."""
    if os.environ.get("RMQ_EVENTSTORE_PURE", "0") not in ("", "0"):
        return None
    try:
        from .. import _native
    except ImportError:
        return None
    if not hasattr(_native, "remoting_decode"):  # an extension built before the codec was added
        return None
    _native.remoting_init(RemotingCommand, SerializeType.JSON)
    return _native


_native_mod = _load_native()
NATIVE: bool = _native_mod is not None
_native_encode = _native_mod.remoting_encode if _native_mod is not None else None
_native_decode = _native_mod.remoting_decode if _native_mod is not None else None
# RemotingCommand.request's command made in C (an extension built before it has none: request's Python)
_native_new = getattr(_native_mod, "client_new_request", None)
NATIVE_MODULE: ModuleType | None = _native_mod  # the extension when the codec is native (the client's fast reads)


def loads_text(s: str) -> Any:
    """`json.loads(s)` through the C scanner directly, without json.loads' Python steps (`decode`,
    `raw_decode`): a document that starts at the first character (what peers send). Anything else, and
    any error, goes through json.loads itself, so results and errors stay exactly json's."""
    try:
        obj, end = _scan_json(s, 0)
    except (StopIteration, ValueError):
        return _loads(s)
    if end != len(s) and s[end:].strip(_JSON_WS):
        return _loads(s)  # extra data: json raises
    return obj


def _loads_header(data: bytes | bytearray) -> Any:
    """`json.loads(data)` for a header: a header that starts with `{` (every peer's) is decoded from UTF-8
    (as json.loads decodes bytes, surrogates passed) and read by `loads_text` (about half the cost of
    json.loads for a send's header); anything else goes through json.loads itself."""
    if data[:1] != b"{" or data[1:2] == b"\x00":  # json.loads would read `{` NUL as UTF-16/32-LE
        return _loads(data)
    return loads_text(data.decode("utf-8", "surrogatepass"))


def _decode_json_header(data: bytes) -> RemotingCommand:
    try:
        h = _loads_header(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise FrameError(f"header is not JSON: {e}") from None
    if h.__class__ is not dict:
        raise FrameError("header is not a JSON object")
    try:
        code = _i32(h, "code", None)  # type: ignore[arg-type]  # absent: None, refused as not an integer
        opaque = _i32(h, "opaque", 0)
        flag = _i32(h, "flag", 0)
        version = _i32(h, "version", 0)
        remark = h.get("remark")
        if remark is not None and remark.__class__ is not str:
            raise FrameError("header field 'remark' must be a string")
        lang = h.get("language", "JAVA")
        if lang.__class__ is not str:
            if isinstance(lang, int) and not isinstance(lang, bool):
                lang = _LANG_NAMES.get(lang, "OTHER")
            else:
                raise FrameError("header field 'language' must be a string")
        raw_ext = h.get("extFields")
        if raw_ext is None:
            ext: dict[str, str] = {}
        elif raw_ext.__class__ is not dict:
            raise FrameError("header field 'extFields' must be an object")
        elif set(map(type, raw_ext.values())) <= _STR_ONLY:
            ext = raw_ext  # what every Java peer sends: strings only, taken as they are (a fresh dict)
        else:
            ext = {}
            for k, v in raw_ext.items():
                sv = v if v.__class__ is str else _ext_value(k, v)
                if sv is not None:
                    ext[k] = sv
    except FrameError:
        raise
    except Exception as e:  # pragma: no cover - defensive: any surprise in a hostile header
        raise FrameError(f"bad header: {e}") from None
    return RemotingCommand(code, ext, b"", opaque, flag, remark, lang[:16], version)


_STR_ONLY = frozenset({str})


def _decode_rocketmq_header(data: bytes) -> RemotingCommand:
    """RocketMQ's binary header (`RocketMQSerializable.rocketMQProtocolDecode`)."""
    try:
        code, lang, version, opaque, flag = _BIN_HEAD.unpack_from(data, 0)
        pos = _BIN_HEAD.size
        (rlen,) = _INT.unpack_from(data, pos)
        pos += 4
        if rlen < 0 or pos + rlen > len(data):
            raise FrameError("binary header: remark length out of range")
        remark = data[pos:pos + rlen].decode("utf-8") if rlen else None
        pos += rlen
        (elen,) = _INT.unpack_from(data, pos)
        pos += 4
        if elen < 0 or pos + elen != len(data):
            raise FrameError("binary header: extFields length does not match the header")
        ext: dict[str, str] = {}
        end = pos + elen
        while pos < end:
            (klen,) = _SHORT.unpack_from(data, pos)
            pos += 2
            if klen < 0 or pos + klen > end:
                raise FrameError("binary header: key length out of range")
            key = data[pos:pos + klen].decode("utf-8")
            pos += klen
            (vlen,) = _INT.unpack_from(data, pos)
            pos += 4
            if vlen < 0 or pos + vlen > end:
                raise FrameError("binary header: value length out of range")
            ext[key] = data[pos:pos + vlen].decode("utf-8")
            pos += vlen
    except (struct.error, UnicodeDecodeError) as e:
        raise FrameError(f"binary header: {e}") from None
    return RemotingCommand(code, ext, b"", opaque, flag, remark, _LANG_NAMES.get(lang, "OTHER"), version,
                           SerializeType.ROCKETMQ)


def decode_frame(frame: bytes | memoryview) -> RemotingCommand:
    """Decode one frame without its leading length word (`RemotingCommand.decode`)."""
    n = len(frame)
    if n < 4:
        raise FrameError(f"frame of {n} bytes has no header length")
    (word,) = _INT.unpack_from(frame, 0)
    stype = (word >> 24) & 0xFF
    hlen = word & 0xFFFFFF
    if hlen <= 0 or 4 + hlen > n:
        raise FrameError(f"header length {hlen} does not fit the frame of {n} bytes")
    header = bytes(frame[4:4 + hlen])
    if stype == SerializeType.JSON:
        cmd = _decode_json_header(header)
    elif stype == SerializeType.ROCKETMQ:
        cmd = _decode_rocketmq_header(header)
    else:
        raise FrameError(f"unknown serialization type {stype}")
    cmd.body = bytes(frame[4 + hlen:])
    return cmd


class FrameDecoder:
    """Incremental frame splitter (`NettyDecoder`): feed it bytes, get whole `RemotingCommand`s back."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 max_header_size: int = DEFAULT_MAX_HEADER_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self.max_header_size = max_header_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[RemotingCommand]:
        """The commands completed by `data` (raises `FrameError` on a malformed frame). With nothing
        buffered (the common case: whole frames per read) the frames are cut out of `data` itself and only
        an incomplete tail is kept."""
        buf = self._buf
        native = _native_decode
        max_frame = self.max_frame_size
        max_header = self.max_header_size
        if not buf and native is not None:  # the common case: whole frames the C loop takes, one call
            got, pos = native(data, 0, max_frame, max_header)
            if pos == len(data):
                return got
            return self._feed_rest(data, got, pos)
        return self._feed_rest(data, [], 0)

    def _feed_rest(self, data: bytes, out: list[RemotingCommand], pos: int) -> list[RemotingCommand]:
        """`feed` from `pos` of the buffered bytes plus `data` (`out`: the commands decoded before `pos`)."""
        buf = self._buf
        if buf:
            buf += data
            src: bytes | bytearray = buf
        else:
            src = data
        n = len(src)
        max_frame = self.max_frame_size
        max_header = self.max_header_size
        native = _native_decode
        try:
            while n - pos >= 8:
                if native is not None:  # the C loop takes the JSON frames it can; the rest goes on below
                    got, pos = native(src, pos, max_frame, max_header)
                    if got:
                        out += got
                    if n - pos < 8:
                        break
                length, word = _LEN2.unpack_from(src, pos)
                if length < 4 or length > max_frame:
                    raise FrameError(f"frame length {length} is outside 4..{max_frame}")
                hlen = word & 0xFFFFFF
                if hlen > max_header or hlen > length - 4 or hlen <= 0:
                    raise FrameError(f"header length {hlen} is outside 1..{min(max_header, length - 4)}")
                end = pos + 4 + length
                if n < end:
                    break
                hstart = pos + 8
                stype = (word >> 24) & 0xFF
                if stype == SerializeType.JSON:
                    cmd = _decode_json_header(src[hstart:hstart + hlen])
                elif stype == SerializeType.ROCKETMQ:
                    cmd = _decode_rocketmq_header(bytes(src[hstart:hstart + hlen]))
                else:
                    raise FrameError(f"unknown serialization type {stype}")
                if hstart + hlen < end:
                    cmd.body = bytes(src[hstart + hlen:end])
                out.append(cmd)
                pos = end
        finally:
            if src is buf:
                if pos:
                    del buf[:pos]
            elif pos < n:
                buf += data[pos:] if pos else data
        return out

    @property
    def buffered(self) -> int:
        return len(self._buf)
