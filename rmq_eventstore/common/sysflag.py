"""`MessageSysFlag` and `MessageVersion`: the sysFlag bits of a record and the two magic codes that tell
a V1 record (1-byte topic length) from a V2 one (2-byte). Shared by the codec and the message model."""

from __future__ import annotations

MESSAGE_MAGIC_CODE = -626843481  # DA A3 20 A7, V1: 1-byte topic length
MESSAGE_MAGIC_CODE_V2 = -626843477  # DA A3 20 AB, V2: 2-byte topic length
BLANK_MAGIC_CODE = -875286124  # CB D4 31 94, end of file

# sysFlag bits (C/sysflag/MessageSysFlag.java)
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20
NEED_UNWRAP_FLAG = 0x40
INNER_BATCH_FLAG = 0x80
COMPRESSION_LZ4_TYPE = 0x100
COMPRESSION_ZSTD_TYPE = 0x200
COMPRESSION_ZLIB_TYPE = 0x300
COMPRESSION_TYPE_COMPARATOR = 0x700


def transaction_value(sys_flag: int) -> int:
    """The transaction bits of a sysFlag (`MessageSysFlag.getTransactionValue`)."""
    return sys_flag & TRANSACTION_ROLLBACK_TYPE
