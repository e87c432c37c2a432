"""The record codec against the golden vectors produced by Apache RocketMQ 5.3.3 (`/work/shared/golden`).

Encoding: `cases.jsonl` → `store.bin` / `store-crc.bin` / `commitlog-2k/` byte for byte (and the summaries);
`cases-v1.jsonl` → `encode-v1.bin` (the client library's encoder).
Decoding: every field of every line of the `*.decoded.jsonl` files and `store.client-decodes.jsonl`.
"""

from __future__ import annotations

import pytest
from golden import (
    COMMITLOG_2K_FILE_SIZE,
    MISSING,
    build_mapped_files,
    build_store,
    case_body,
    case_properties_string,
    decoded_view,
    diff_fields,
    golden_path,
    line,
    params,
    read_bytes,
    read_jsonl,
    walk_file,
)

from rmq_eventstore.common import codec

N_CASES = 15
N_CASES_V1 = 13
VERSION_NAMES = {"V1": "MESSAGE_VERSION_V1", "V2": "MESSAGE_VERSION_V2"}
CRC_TRAILER = f"{codec.PROPERTY_CRC32}\x01"


def _first_difference(a: bytes, b: bytes) -> str:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return f"first difference at byte {i}: {a[i:i + 16].hex()} != {b[i:i + 16].hex()}"
    return f"lengths differ: {len(a)} != {len(b)}"


def _cases() -> list[dict]:
    return read_jsonl("cases.jsonl")


def _file_2k_names() -> list[str]:
    d = golden_path("commitlog-2k")
    return sorted(p.name for p in d.iterdir())


# -- inventory -------------------------------------------------------------------------------------
def test_golden_inventory():
    """The golden set is complete (a truncated file would make the parametrised tests vacuous)."""
    assert len(read_jsonl("cases.jsonl")) == N_CASES
    assert len(read_jsonl("store.summary.jsonl")) == N_CASES
    assert len(read_jsonl("store-crc.summary.jsonl")) == N_CASES
    assert len(read_jsonl("store.decoded.jsonl")) == N_CASES + 1
    assert len(read_jsonl("store-crc.decoded.jsonl")) == N_CASES + 1
    assert len(read_jsonl("store.client-decodes.jsonl")) == N_CASES + 1
    assert len(read_jsonl("commitlog-2k.summary.jsonl")) == N_CASES + 1  # + the BLANK
    assert len(read_jsonl("commitlog-2k.decoded.jsonl")) == N_CASES + 1 + 2  # + BLANK + 2 file summaries
    assert len(read_jsonl("cases-v1.jsonl")) == N_CASES_V1
    assert len(read_jsonl("encode-v1.summary.jsonl")) == N_CASES_V1
    assert _file_2k_names() == ["00000000000000000000", "00000000000000002048"]
    for name in ("store.bin", "store-crc.bin", "encode-v1.bin"):
        assert len(read_bytes(name)) > 0


# -- encoding: store.bin -----------------------------------------------------------------------------
def test_store_bin_byte_for_byte():
    built = build_store(_cases())
    got = b"".join(b.record for b in built)
    want = read_bytes("store.bin")
    assert got == want, _first_difference(got, want)


@pytest.mark.parametrize("i", params("cases.jsonl"))
def test_store_record_and_summary(i):
    summary = line("store.summary.jsonl", i)
    b = build_store(_cases())[i]
    want = read_bytes("store.bin")[summary["wroteOffset"]:summary["wroteOffset"] + summary["msgLen"]]
    assert b.record == want, _first_difference(b.record, want)
    m = codec.decode_message(b.record)
    chk = codec.check_message_and_return_size(b.record, 0, check_crc=True)
    got = {
        "wroteOffset": b.physical_offset, "msgLen": len(b.record), "queueOffset": b.queue_offset,
        "version": VERSION_NAMES[m.version], "sysFlag": m.sys_flag, "tagsCode": chk.request.tags_code,
        "offsetMsgId": codec.create_message_id(m.store_host_bytes, m.store_port, b.physical_offset),
        "propertiesString": case_properties_string(b.case),
    }
    assert got == summary, diff_fields(got, summary)
    assert m.queue_offset == b.queue_offset and m.commit_log_offset == b.physical_offset


def test_queue_offsets_follow_transaction_type():
    """PREPARED takes no queue offset; the COMMIT after it in the same queue gets 0, not 1."""
    by_case = {b.case["case"]: b for b in build_store(_cases())}
    assert by_case["tx_prepared"].queue_offset == 0
    assert by_case["tx_commit"].queue_offset == 0
    assert by_case["second_in_queue"].queue_offset == 1
    assert by_case["ipv6_store_only"].queue_offset == 1  # TopicV6-0 after ipv6_both


# -- encoding: store-crc.bin -------------------------------------------------------------------------
def test_store_crc_bin_byte_for_byte():
    built = build_store(_cases(), append_crc=True)
    got = b"".join(b.record for b in built)
    want = read_bytes("store-crc.bin")
    assert got == want, _first_difference(got, want)


@pytest.mark.parametrize("i", params("cases.jsonl"))
def test_store_crc_record_and_summary(i):
    summary = line("store-crc.summary.jsonl", i)
    b = build_store(_cases(), append_crc=True)[i]
    want = read_bytes("store-crc.bin")[summary["wroteOffset"]:summary["wroteOffset"] + summary["msgLen"]]
    assert b.record == want, _first_difference(b.record, want)
    m = codec.decode_message(b.record)
    got = {
        "wroteOffset": b.physical_offset, "msgLen": len(b.record), "queueOffset": b.queue_offset,
        "version": VERSION_NAMES[m.version], "sysFlag": m.sys_flag,
        "tagsCode": codec.tags_string_to_tags_code(m.tags),
        "offsetMsgId": codec.create_message_id(m.store_host_bytes, m.store_port, b.physical_offset),
        "propertiesString": case_properties_string(b.case),
    }
    assert got == summary, diff_fields(got, summary)
    # The trailer: "__CRC32#" 0x01 + 10 digits (least significant first) + 0x02, over the bytes before it.
    crc = codec.body_crc(b.record[:-codec.CRC32_RESERVED_LEN])
    trailer = (CRC_TRAILER + codec.crc32_property_value(crc) + "\x02").encode()
    assert b.record[-codec.CRC32_RESERVED_LEN:] == trailer
    assert len(b.record) == len(build_store(_cases())[i].record) + 20
    for verify_prop_crc in (False, True):
        r = codec.check_message_and_return_size(b.record, 0, check_crc=True, verify_prop_crc=verify_prop_crc)
        assert r.success and r.size == len(b.record), r


# -- encoding: commitlog-2k/ -----------------------------------------------------------------------
def test_commitlog_2k_files_byte_for_byte():
    files, _log = build_mapped_files(_cases(), COMMITLOG_2K_FILE_SIZE)
    names = _file_2k_names()
    assert [f"{start:020d}" for start in sorted(files)] == names
    for start, data in sorted(files.items()):
        want = golden_path(f"commitlog-2k/{start:020d}").read_bytes()
        assert data == want, f"file {start:020d}: " + _first_difference(data, want)


def test_commitlog_2k_summary():
    _files, log = build_mapped_files(_cases(), COMMITLOG_2K_FILE_SIZE)
    summary = read_jsonl("commitlog-2k.summary.jsonl")
    assert len(log) == len(summary)
    qo: dict = {}
    for (kind, phys, what), want in zip(log, summary, strict=True):
        if kind == "blank":
            assert want == {"blank": True, "wroteOffset": phys, "totalSize": what}
            continue
        rec = codec.encode_record(
            topic=what["topic"], body=case_body(what), properties_string=case_properties_string(what),
            born_host=codec.parse_host(what["bornHost"]), store_host=codec.parse_host(what["storeHost"]),
            sys_flag=what.get("sysFlag", 0), force_v2=what.get("version") == "V2")
        m = codec.decode_message(rec)
        key = (what["topic"], what.get("queueId", 0))
        if codec.transaction_value(m.sys_flag) in (0, codec.TRANSACTION_COMMIT_TYPE):
            q = qo[key] = qo.get(key, -1) + 1
        else:
            q = 0
        got = {
            "wroteOffset": phys, "msgLen": len(rec), "queueOffset": q, "version": VERSION_NAMES[m.version],
            "sysFlag": m.sys_flag, "tagsCode": codec.tags_string_to_tags_code(m.tags),
            "offsetMsgId": codec.create_message_id(m.store_host_bytes, m.store_port, phys),
            "propertiesString": m.properties_string,
        }
        assert got == want, diff_fields(got, want)


# -- encoding: the client library's encoder ------------------------------------------------------------
def _encode_v1(case: dict) -> bytearray:
    return codec.encode_client_message(
        topic=case["topic"], body=case_body(case), born_host=codec.parse_host(case["bornHost"]),
        store_host=codec.parse_host(case["storeHost"]), tags=case.get("tags"), keys=case.get("keys"),
        queue_id=case.get("queueId", 0), flag=case.get("flag", 0), sys_flag=case.get("sysFlag", 0),
        born_timestamp=case.get("bornTimestamp", 0), store_timestamp=case.get("storeTimestamp", 0),
        reconsume_times=case.get("reconsumeTimes", 0),
        prepared_transaction_offset=case.get("preparedTransactionOffset", 0),
    )


def test_encode_v1_bin_byte_for_byte():
    got = b"".join(_encode_v1(c) for c in read_jsonl("cases-v1.jsonl"))
    want = read_bytes("encode-v1.bin")
    assert got == want, _first_difference(got, want)


@pytest.mark.parametrize("i", params("cases-v1.jsonl"))
def test_encode_v1_record_and_summary(i):
    case = line("cases-v1.jsonl", i)
    summary = line("encode-v1.summary.jsonl", i)
    rec = bytes(_encode_v1(case))
    start = summary["offsetInFile"]
    want = read_bytes("encode-v1.bin")[start:start + summary["length"]]
    assert rec == want, _first_difference(rec, want)
    m = codec.decode_message(rec, check_crc=True)
    assert m.magic_code == codec.MESSAGE_MAGIC_CODE  # always V1
    assert (m.queue_offset, m.commit_log_offset) == (0, 0)
    got = {"offsetInFile": start, "length": len(rec), "topic": m.topic, "sysFlag": m.sys_flag,
           "propertiesString": m.properties_string}
    assert got == summary, diff_fields(got, summary)
    # Only tags/keys become properties (a case's propertiesString is not used by this encoder).
    expected = {k: v for k, v in (("TAGS", case.get("tags")), ("KEYS", " ".join(case.get("keys") or [])))
                if v}
    assert m.properties == expected


def test_encode_v1_properties_in_hashmap_order():
    """Java HashMap puts KEYS (bucket 2) before TAGS (bucket 14) although TAGS was put first."""
    assert codec.java_hashmap_order(["TAGS", "KEYS"]) == ["KEYS", "TAGS"]
    assert codec.java_properties_string({"TAGS": "TagA", "KEYS": "k1 k2"}) == "KEYS\x01k1 k2\x02TAGS\x01TagA\x02"


# -- decoding ----------------------------------------------------------------------------------------
def _message_lines(name: str) -> list[dict]:
    return [d for d in read_jsonl(name) if "offsetInFile" in d]


@pytest.mark.parametrize("i", params("store.summary.jsonl", id_key=None))
@pytest.mark.parametrize("name, data", [("store.decoded.jsonl", "store.bin"),
                                        ("store-crc.decoded.jsonl", "store-crc.bin")])
def test_decode_every_field(name, data, i):
    if i == MISSING:
        line(name, i)
    want = _message_lines(name)[i]
    got = decoded_view(read_bytes(data), want["offsetInFile"])
    assert got == want, diff_fields(got, want)


@pytest.mark.parametrize("name, data", [("store.decoded.jsonl", "store.bin"),
                                        ("store-crc.decoded.jsonl", "store-crc.bin")])
def test_walk_whole_file(name, data):
    """`iter_records` finds exactly the golden records and stops where Java stopped."""
    buf = read_bytes(data)
    lines = read_jsonl(name)
    views, stopped = walk_file(buf)
    assert len(views) == len(lines) - 1
    for got, want in zip(views, lines, strict=False):
        assert got == want, diff_fields(got, want)
    assert lines[-1] == {"decodedMessages": len(views), "stoppedAt": stopped}


def test_walk_crc_file_with_prop_crc_verification():
    buf = read_bytes("store-crc.bin")
    pos = n = 0
    while pos < len(buf):
        r = codec.check_message_and_return_size(buf, pos, check_crc=True, verify_prop_crc=True)
        assert r.success and r.size > 0, (pos, r)
        crc = codec.parse_crc32_property_value(r.request.properties_string[-11:-1])
        assert crc == codec.body_crc(buf[pos:pos + r.size - codec.CRC32_RESERVED_LEN])
        pos += r.size
        n += 1
    assert n == N_CASES


def test_decode_commitlog_2k():
    """Both mapped files: the first ends with a BLANK, offsets continue at 2048 in the second."""
    lines = read_jsonl("commitlog-2k.decoded.jsonl")
    groups: list[list[dict]] = [[]]
    for d in lines:
        groups[-1].append(d)
        if "decodedMessages" in d:
            groups.append([])
    groups.pop()
    names = _file_2k_names()
    assert len(groups) == len(names) == 2
    for fname, group in zip(names, groups, strict=True):
        buf = golden_path(f"commitlog-2k/{fname}").read_bytes()
        views, stopped = walk_file(buf)
        *records, summary = group
        assert len(views) == len(records), fname
        for got, want in zip(views, records, strict=True):
            assert got == want, (fname, diff_fields(got, want))
        n_msgs = sum(1 for v in views if "blank" not in v)
        assert summary == {"decodedMessages": n_msgs, "stoppedAt": stopped}, fname
        for v in views:
            if "blank" not in v:
                assert v["commitLogOffset"] == int(fname) + v["offsetInFile"]
    # the BLANK's size takes the first file to its end; reading resumes at the next file's start
    blank = groups[0][-2]
    assert blank["blank"] and blank["offsetInFile"] + blank["totalSize"] == COMMITLOG_2K_FILE_SIZE
    first = golden_path(f"commitlog-2k/{names[0]}").read_bytes()
    assert codec.check_message_and_return_size(first, blank["offsetInFile"], check_crc=True) == (0, True, None, "")
    assert codec.read_size_magic(first, blank["offsetInFile"]) == (blank["totalSize"], codec.BLANK_MAGIC_CODE)
    assert first[blank["offsetInFile"] + 8:] == bytes(blank["totalSize"] - 8)
    with pytest.raises(codec.CorruptRecordError) as e:
        codec.decode_message(first, blank["offsetInFile"])
    assert e.value.size == 0


@pytest.mark.parametrize("i", params("store.summary.jsonl", id_key=None))
def test_client_decode_every_field(i):
    """`MessageDecoder.decodes`: msgId is UNIQ_KEY when present, else the offsetMsgId."""
    if i == MISSING:
        line("store.client-decodes.jsonl", i)
    want = _message_lines("store.client-decodes.jsonl")[i]
    got = decoded_view(read_bytes("store.bin"), want["offsetInFile"], client=True)
    assert got == want, diff_fields(got, want)


def test_client_decodes_whole_buffer():
    buf = read_bytes("store.bin")
    lines = read_jsonl("store.client-decodes.jsonl")
    pos = n = 0
    while pos < len(buf):
        m = codec.decode_message(buf, pos, decompress=True)
        want = lines[n]
        assert want["offsetInFile"] == pos
        assert m.client_msg_id == want["msgId"]
        assert m.offset_msg_id == want["offsetMsgId"]
        pos += m.store_size
        n += 1
    assert lines[-1] == {"decodedMessages": n, "bytesConsumed": pos, "bytesTotal": len(buf)}


def test_decoded_compressed_body():
    """The zlib case: sysFlag loses COMPRESSED in the decompressed view; bodyCRC stays the stored one."""
    buf = read_bytes("store.bin")
    want = next(d for d in _message_lines("store.decoded.jsonl") if d["storedSysFlag"] & codec.COMPRESSED_FLAG)
    raw = codec.decode_message(buf, want["offsetInFile"])
    inflated = codec.decode_message(buf, want["offsetInFile"], decompress=True)
    assert raw.sys_flag == want["storedSysFlag"] and inflated.sys_flag == want["sysFlag"]
    assert len(raw.body) == want["storedBodyLength"] and len(inflated.body) == want["bodyLength"]
    assert raw.body_crc == codec.body_crc(raw.body) == want["bodyCRC"] != want["bodyCRCComputed"]
