/*
 * rmq_eventstore._native: the per-record loops of the store in C (issue 16).
 *
 * Each function here is a drop-in for a pure-Python reference in rmq_eventstore/common/codec.py or the
 * store's dispatchers, which stay the definition of what is right: the callers fall back to the Python
 * function whenever a function here returns None ("not mine to decide": an unusual type, a value out of
 * range, a string that is not strict UTF-8 / UTF-16), so the results are those of the reference by
 * construction, and the test suite checks byte identity on everything that is handled here.
 *
 *   encode_plain_batch  RecordEncoder.encode_plain_batch: whole V1/V2 records for plain messages
 *   encode_plain_one    RecordEncoder.encode_plain_one: the same for a single put (no batch bookkeeping)
 *   encode_network_batch RecordEncoder.encode_network_batch: the same for messages with a properties string
 *   index_keys          IndexService.build_index's key loop + index_key_hashes (Java String.hashCode)
 *   group_units         MessageStore._dispatch's grouping of consume-queue units per queue
 *   skim_records        codec.skim_records(_prop_crc): the record walk of recovery and verify (body CRC,
 *                       and the `__CRC32#` trailer with prop_crc)
 *   crc32               zlib-compatible CRC-32 (the store masks it to 31 bits)
 *   copy_into           MappedFile.append_message's copy of a batch, without the GIL
 *   populate            MappedFile.warm: a fresh file's pages faulted in ahead of the writer (no Python reference:
 *                       it changes no byte)
 *   count_missing_uniq  CommitLog._uniq_keys's count of messages the store gives a UNIQ_KEY
 *   verify_*            store/repair.py verify's loops (commitlog walk, consume-queue units, index entries),
 *                       in their own block above the method table
 *   read_runs           MessageStore._get_matching_all: a pull's match-all read, the body as one bytes
 *   decode_records      codec.decode_records' loop: a pull body into MessageExts (init_pull binds the type)
 *   remoting_*          the remoting frame codec (its own block below: RemotingCommand.encode, FrameDecoder.feed)
 *   append_one          CommitLog._append_one's locked body (a single put: file, queue offset, record, hand-off)
 *   append_one_net      CommitLog._append_one_net's locked body (a network single put; THE NETWORK SINGLE PUT)
 *                       its record written into the file and its request built by sc_append_net (THE SEND CORE)
 *   uniq_create         UniqueIdGenerator.create's fast path (a single put's UNIQ_KEY)
 *   take_requests       ReputMessageService._take_pending's walk over a run of request chunks
 *   pop_set_handles,    PopConsumer.pop / _ack_requests: append each message's POP_CK handle, read it back into its
 *   pop_ack_scan        BatchAck bits (client/pop_consumer.py; their own block above the method table)
 *   offsets_text,       a run of queue offsets as text (POP's msgOffsetInfo, the POP buffer journal) and the
 *   int_run             check that a BatchAck's bits are consecutive ints (common/pop.py; block above the table)
 *   dispatch_singles    ReputMessageService's pass over single puts: consume-queue units, index entries, checkpoint
 *                       and offsets in one call (MessageStore._dispatch is the reference; block above the table)
 *   pop_register,       PopService.pop_now's registration of a contiguous pop in the POP buffer (checkpoint, entry,
 *   ack_settle          journal line, response texts) and PopBufferMergeService.ack_one's settling (THE POP CORE block)
 *   send_lane           SendMessageProcessor.lane: a plain SEND_MESSAGE_V2 checked, decorated, stored and answered
 *                       (its frame) in one call (block above the table)
 *   (half lane)         the same lane serves the usual half message of a transaction (TRAN_MSG=true) as
 *                       SendMessageProcessor.process stores and answers it (THE HALF LANE, above the table)
 *   slot_getattr(_any), getattr / setattr by slot offset where the generic protocol reads / writes that slot: how
 *   slot_setattr(_any)  dispatch_singles and the single put read and write fields (SLOT FIELDS, block above the table)
 *   end_commit_props,   TransactionalMessageService._commit_message's properties and half_message's properties dict,
 *   end_props_dict      in one pass over the half's properties string (THE END LANE, block above the table)
 *   end_index_have      IndexService.have_candidates' walk of an index file (THE END LANE)
 *   end_frame           EndTransactionProcessor.process for a one-way END_TRANSACTION read from its bytes: the half
 *                       read, checked and ended (commit and op records put, the end remembered) in one call (THE END
 *                       FRAME, block above the table)
 *   pop_read, queue_max PopService.pop_now's read of a queue (get_units_raw + read_runs + _file_span), the queues it
 *   queue_live,         reads (cq table, max offsets), and its per-queue bounds + read + pop_register under the
 *   pop_queue           buffer's lock (THE POP READ, block above the table)
 *   ack_one             AckMessageProcessor.lane + the buffer's ack_one + _scan_commit for the usual ack (THE ACK ONE)
 *   pop_offset          PopBufferMergeService.pop_offset (THE POP OFFSET; both blocks above the table)
 *   PopEntry            the base type of the POP buffer's entry (pop_buffer._Entry): its fields in C, the checkpoint
 *                       of an entry pop_register made built when first read (THE POP ENTRY, block above the table)
 *
 * Plain CPython C API. CRC-32 comes from zlib when its header is there at build time (setup.py defines
 * RMQ_HAVE_ZLIB), else from the slice-by-8 loop below (the same values, about half as fast).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <limits.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------- */
/* CRC-32 (IEEE 802.3, reflected, the polynomial zlib.crc32 uses), slice-by-8                       */
static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xFF] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
}

#ifdef RMQ_HAVE_ZLIB
#include <zlib.h>
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, Py_ssize_t n) {
    while (n > 0) {  /* zlib's crc32 takes an unsigned int length */
        unsigned int chunk = n > (1 << 30) ? (1u << 30) : (unsigned int)n;
        crc = (uint32_t)crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return crc;
}
#else
static uint32_t crc32_update(uint32_t crc, const unsigned char *p, Py_ssize_t n) {
    crc = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + 4, 4);
#if PY_LITTLE_ENDIAN
        a ^= crc;
        crc = crc_table[7][a & 0xFF] ^ crc_table[6][(a >> 8) & 0xFF] ^ crc_table[5][(a >> 16) & 0xFF] ^
              crc_table[4][a >> 24] ^ crc_table[3][b & 0xFF] ^ crc_table[2][(b >> 8) & 0xFF] ^
              crc_table[1][(b >> 16) & 0xFF] ^ crc_table[0][b >> 24];
#else
        {
            const unsigned char *q = p;
            for (int k = 0; k < 8; k++) crc = crc_table[0][(crc ^ q[k]) & 0xFF] ^ (crc >> 8);
        }
#endif
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}
#endif

/* ---------------------------------------------------------------------------------------------- */
/* big-endian writers / readers: one byte swap and an unaligned copy where the compiler has them (gcc
 * at -O2 does not turn the byte loops into one: the 64-bit loop was ~14 instructions per byte) */
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline void put_i32(unsigned char *p, int32_t v) {
    uint32_t u = __builtin_bswap32((uint32_t)v);
    memcpy(p, &u, 4);
}
static inline void put_i64(unsigned char *p, int64_t v) {
    uint64_t u = __builtin_bswap64((uint64_t)v);
    memcpy(p, &u, 8);
}
static inline int32_t get_i32(const unsigned char *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return (int32_t)__builtin_bswap32(u);
}
static inline int64_t get_i64(const unsigned char *p) {
    uint64_t u;
    memcpy(&u, p, 8);
    return (int64_t)__builtin_bswap64(u);
}
#else
static inline void put_i32(unsigned char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)(u >> 24); p[1] = (unsigned char)(u >> 16);
    p[2] = (unsigned char)(u >> 8); p[3] = (unsigned char)u;
}
static inline void put_i64(unsigned char *p, int64_t v) {
    uint64_t u = (uint64_t)v;
    for (int k = 7; k >= 0; k--) { p[k] = (unsigned char)u; u >>= 8; }
}
static inline int32_t get_i32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}
static inline int64_t get_i64(const unsigned char *p) {
    uint64_t u = 0;
    for (int k = 0; k < 8; k++) u = (u << 8) | p[k];
    return (int64_t)u;
}
#endif
static inline void put_i16(unsigned char *p, int v) {
    p[0] = (unsigned char)((unsigned)v >> 8); p[1] = (unsigned char)v;
}
static inline int16_t get_i16(const unsigned char *p) { return (int16_t)(((unsigned)p[0] << 8) | p[1]); }

/* The 20-byte `__CRC32#` trailer (codec.crc_trailer) of the record at `rec`, `total` bytes long: written
 * into its last 20 bytes from the CRC of the bytes before them (codec.fill_crc_trailer). */
#define CRC_RESERVED 20
/* zlib.crc32 folded with PCLMULQDQ when the CPU has it (defined with verify's loops below; the same values as
 * crc32_update): the trailer's CRC, the body CRC of the network records and of recovery's walk, as verify's. */
static uint32_t vf_crc32(const unsigned char *p, Py_ssize_t n);
static void fill_crc_trailer(unsigned char *rec, Py_ssize_t total) {
    Py_ssize_t end = total - CRC_RESERVED;
    uint32_t c = vf_crc32(rec, end) & 0x7FFFFFFFu;
    unsigned char *t = rec + end;
    memcpy(t, "__CRC32#\x01", 9);
    for (int k = 0; k < 10; k++) {  /* least-significant digit first, '0'-padded */
        t[9 + k] = (unsigned char)('0' + c % 10);
        c /= 10;
    }
    t[19] = 2;
}

/* ---------------------------------------------------------------------------------------------- */
/* Message fields, read through the slots of the dataclass (offsets looked up once, by name)        */
enum {
    F_TOPIC, F_BODY, F_TAGS, F_KEYS, F_QUEUE_ID, F_FLAG, F_PROPERTIES, F_SYS_FLAG, F_BORN_TIMESTAMP,
    F_BORN_HOST, F_RECONSUME_TIMES, F_PREPARED_TX, F_PROPERTIES_STRING, F_UNIQ_KEY, F_FORCE_V2, F_COUNT
};
static const char *field_names[F_COUNT] = {
    "topic", "body", "tags", "keys", "queue_id", "flag", "properties", "sys_flag", "born_timestamp",
    "born_host", "reconsume_times", "prepared_transaction_offset", "properties_string", "uniq_key",
    "force_v2",
};
static PyTypeObject *message_type = NULL;
static Py_ssize_t field_offsets[F_COUNT];

static inline PyObject *field(PyObject *m, int f) { /* borrowed; NULL when unset */
    return *(PyObject **)((char *)m + field_offsets[f]);
}

/* The byte offsets of `names`' object slots in type `tp` (its __slots__ / slots=True dataclass fields), into
 * out[]: -1 with TypeError when one is not an object slot. Every init_* below binds its type this way. */
static int slot_offsets(PyObject *tp, const char *const *names, int n, Py_ssize_t *out) {
    for (int i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttrString(tp, names[i]);
        if (d == NULL) return -1;
        if (Py_TYPE(d) != &PyMemberDescr_Type || (((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX &&
                                                  ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT)) {
            Py_DECREF(d);
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", ((PyTypeObject *)tp)->tp_name, names[i]);
            return -1;
        }
        out[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
    }
    return 0;
}

static PyObject *native_init(PyObject *self, PyObject *args) {
    PyObject *tp;
    if (!PyArg_ParseTuple(args, "O!", &PyType_Type, &tp)) return NULL;
    Py_ssize_t offs[F_COUNT];
    if (slot_offsets(tp, field_names, F_COUNT, offs) < 0) return NULL;
    memcpy(field_offsets, offs, sizeof offs);
    Py_XSETREF(message_type, (PyTypeObject *)Py_NewRef(tp));
    Py_RETURN_NONE;
}

/* an int that fits in [lo, hi], else 0 (error cleared) */
static inline int as_i64(PyObject *o, int64_t lo, int64_t hi, int64_t *out) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
    if (v < lo || v > hi) return 0;
    *out = v;
    return 1;
}

static inline int is_falsy_default(PyObject *o) { /* None, 0, False, "" or an empty container */
    if (o == Py_None || o == Py_False) return 1;
    if (o == Py_True) return 0;
    int t = PyObject_IsTrue(o);
    if (t < 0) { PyErr_Clear(); return -1; }
    return !t;
}

/* ---------------------------------------------------------------------------------------------- */
/* encode_plain_batch                                                                               */
typedef struct {
    PyObject *topic;       /* borrowed */
    PyObject *body;        /* borrowed, exact bytes */
    PyObject *keys;        /* new reference or NULL (keys as stored in the request) */
    PyObject *uniq;        /* borrowed or NULL */
    PyObject *tags;        /* borrowed or NULL (truthy str) */
    const char *topic_part; Py_ssize_t topic_part_len;
    int32_t magic, qid, flag;
    Py_ssize_t pl, total;
    int64_t q;
    int queue;             /* index into the queue cache */
} plain_rec;

typedef struct {
    PyObject *topic;  /* borrowed */
    int32_t qid;
    PyObject *qkey;   /* new reference */
    int64_t next;
} queue_slot;

/* `f"{topic}-{queue_id}"`, the key of the store's queue offset table (a new reference): the strings made
 * lately are kept (a small table by queue id), as PyUnicode_FromFormat costs ~2,000 instructions a put */
#define QKEY_CACHE 64
static struct { PyObject *topic, *qkey; int qid; } qkey_cache[QKEY_CACHE];
static PyObject *queue_key(PyObject *topic, int qid) {
    unsigned slot = (unsigned)qid % QKEY_CACHE;
    PyObject *t = qkey_cache[slot].topic;
    if (t != NULL && qkey_cache[slot].qid == qid &&
        (t == topic || (PyUnicode_GET_LENGTH(t) == PyUnicode_GET_LENGTH(topic) && PyUnicode_Compare(t, topic) == 0)))
        return Py_NewRef(qkey_cache[slot].qkey);
    PyObject *k = PyUnicode_FromFormat("%U-%d", topic, qid);
    if (k == NULL) return NULL;
    Py_XSETREF(qkey_cache[slot].topic, Py_NewRef(topic));
    Py_XSETREF(qkey_cache[slot].qkey, Py_NewRef(k));
    qkey_cache[slot].qid = qid;
    return k;
}

#define MAX_QUEUES 4096

/* ---------------------------------------------------------------------------------------------- */
/* Java String.hashCode over a str's UTF-16 code units, continuing from h; -1 for a lone surrogate  */
static inline int java_hash_append(PyObject *s, Py_ssize_t start, Py_ssize_t end, uint32_t *h) {
    int kind = PyUnicode_KIND(s);
    const void *d = PyUnicode_DATA(s);
    uint32_t x = *h;
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *c = (const Py_UCS1 *)d;
        Py_ssize_t i = start;
        /* four characters a step: x*31^4 + c0*31^3 + c1*31^2 + c2*31 + c3 (the same value, mod 2^32) */
        for (; i + 4 <= end; i += 4)
            x = 923521u * x + 29791u * c[i] + 961u * c[i + 1] + 31u * c[i + 2] + c[i + 3];
        for (; i < end; i++) x = 31u * x + c[i];
    } else if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *c = (const Py_UCS2 *)d;
        for (Py_ssize_t i = start; i < end; i++) {
            if (c[i] >= 0xD800 && c[i] <= 0xDFFF) return -1;
            x = 31u * x + c[i];
        }
    } else {
        const Py_UCS4 *c = (const Py_UCS4 *)d;
        for (Py_ssize_t i = start; i < end; i++) {
            Py_UCS4 cp = c[i];
            if (cp >= 0xD800 && cp <= 0xDFFF) return -1;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                x = 31u * x + (0xD800 + (cp >> 10));
                x = 31u * x + (0xDC00 + (cp & 0x3FF));
            } else x = 31u * x + cp;
        }
    }
    *h = x;
    return 0;
}

static inline int32_t index_hash(uint32_t h) { /* indexKeyHashMethod: abs(hashCode), MIN_VALUE -> 0 */
    int32_t s = (int32_t)h;
    if (s == INT32_MIN) return 0;
    return s < 0 ? -s : s;
}

/* java_hash(s): Java's String.hashCode of a str (signed 32-bit), as `tags.java_string_hash` computes it; None
   for a str holding a lone surrogate (the Python reference then raises as it always did). What a look-up in
   the index (`IndexService.query_offset`) and a tags code pay for each key. */
static PyObject *java_hash_py(PyObject *self, PyObject *s) {
    if (!PyUnicode_Check(s)) {
        PyErr_SetString(PyExc_TypeError, "java_hash takes a str");
        return NULL;
    }
    uint32_t h = 0;
    if (java_hash_append(s, 0, PyUnicode_GET_LENGTH(s), &h) < 0) Py_RETURN_NONE;
    return PyLong_FromLong((long)(int32_t)h);
}

typedef struct { char *p; Py_ssize_t n, cap; } growbuf;
static int gb_reserve(growbuf *b, Py_ssize_t more) {
    if (b->n + more <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + more) cap *= 2;
    char *np_ = PyMem_Realloc(b->p, cap);
    if (np_ == NULL) { PyErr_NoMemory(); return -1; }
    b->p = np_; b->cap = cap;
    return 0;
}

/* Pass 1 of encode_plain_batch for one message: checks it is plain, fills `r` (topic, body, tags, keys,
 * uniq, sizes; not the queue offset). 1: done; 0: not mine (the reference decides); -1: error set.
 * r->keys may hold a new reference either way (the caller releases it). `u_in` is the uniq key the
 * store created for it (or None), used when the message has none. */
static int plain_prepare(PyObject *m, PyObject *u_in, PyObject *topics, Py_ssize_t hsize, Py_ssize_t reserved,
                         long long max_body, long long max_record, plain_rec *r) {
    if (Py_TYPE(m) != message_type) return 0;
    PyObject *topic = field(m, F_TOPIC), *body = field(m, F_BODY);
    if (topic == NULL || body == NULL || !PyUnicode_CheckExact(topic) || !PyBytes_CheckExact(body)) return 0;
    PyObject *tp = PyDict_GetItemWithError(topics, topic);
    if (tp == NULL) { PyErr_Clear(); return 0; }
    if (!PyTuple_CheckExact(tp) || PyTuple_GET_SIZE(tp) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(tp, 0)))
        return 0;
    /* not plain: the Python reference says None (or decides otherwise) */
    PyObject *ps = field(m, F_PROPERTIES_STRING), *born_host = field(m, F_BORN_HOST);
    if (ps == NULL || ps != Py_None || born_host == NULL || born_host != Py_None) return 0;
    static const int falsy_fields[] = {F_PROPERTIES, F_BORN_TIMESTAMP, F_SYS_FLAG, F_RECONSUME_TIMES,
                                       F_PREPARED_TX, F_FORCE_V2};
    for (size_t k = 0; k < sizeof falsy_fields / sizeof falsy_fields[0]; k++) {
        PyObject *v = field(m, falsy_fields[k]);
        if (v == NULL || is_falsy_default(v) != 1) return 0;
    }
    int64_t magic, qid, flag;
    if (!as_i64(PyTuple_GET_ITEM(tp, 1), INT32_MIN, INT32_MAX, &magic)) return 0;
    PyObject *qo = field(m, F_QUEUE_ID), *fo = field(m, F_FLAG);
    if (qo == NULL || fo == NULL || !as_i64(qo, 0, INT32_MAX, &qid) || !as_i64(fo, INT32_MIN, INT32_MAX, &flag))
        return 0;
    r->topic = topic; r->body = body;
    r->topic_part = PyBytes_AS_STRING(PyTuple_GET_ITEM(tp, 0));
    r->topic_part_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(tp, 0));
    r->magic = (int32_t)magic; r->qid = (int32_t)qid; r->flag = (int32_t)flag;
    /* tags, keys, uniq: truthy strings (anything else is left to the reference) */
    Py_ssize_t pl = 0, len;
    PyObject *tags = field(m, F_TAGS);
    if (tags == NULL) return 0;
    if (tags != Py_None) {
        if (!PyUnicode_CheckExact(tags)) return 0;
        if (PyUnicode_GET_LENGTH(tags)) {
            if (PyUnicode_AsUTF8AndSize(tags, &len) == NULL) { PyErr_Clear(); return 0; }
            r->tags = tags;
            pl += 6 + len;
        }
    }
    PyObject *k = field(m, F_KEYS);
    if (k == NULL) return 0;
    if (k != Py_None) {
        if (PyUnicode_CheckExact(k)) {
            if (PyUnicode_GET_LENGTH(k)) r->keys = Py_NewRef(k);
        } else if (PyList_CheckExact(k) || PyTuple_CheckExact(k)) {
            if (PySequence_Fast_GET_SIZE(k)) {
                PyObject *sp = PyUnicode_FromStringAndSize(" ", 1);
                if (sp == NULL) return -1;
                r->keys = PyUnicode_Join(sp, k);
                Py_DECREF(sp);
                if (r->keys == NULL) { PyErr_Clear(); return 0; }
            }
        } else return 0;
        if (r->keys != NULL && PyUnicode_GET_LENGTH(r->keys)) {
            if (PyUnicode_AsUTF8AndSize(r->keys, &len) == NULL) { PyErr_Clear(); return 0; }
            pl += 6 + len;
        }
    }
    PyObject *u = field(m, F_UNIQ_KEY);
    if (u == NULL) return 0;
    if (u != Py_None && !(PyUnicode_CheckExact(u) && PyUnicode_GET_LENGTH(u) == 0)) {
        if (!PyUnicode_CheckExact(u)) return 0;
    } else {
        u = u_in;
        if (u != Py_None && !PyUnicode_CheckExact(u)) return 0;
    }
    if (u != Py_None) {
        r->uniq = u;
        if (PyUnicode_GET_LENGTH(u)) {
            if (PyUnicode_AsUTF8AndSize(u, &len) == NULL) { PyErr_Clear(); return 0; }
            pl += 10 + len;
        }
    }
    pl += reserved;  /* the properties are empty or end with 0x02: the trailer follows directly */
    Py_ssize_t bl = PyBytes_GET_SIZE(body);
    Py_ssize_t total = hsize + bl + r->topic_part_len + 2 + pl;
    if (pl > 32767 || bl > max_body || total > max_record || total > INT32_MAX) return 0;
    r->pl = pl; r->total = total;
    return 1;
}

/* Pass 2 for one record: writes its r->total bytes at `out`; returns where its properties start. */
static unsigned char *plain_write(const plain_rec *r, unsigned char *out, int64_t phys, int64_t now,
                                  const char *store_addr, Py_ssize_t addr_len, int store_port, int sys_flag,
                                  Py_ssize_t reserved) {
    unsigned char *p = out;
    const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(r->body);
    Py_ssize_t bl = PyBytes_GET_SIZE(r->body);
    put_i32(p, (int32_t)r->total); put_i32(p + 4, r->magic);
    put_i32(p + 8, (int32_t)(crc32_update(0, body, bl) & 0x7FFFFFFFu));
    put_i32(p + 12, r->qid); put_i32(p + 16, r->flag);
    put_i64(p + 20, r->q); put_i64(p + 28, phys); put_i32(p + 36, sys_flag); put_i64(p + 40, now);
    p += 48;
    memcpy(p, store_addr, addr_len); p += addr_len; put_i32(p, store_port); p += 4;
    put_i64(p, now); p += 8;
    memcpy(p, store_addr, addr_len); p += addr_len; put_i32(p, store_port); p += 4;
    put_i32(p, 0); put_i64(p + 4, 0); put_i32(p + 12, (int32_t)bl); p += 16;
    memcpy(p, body, bl); p += bl;
    memcpy(p, r->topic_part, r->topic_part_len); p += r->topic_part_len;
    put_i16(p, (int)r->pl); p += 2;
    unsigned char *props = p;
    Py_ssize_t len;
    const char *s;
    if (r->tags != NULL) {
        s = PyUnicode_AsUTF8AndSize(r->tags, &len);
        memcpy(p, "TAGS\x01", 5); memcpy(p + 5, s, len); p[5 + len] = 2; p += 6 + len;
    }
    if (r->keys != NULL && PyUnicode_GET_LENGTH(r->keys)) {
        s = PyUnicode_AsUTF8AndSize(r->keys, &len);
        memcpy(p, "KEYS\x01", 5); memcpy(p + 5, s, len); p[5 + len] = 2; p += 6 + len;
    }
    if (r->uniq != NULL && PyUnicode_GET_LENGTH(r->uniq)) {
        s = PyUnicode_AsUTF8AndSize(r->uniq, &len);
        memcpy(p, "UNIQ_KEY\x01", 9); memcpy(p + 9, s, len); p[9 + len] = 2; p += 10 + len;
    }
    if (reserved) fill_crc_trailer(out, r->total);
    return props;
}

/* The DispatchRequest of one written record: (topic, qid, phys, total, tags code, now, q, keys, uniq,
 * sysFlag, 0, props); `phys_obj` is a new reference the caller passes in (stolen). NULL on error. */
static PyObject *plain_request(const plain_rec *r, PyObject *phys_obj, const unsigned char *props, Py_ssize_t reserved,
                               PyObject *tags_cache, PyObject *tags_fn, PyTypeObject *rtype, PyObject *now_obj,
                               PyObject *sys_obj, PyObject *zero, PyObject *empty) {
    PyObject *code;
    if (r->tags != NULL) {
        code = PyDict_GetItemWithError(tags_cache, r->tags);
        if (code != NULL) Py_INCREF(code);
        else if (PyErr_Occurred()) code = NULL;
        else code = PyObject_CallOneArg(tags_fn, r->tags);
    } else code = Py_NewRef(zero);
    PyObject *ps_obj = r->pl > reserved ? PyUnicode_DecodeUTF8((const char *)props, r->pl - reserved, "strict")
                                        : Py_NewRef(empty);
    PyObject *qid_obj = PyLong_FromLong(r->qid), *total_obj = PyLong_FromSsize_t(r->total);
    PyObject *q_obj = PyLong_FromLongLong(r->q);
    PyObject *req = rtype->tp_alloc(rtype, 12);
    if (code == NULL || ps_obj == NULL || phys_obj == NULL || qid_obj == NULL || total_obj == NULL ||
        q_obj == NULL || req == NULL) {
        Py_XDECREF(code); Py_XDECREF(ps_obj); Py_XDECREF(phys_obj); Py_XDECREF(qid_obj);
        Py_XDECREF(total_obj); Py_XDECREF(q_obj); Py_XDECREF(req);
        return NULL;
    }
    PyObject *uniq = r->uniq != NULL ? r->uniq : Py_None;
    PyTuple_SET_ITEM(req, 0, Py_NewRef(r->topic));
    PyTuple_SET_ITEM(req, 1, qid_obj);
    PyTuple_SET_ITEM(req, 2, phys_obj);
    PyTuple_SET_ITEM(req, 3, total_obj);
    PyTuple_SET_ITEM(req, 4, code);
    PyTuple_SET_ITEM(req, 5, Py_NewRef(now_obj));
    PyTuple_SET_ITEM(req, 6, q_obj);
    PyTuple_SET_ITEM(req, 7, Py_NewRef(r->keys != NULL ? r->keys : Py_None));
    PyTuple_SET_ITEM(req, 8, Py_NewRef(uniq));
    PyTuple_SET_ITEM(req, 9, Py_NewRef(sys_obj));
    PyTuple_SET_ITEM(req, 10, Py_NewRef(zero));
    PyTuple_SET_ITEM(req, 11, ps_obj);
    /* str, int and None only: no reference cycle can pass through it (CPython untracks such tuples
       itself at their first collection); untracked now, the collector never walks the batch */
    PyObject_GC_UnTrack(req);
    return req;
}

static PyObject *encode_plain_batch(PyObject *self, PyObject *args) {
    PyObject *msgs, *uniq_keys, *queue_table, *topics, *tags_cache, *tags_fn, *request_type;
    long long base, now, max_body, max_record;
    const char *store_addr; Py_ssize_t addr_len;
    int store_port, sys_flag, append_crc, columns = 0;
    if (!PyArg_ParseTuple(args, "OOO!LLO!y#iiLLO!OO!p|p", &msgs, &uniq_keys, &PyDict_Type, &queue_table, &base,
                          &now, &PyDict_Type, &topics, &store_addr, &addr_len, &store_port, &sys_flag,
                          &max_body, &max_record, &PyDict_Type, &tags_cache, &tags_fn, &PyType_Type,
                          &request_type, &append_crc, &columns))
        return NULL;
    const Py_ssize_t reserved = append_crc ? CRC_RESERVED : 0;
    if (message_type == NULL) { PyErr_SetString(PyExc_RuntimeError, "_native.init() was not called"); return NULL; }
    if (addr_len != 4 && addr_len != 16) Py_RETURN_NONE;
    PyTypeObject *rtype = (PyTypeObject *)request_type;
    if (!PyType_IsSubtype(rtype, &PyTuple_Type)) { PyErr_SetString(PyExc_TypeError, "request type must be a tuple"); return NULL; }
    PyObject *seq = PySequence_Fast(msgs, "msgs must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *useq = NULL;
    if (uniq_keys != Py_None) {
        useq = PySequence_Fast(uniq_keys, "uniq_keys must be a sequence");
        if (useq == NULL) { Py_DECREF(seq); return NULL; }
        if (PySequence_Fast_GET_SIZE(useq) < n) goto decline_early;
    }
    const int v6 = addr_len == 16;
    const Py_ssize_t hsize = v6 ? 112 : 88;
    plain_rec *recs = PyMem_Calloc(n ? n : 1, sizeof(plain_rec));
    queue_slot *queues = PyMem_Malloc(sizeof(queue_slot) * 64);
    Py_ssize_t nqueues = 0, cap_queues = 64;
    PyObject *result = NULL, *data = NULL, *requests = NULL, *offsets = NULL, *uniqs = NULL, *seen = NULL;
    growbuf *qunits = NULL, hb = {0}, pb = {0}, tb = {0};  /* columns: units per queue, index entries */
    if (recs == NULL || queues == NULL) { PyErr_NoMemory(); goto done; }
    Py_ssize_t sum = 0;
    int last_queue = -1;
    int64_t first_q = -1;
    /* pass 1: check every message, compute sizes and queue offsets (nothing written) */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = items[i];
        plain_rec *r = &recs[i];
        int got = plain_prepare(m, useq != NULL ? PySequence_Fast_ITEMS(useq)[i] : Py_None, topics, hsize, reserved,
                                max_body, max_record, r);
        if (got < 0) goto fail;
        if (got == 0) goto decline;
        PyObject *topic = r->topic;
        Py_ssize_t total = r->total;
        /* queue offset: the queue table, then +1 per message of the same queue in this batch */
        int qi = -1;
        if (last_queue >= 0 && queues[last_queue].qid == r->qid &&
            (queues[last_queue].topic == topic || PyUnicode_Compare(queues[last_queue].topic, topic) == 0))
            qi = last_queue;
        else {
            for (Py_ssize_t j = 0; j < nqueues; j++)
                if (queues[j].qid == r->qid && (queues[j].topic == topic || PyUnicode_Compare(queues[j].topic, topic) == 0)) {
                    qi = (int)j;
                    break;
                }
        }
        if (qi < 0) {
            if (nqueues == MAX_QUEUES) goto decline;
            if (nqueues == cap_queues) {
                queue_slot *nq = PyMem_Realloc(queues, sizeof(queue_slot) * cap_queues * 2);
                if (nq == NULL) { PyErr_NoMemory(); goto fail; }
                queues = nq;
                cap_queues *= 2;
            }
            PyObject *qkey = queue_key(topic, (int)r->qid);
            if (qkey == NULL) goto fail;
            PyObject *cur = PyDict_GetItemWithError(queue_table, qkey);
            int64_t start = 0;
            if (cur == NULL && PyErr_Occurred()) { Py_DECREF(qkey); goto fail; }
            if (cur != NULL && !as_i64(cur, INT64_MIN, INT64_MAX - 1 - n, &start)) { Py_DECREF(qkey); goto decline; }
            queues[nqueues].topic = topic;
            queues[nqueues].qid = r->qid;
            queues[nqueues].qkey = qkey;
            queues[nqueues].next = start;
            qi = (int)nqueues++;
        }
        last_queue = qi;
        r->queue = qi;
        r->q = queues[qi].next++;
        if (first_q < 0) first_q = r->q;  /* as the reference: the first non-negative queue offset */
        sum += total;
        if (sum > PY_SSIZE_T_MAX / 2) goto decline;
    }
    if (base < 0 || base > INT64_MAX - sum) goto decline;
    /* pass 2: write the records, build the requests */
    data = PyBytes_FromStringAndSize(NULL, sum);
    requests = columns ? NULL : PyList_New(n);
    offsets = PyList_New(n);
    uniqs = PyList_New(n);
    seen = PyDict_New();
    if (data == NULL || (requests == NULL && !columns) || offsets == NULL || uniqs == NULL || seen == NULL) goto fail;
    if (columns && (qunits = PyMem_Calloc(nqueues ? nqueues : 1, sizeof(growbuf))) == NULL) { PyErr_NoMemory(); goto fail; }
    PyObject *last_topic = NULL;
    uint32_t topic_hash = 0;
    int declined = 0;
    PyObject *now_obj = PyLong_FromLongLong(now), *sys_obj = PyLong_FromLong(sys_flag), *zero = PyLong_FromLong(0);
    PyObject *empty = PyUnicode_New(0, 0);
    if (now_obj == NULL || sys_obj == NULL || zero == NULL || empty == NULL) {
        Py_XDECREF(now_obj); Py_XDECREF(sys_obj); Py_XDECREF(zero); Py_XDECREF(empty);
        goto fail;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(data);
    int64_t phys = base;
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        plain_rec *r = &recs[i];
        unsigned char *props = plain_write(r, out, phys, now, store_addr, addr_len, store_port, sys_flag, reserved);
        out += r->total;
        if (columns) {
            /* the consume-queue unit (offset, size, tags code, cq offset) into its queue's column, and the
               index entries (topic#uniq, then topic#token per KEYS token) as index_keys makes them */
            int64_t code = 0;
            if (r->tags != NULL) {
                PyObject *c = PyDict_GetItemWithError(tags_cache, r->tags);
                if (c != NULL) Py_INCREF(c);
                else if (!PyErr_Occurred()) c = PyObject_CallOneArg(tags_fn, r->tags);
                if (c == NULL) { ok = 0; break; }
                int good = as_i64(c, INT64_MIN, INT64_MAX, &code);
                Py_DECREF(c);
                if (!good) { declined = 1; break; }
            }
            growbuf *u = &qunits[r->queue];
            if (gb_reserve(u, 32) < 0) { ok = 0; break; }
            int64_t row[4] = {phys, (int64_t)r->total, code, r->q};
            memcpy(u->p + u->n, row, 32); u->n += 32;
            if (r->topic != last_topic) {
                topic_hash = 0;
                if (java_hash_append(r->topic, 0, PyUnicode_GET_LENGTH(r->topic), &topic_hash) < 0) { declined = 1; break; }
                topic_hash = 31u * topic_hash + '#';
                last_topic = r->topic;
            }
            Py_ssize_t m = 0;
            if (r->uniq != NULL) {
                uint32_t h = topic_hash;
                if (java_hash_append(r->uniq, 0, PyUnicode_GET_LENGTH(r->uniq), &h) < 0) { declined = 1; break; }
                if (gb_reserve(&hb, 4) < 0) { ok = 0; break; }
                int32_t v = index_hash(h);
                memcpy(hb.p + hb.n, &v, 4); hb.n += 4;
                m++;
            }
            if (r->keys != NULL) {
                Py_ssize_t len = PyUnicode_GET_LENGTH(r->keys), start = 0;
                int kind = PyUnicode_KIND(r->keys);
                const void *d = PyUnicode_DATA(r->keys);
                for (Py_ssize_t j = 0; j <= len && ok && !declined; j++) {
                    if (j == len || PyUnicode_READ(kind, d, j) == ' ') {
                        if (j > start) {
                            uint32_t h = topic_hash;
                            if (java_hash_append(r->keys, start, j, &h) < 0) { declined = 1; break; }
                            if (gb_reserve(&hb, 4) < 0) { ok = 0; break; }
                            int32_t v = index_hash(h);
                            memcpy(hb.p + hb.n, &v, 4); hb.n += 4;
                            m++;
                        }
                        start = j + 1;
                    }
                }
                if (!ok || declined) break;
            }
            if (m) {
                if (gb_reserve(&pb, 8 * m) < 0 || gb_reserve(&tb, 8 * m) < 0) { ok = 0; break; }
                int64_t ts = now;
                for (Py_ssize_t k = 0; k < m; k++) {
                    memcpy(pb.p + pb.n, &phys, 8); pb.n += 8;
                    memcpy(tb.p + tb.n, &ts, 8); tb.n += 8;
                }
            }
            PyObject *phys_obj = PyLong_FromLongLong(phys);
            if (phys_obj == NULL) { ok = 0; break; }
            PyList_SET_ITEM(offsets, i, phys_obj);
            PyList_SET_ITEM(uniqs, i, Py_NewRef(r->uniq != NULL ? r->uniq : Py_None));
            phys += r->total;
            continue;
        }
        PyObject *phys_obj = PyLong_FromLongLong(phys);
        if (phys_obj == NULL) { ok = 0; break; }
        PyObject *req = plain_request(r, Py_NewRef(phys_obj), props, reserved, tags_cache, tags_fn, rtype, now_obj,
                                      sys_obj, zero, empty);
        if (req == NULL) { Py_DECREF(phys_obj); ok = 0; break; }
        PyObject *uniq = r->uniq != NULL ? r->uniq : Py_None;
        PyList_SET_ITEM(requests, i, req);
        PyList_SET_ITEM(offsets, i, phys_obj);
        PyList_SET_ITEM(uniqs, i, Py_NewRef(uniq));
        phys += r->total;
    }
    Py_DECREF(now_obj); Py_DECREF(sys_obj); Py_DECREF(zero); Py_DECREF(empty);
    if (!ok) goto fail;
    if (declined) goto decline;
    for (Py_ssize_t j = 0; j < nqueues; j++) {
        PyObject *v = PyLong_FromLongLong(queues[j].next);
        if (v == NULL || PyDict_SetItem(seen, queues[j].qkey, v) < 0) { Py_XDECREF(v); goto fail; }
        Py_DECREF(v);
    }
    if (columns) {
        /* (count, [((topic, queue id), int64 units bytes)] in first-appearance order, int32 hashes bytes,
           int64 offsets bytes, int64 timestamps bytes, store timestamp) */
        PyObject *units = PyList_New(nqueues);
        if (units == NULL) goto fail;
        for (Py_ssize_t j = 0; j < nqueues; j++) {
            PyObject *item = Py_BuildValue("((Oi)y#)", queues[j].topic, (int)queues[j].qid,
                                           qunits[j].p ? qunits[j].p : "", qunits[j].n);
            if (item == NULL) { Py_DECREF(units); goto fail; }
            PyList_SET_ITEM(units, j, item);
        }
        requests = Py_BuildValue("(nNy#y#y#L)", n, units, hb.p ? hb.p : "", hb.n, pb.p ? pb.p : "", pb.n,
                                 tb.p ? tb.p : "", tb.n, (long long)now);
        if (requests == NULL) goto fail;
    }
    result = Py_BuildValue("(NNNNNL)", data, requests, offsets, uniqs, seen, (long long)first_q);
    data = requests = offsets = uniqs = seen = NULL;
    goto done;
decline:
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    Py_XDECREF(data); Py_XDECREF(requests); Py_XDECREF(offsets); Py_XDECREF(uniqs); Py_XDECREF(seen);
    if (recs != NULL)
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(recs[i].keys);
    if (queues != NULL)
        for (Py_ssize_t j = 0; j < nqueues; j++) Py_DECREF(queues[j].qkey);
    if (qunits != NULL)
        for (Py_ssize_t j = 0; j < nqueues; j++) PyMem_Free(qunits[j].p);
    PyMem_Free(qunits); PyMem_Free(hb.p); PyMem_Free(pb.p); PyMem_Free(tb.p);
    PyMem_Free(recs);
    PyMem_Free(queues);
    Py_XDECREF(useq);
    Py_DECREF(seq);
    return result;
decline_early:
    Py_XDECREF(useq);
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

/* encode_plain_one(msg, uniq, q, base, now, ctx[, dst, pos, limit]): encode_plain_batch for one message whose
 * queue offset `q` the caller looked up: (record bytes, DispatchRequest) or None (the batch path / reference
 * decides); with dst/pos/limit the record is written into the writable buffer dst at pos instead (when it
 * takes at most `limit` bytes) and (total, DispatchRequest) returned.
 * ctx = (topics, store addr, store port, sysFlag, max body, max record, tags cache, tags fn, request type,
 * append_crc), bound once per encoder: a single put pays for no batch bookkeeping. */
static PyObject *encode_plain_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 && nargs != 9) { PyErr_SetString(PyExc_TypeError, "encode_plain_one takes 6 or 9 arguments"); return NULL; }
    if (message_type == NULL) { PyErr_SetString(PyExc_RuntimeError, "_native.init() was not called"); return NULL; }
    PyObject *msg = args[0], *u = args[1], *ctx = args[5];
    int64_t q, base, now, max_body, max_record, port, sys_flag;
    if (!PyTuple_CheckExact(ctx) || PyTuple_GET_SIZE(ctx) != 10) {
        PyErr_SetString(PyExc_TypeError, "ctx must be a 10-tuple");
        return NULL;
    }
    PyObject *topics = PyTuple_GET_ITEM(ctx, 0), *addr = PyTuple_GET_ITEM(ctx, 1);
    PyObject *tags_cache = PyTuple_GET_ITEM(ctx, 6), *tags_fn = PyTuple_GET_ITEM(ctx, 7);
    PyObject *rt = PyTuple_GET_ITEM(ctx, 8);
    if (!PyDict_CheckExact(topics) || !PyBytes_CheckExact(addr) || !PyDict_CheckExact(tags_cache) ||
        !PyType_Check(rt) || !PyType_IsSubtype((PyTypeObject *)rt, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "bad ctx");
        return NULL;
    }
    if (!as_i64(PyTuple_GET_ITEM(ctx, 2), 0, INT32_MAX, &port) || !as_i64(PyTuple_GET_ITEM(ctx, 3), 0, INT32_MAX, &sys_flag) ||
        !as_i64(PyTuple_GET_ITEM(ctx, 4), 0, INT64_MAX, &max_body) ||
        !as_i64(PyTuple_GET_ITEM(ctx, 5), 0, INT64_MAX, &max_record))
        Py_RETURN_NONE;
    if (!as_i64(args[2], 0, INT64_MAX - 1, &q) || !as_i64(args[3], 0, INT64_MAX, &base) ||
        !as_i64(args[4], INT64_MIN, INT64_MAX, &now))
        Py_RETURN_NONE;
    Py_ssize_t addr_len = PyBytes_GET_SIZE(addr);
    if (addr_len != 4 && addr_len != 16) Py_RETURN_NONE;
    const Py_ssize_t reserved = PyObject_IsTrue(PyTuple_GET_ITEM(ctx, 9)) == 1 ? CRC_RESERVED : 0;
    const Py_ssize_t hsize = addr_len == 16 ? 112 : 88;
    plain_rec r;
    memset(&r, 0, sizeof r);
    PyObject *result = NULL;
    int got = plain_prepare(msg, u, topics, hsize, reserved, max_body, max_record, &r);
    if (got <= 0 || base > INT64_MAX - r.total) {
        Py_XDECREF(r.keys);
        if (got < 0) return NULL;
        Py_RETURN_NONE;
    }
    r.q = q;
    if (nargs == 9) {
        /* (dst, pos, limit): written in place at dst[pos:] when it takes at most `limit` bytes (the
           caller's room): (total, request); None, nothing written, when it does not fit */
        int64_t pos, limit;
        if (!as_i64(args[7], 0, PY_SSIZE_T_MAX, &pos) || !as_i64(args[8], 0, PY_SSIZE_T_MAX, &limit)) {
            Py_XDECREF(r.keys);
            Py_RETURN_NONE;
        }
        Py_buffer dst;
        if (PyObject_GetBuffer(args[6], &dst, PyBUF_WRITABLE) < 0) { Py_XDECREF(r.keys); return NULL; }
        if (r.total > limit || pos > dst.len || r.total > dst.len - pos) {
            PyBuffer_Release(&dst);
            Py_XDECREF(r.keys);
            Py_RETURN_NONE;
        }
        PyObject *now_obj = PyLong_FromLongLong(now), *sys_obj = PyLong_FromLongLong(sys_flag), *zero = PyLong_FromLong(0);
        PyObject *empty = PyUnicode_New(0, 0), *phys_obj = PyLong_FromLongLong(base);
        if (now_obj != NULL && sys_obj != NULL && zero != NULL && empty != NULL && phys_obj != NULL) {
            unsigned char *props = plain_write(&r, (unsigned char *)dst.buf + pos, base, now, PyBytes_AS_STRING(addr),
                                               addr_len, (int)port, (int)sys_flag, reserved);
            PyObject *req = plain_request(&r, phys_obj, props, reserved, tags_cache, tags_fn, (PyTypeObject *)rt,
                                          now_obj, sys_obj, zero, empty);
            phys_obj = NULL;  /* stolen */
            if (req != NULL) result = Py_BuildValue("(nN)", r.total, req);
        }
        PyBuffer_Release(&dst);
        Py_XDECREF(phys_obj); Py_XDECREF(now_obj); Py_XDECREF(sys_obj); Py_XDECREF(zero); Py_XDECREF(empty);
        Py_XDECREF(r.keys);
        return result;
    }
    PyObject *data = PyBytes_FromStringAndSize(NULL, r.total);
    PyObject *now_obj = PyLong_FromLongLong(now), *sys_obj = PyLong_FromLongLong(sys_flag), *zero = PyLong_FromLong(0);
    PyObject *empty = PyUnicode_New(0, 0), *phys_obj = PyLong_FromLongLong(base);
    if (data != NULL && now_obj != NULL && sys_obj != NULL && zero != NULL && empty != NULL && phys_obj != NULL) {
        unsigned char *props = plain_write(&r, (unsigned char *)PyBytes_AS_STRING(data), base, now,
                                           PyBytes_AS_STRING(addr), addr_len, (int)port, (int)sys_flag, reserved);
        PyObject *req = plain_request(&r, phys_obj, props, reserved, tags_cache, tags_fn, (PyTypeObject *)rt, now_obj,
                                      sys_obj, zero, empty);
        phys_obj = NULL;  /* stolen */
        if (req != NULL) {
            result = PyTuple_Pack(2, data, req);
            Py_DECREF(req);
        }
    }
    Py_XDECREF(phys_obj); Py_XDECREF(data); Py_XDECREF(now_obj); Py_XDECREF(sys_obj); Py_XDECREF(zero);
    Py_XDECREF(empty); Py_XDECREF(r.keys);
    return result;
}

/* ---------------------------------------------------------------------------------------------- */
/* encode_network_batch                                                                             */
typedef struct {
    PyObject *topic, *body, *ps;             /* borrowed */
    const char *pu; Py_ssize_t pl;           /* UTF-8 of ps (cached in the str) */
    Py_ssize_t plen;                         /* PROPLEN: pl, + a 0x02 and the trailer with append_crc */
    Py_ssize_t tags_at, tags_len, keys_at, keys_len, uniq_at, uniq_len;  /* -1: absent */
    const char *topic_part; Py_ssize_t topic_part_len;
    char born_addr[16]; Py_ssize_t born_len; int32_t born_port;
    int32_t magic, qid, flag, sys_flag, reconsume;
    int64_t born_ts, ptx, q;
    Py_ssize_t total, hsize;
} net_rec;

/* the encoder's network context (the arguments after `now`), parsed; its objects borrowed from the tuple */
typedef struct {
    PyObject *topics, *tags_cache, *tags_fn, *request_type, *parse_host, *schedule_topic;
    const char *store_addr; Py_ssize_t addr_len;
    int store_port, append_crc;
    long long max_body, max_record;
} net_ctx;

#define NET_CTX_FORMAT "O!y#iLLO!OO!OUp"
#define NET_CTX_ARGS(c) &PyDict_Type, &(c)->topics, &(c)->store_addr, &(c)->addr_len, &(c)->store_port, \
    &(c)->max_body, &(c)->max_record, &PyDict_Type, &(c)->tags_cache, &(c)->tags_fn, &PyType_Type,     \
    &(c)->request_type, &(c)->parse_host, &(c)->schedule_topic, &(c)->append_crc

static PyObject *encode_network_run(PyObject *msgs, PyObject *queue_table, long long base, long long now,
                                    const net_ctx *ctx);

static PyObject *encode_network_batch(PyObject *self, PyObject *args) {
    PyObject *msgs, *queue_table;
    long long base, now;
    net_ctx c;
    if (!PyArg_ParseTuple(args, "OO!LL" NET_CTX_FORMAT, &msgs, &PyDict_Type, &queue_table, &base, &now,
                          NET_CTX_ARGS(&c)))
        return NULL;
    return encode_network_run(msgs, queue_table, base, now, &c);
}

/* append_one_net's context tuple parsed as encode_network_batch parses it; the last one parsed is kept
 * (with a reference: the pointers into it stay valid), as the encoder hands the same tuple every put */
static PyObject *net_ctx_tuple = NULL;
static net_ctx net_ctx_parsed;
static int net_ctx_of(PyObject *tuple, net_ctx *out) {
    if (tuple != net_ctx_tuple) {
        net_ctx c;
        if (!PyArg_ParseTuple(tuple, NET_CTX_FORMAT, NET_CTX_ARGS(&c))) return -1;
        Py_XSETREF(net_ctx_tuple, Py_NewRef(tuple));
        net_ctx_parsed = c;
    }
    *out = net_ctx_parsed;
    return 0;
}

/* parse_host(born) with a one-entry cache keyed by the str object and the function (a pure function of the
 * str: the host of the messages of one producer is one str) */
static PyObject *net_born_fn, *net_born_key, *net_born_val;  /* strong: parse_host, the str, its (addr, port) */

static PyObject *net_parse_host(PyObject *fn, PyObject *born) {  /* a new reference, NULL with an error set */
    if (born == net_born_key && fn == net_born_fn) return Py_NewRef(net_born_val);
    PyObject *h = PyObject_CallOneArg(fn, born);
    if (h == NULL) return NULL;
    /* the three swapped before any old one is released (a release may run Python code, another thread) */
    PyObject *ofn = net_born_fn, *okey = net_born_key, *oval = net_born_val;
    net_born_fn = Py_NewRef(fn);
    net_born_key = Py_NewRef(born);
    net_born_val = Py_NewRef(h);
    Py_XDECREF(ofn); Py_XDECREF(okey); Py_XDECREF(oval);
    return h;
}

/* Where TAGS, KEYS and UNIQ_KEY's values lie in a properties text (UTF-8), in one forward pass over its
 * segments (a name can only start one: at 0 or after a 0x02, its value running to the next 0x02): the last
 * segment naming a property counts, as codec.string_to_properties keeps the last. -1 when one found has an
 * empty value (the record is declined to the reference), else 0. */
static int net_props(const char *u, Py_ssize_t n, net_rec *r) {
    r->tags_at = r->keys_at = r->uniq_at = -1;
    r->tags_len = r->keys_len = r->uniq_len = 0;
    Py_ssize_t s = 0;
    for (;;) {
        const char *e = memchr(u + s, 2, (size_t)(n - s));
        Py_ssize_t end = e != NULL ? e - u : n, sl = end - s;
        const char *p = u + s;
        if (sl >= 5 && p[4] == 1 && memcmp(p, "TAGS", 4) == 0) { r->tags_at = s + 5; r->tags_len = sl - 5; }
        else if (sl >= 5 && p[4] == 1 && memcmp(p, "KEYS", 4) == 0) { r->keys_at = s + 5; r->keys_len = sl - 5; }
        else if (sl >= 9 && p[8] == 1 && memcmp(p, "UNIQ_KEY", 8) == 0) { r->uniq_at = s + 9; r->uniq_len = sl - 9; }
        if (e == NULL) break;
        s = end + 1;
    }
    if ((r->tags_at >= 0 && r->tags_len == 0) || (r->keys_at >= 0 && r->keys_len == 0) ||
        (r->uniq_at >= 0 && r->uniq_len == 0))
        return -1;
    return 0;
}

/* One message's checks and record fields for a network record, in encode_network_run's order (the record's
 * size included, in r->total): 1 read, 0 declined (nothing to raise: an error met is cleared). */
static int net_read(PyObject *m, const net_ctx *ctx, int64_t now, net_rec *r) {
    const Py_ssize_t addr_len = ctx->addr_len, reserved = ctx->append_crc ? CRC_RESERVED : 0;
    const int store_v6 = addr_len == 16 ? 0x20 : 0;
    if (Py_TYPE(m) != message_type) return 0;
    PyObject *topic = field(m, F_TOPIC), *body = field(m, F_BODY), *ps = field(m, F_PROPERTIES_STRING);
    if (topic == NULL || body == NULL || ps == NULL || !PyUnicode_CheckExact(topic) ||
        !PyBytes_CheckExact(body) || !PyUnicode_CheckExact(ps))
        return 0;
    PyObject *tp = PyDict_GetItemWithError(ctx->topics, topic);
    if (tp == NULL) { PyErr_Clear(); return 0; }
    if (!PyTuple_CheckExact(tp) || PyTuple_GET_SIZE(tp) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(tp, 0)))
        return 0;
    PyObject *fv = field(m, F_FORCE_V2);
    if (fv == NULL || is_falsy_default(fv) != 1) return 0;
    int64_t v;
    PyObject *o = field(m, F_SYS_FLAG);
    if (o == NULL || !as_i64(o, INT32_MIN, INT32_MAX, &v)) return 0;
    int32_t sys_flag = (int32_t)v;
    int tx = sys_flag & 0xC;
    if (tx != 0 && tx != 0x8) return 0;
    int cmp = PyUnicode_Compare(topic, ctx->schedule_topic);
    if (cmp == -1 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
    if (cmp == 0) return 0;
    r->pu = PyUnicode_AsUTF8AndSize(ps, &r->pl);
    if (r->pu == NULL) { PyErr_Clear(); return 0; }
    if (net_props(r->pu, r->pl, r) < 0) return 0;
    if (!as_i64(PyTuple_GET_ITEM(tp, 1), INT32_MIN, INT32_MAX, &v)) return 0;
    r->magic = (int32_t)v;
    r->topic_part = PyBytes_AS_STRING(PyTuple_GET_ITEM(tp, 0));
    r->topic_part_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(tp, 0));
    PyObject *born = field(m, F_BORN_HOST);
    if (born == NULL) return 0;
    int bf = is_falsy_default(born);
    if (bf < 0) return 0;
    if (!bf) {
        if (!PyUnicode_CheckExact(born)) return 0;
        PyObject *h = net_parse_host(ctx->parse_host, born);
        if (h == NULL) { PyErr_Clear(); return 0; }
        int64_t port;
        if (!PyTuple_CheckExact(h) || PyTuple_GET_SIZE(h) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(h, 0)) ||
            (PyBytes_GET_SIZE(PyTuple_GET_ITEM(h, 0)) != 4 && PyBytes_GET_SIZE(PyTuple_GET_ITEM(h, 0)) != 16) ||
            !as_i64(PyTuple_GET_ITEM(h, 1), INT32_MIN, INT32_MAX, &port)) {
            Py_DECREF(h);
            return 0;
        }
        r->born_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(h, 0));
        memcpy(r->born_addr, PyBytes_AS_STRING(PyTuple_GET_ITEM(h, 0)), r->born_len);
        r->born_port = (int32_t)port;
        Py_DECREF(h);
    } else {
        r->born_len = addr_len;
        memcpy(r->born_addr, ctx->store_addr, addr_len);
        r->born_port = ctx->store_port;
    }
    r->sys_flag = (sys_flag & ~0x30) | store_v6 | (r->born_len == 16 ? 0x10 : 0);
    r->hsize = 72 + (r->born_len == 16 ? 20 : 8) + (store_v6 ? 20 : 8);
    int64_t qid, flag, bts, rc, ptx;
    PyObject *qo = field(m, F_QUEUE_ID), *fo = field(m, F_FLAG), *bo = field(m, F_BORN_TIMESTAMP),
             *ro = field(m, F_RECONSUME_TIMES), *po = field(m, F_PREPARED_TX);
    if (qo == NULL || fo == NULL || bo == NULL || ro == NULL || po == NULL ||
        !as_i64(qo, 0, INT32_MAX, &qid) || !as_i64(fo, INT32_MIN, INT32_MAX, &flag) ||
        !as_i64(bo, INT64_MIN, INT64_MAX, &bts) || !as_i64(ro, INT32_MIN, INT32_MAX, &rc) ||
        !as_i64(po, INT64_MIN, INT64_MAX, &ptx))
        return 0;
    r->qid = (int32_t)qid; r->flag = (int32_t)flag; r->born_ts = bts ? bts : now;
    r->reconsume = (int32_t)rc; r->ptx = ptx;
    r->topic = topic; r->body = body; r->ps = ps;
    r->plen = r->pl;
    if (reserved) {
        /* a __CRC32# already there: the general path deletes it; else a 0x02 closes the last property */
        if (r->pl >= 8 && memmem(r->pu, (size_t)r->pl, "__CRC32#", 8) != NULL) return 0;
        if (r->pl && r->pu[r->pl - 1] != 2) r->plen++;
        r->plen += reserved;
    }
    Py_ssize_t bl = PyBytes_GET_SIZE(body);
    Py_ssize_t total = r->hsize + bl + r->topic_part_len + 2 + r->plen;
    if (r->plen > 32767 || bl > ctx->max_body || total > ctx->max_record || total > INT32_MAX) return 0;
    r->total = total;
    return 1;
}

/* net_read's record at `out` (r->total bytes): queue offset r->q, physical offset `phys`, stored at `now` */
static void net_write(unsigned char *out, const net_rec *r, int64_t phys, int64_t now, const net_ctx *ctx) {
    unsigned char *p = out;
    const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(r->body);
    Py_ssize_t bl = PyBytes_GET_SIZE(r->body);
    put_i32(p, (int32_t)r->total); put_i32(p + 4, r->magic);
    put_i32(p + 8, (int32_t)(vf_crc32(body, bl) & 0x7FFFFFFFu));
    put_i32(p + 12, r->qid); put_i32(p + 16, r->flag);
    put_i64(p + 20, r->q); put_i64(p + 28, phys); put_i32(p + 36, r->sys_flag); put_i64(p + 40, r->born_ts);
    p += 48;
    memcpy(p, r->born_addr, r->born_len); p += r->born_len; put_i32(p, r->born_port); p += 4;
    put_i64(p, now); p += 8;
    memcpy(p, ctx->store_addr, ctx->addr_len); p += ctx->addr_len; put_i32(p, ctx->store_port); p += 4;
    put_i32(p, r->reconsume); put_i64(p + 4, r->ptx); put_i32(p + 12, (int32_t)bl); p += 16;
    memcpy(p, body, bl); p += bl;
    memcpy(p, r->topic_part, r->topic_part_len); p += r->topic_part_len;
    put_i16(p, (int)r->plen); p += 2;
    memcpy(p, r->pu, r->pl);
    if (ctx->append_crc) {
        if (r->plen - CRC_RESERVED > r->pl) p[r->pl] = 2;
        fill_crc_trailer(out, r->total);
    }
}

/* net_read's dispatch request (topic, qid, offset, total, tags code, store time, queue offset, keys, uniq, sys
 * flag, prepared tx offset, properties) as a `rtype` tuple: a new reference, NULL with an error set. `uniq_out`
 * (or NULL): a new reference to its uniq too. */
static PyObject *net_request(const net_rec *r, const net_ctx *ctx, PyObject *phys_obj, PyObject *now_obj,
                             PyObject **uniq_out) {
    PyTypeObject *rtype = (PyTypeObject *)ctx->request_type;
    PyObject *tags = NULL, *keys, *uniq, *code = NULL;
    if (r->tags_at >= 0) tags = PyUnicode_DecodeUTF8(r->pu + r->tags_at, r->tags_len, "strict");
    keys = r->keys_at >= 0 ? PyUnicode_DecodeUTF8(r->pu + r->keys_at, r->keys_len, "strict") : Py_NewRef(Py_None);
    uniq = r->uniq_at >= 0 ? PyUnicode_DecodeUTF8(r->pu + r->uniq_at, r->uniq_len, "strict") : Py_NewRef(Py_None);
    if (r->tags_at >= 0) {
        if (tags != NULL) {
            code = PyDict_GetItemWithError(ctx->tags_cache, tags);
            if (code != NULL) Py_INCREF(code);
            else if (!PyErr_Occurred()) code = PyObject_CallOneArg(ctx->tags_fn, tags);
        }
    } else code = PyLong_FromLong(0);
    Py_XDECREF(tags);
    PyObject *qid_obj = PyLong_FromLong(r->qid), *total_obj = PyLong_FromSsize_t(r->total);
    PyObject *q_obj = PyLong_FromLongLong(r->q), *sys_obj = PyLong_FromLong(r->sys_flag);
    PyObject *ptx_obj = PyLong_FromLongLong(r->ptx);
    PyObject *req = rtype->tp_alloc(rtype, 12);
    if (keys == NULL || uniq == NULL || code == NULL || qid_obj == NULL || total_obj == NULL || q_obj == NULL ||
        sys_obj == NULL || ptx_obj == NULL || req == NULL) {
        Py_XDECREF(keys); Py_XDECREF(uniq); Py_XDECREF(code); Py_XDECREF(qid_obj); Py_XDECREF(total_obj);
        Py_XDECREF(q_obj); Py_XDECREF(sys_obj); Py_XDECREF(ptx_obj); Py_XDECREF(req);
        return NULL;
    }
    if (uniq_out != NULL) *uniq_out = Py_NewRef(uniq);
    PyTuple_SET_ITEM(req, 0, Py_NewRef(r->topic));
    PyTuple_SET_ITEM(req, 1, qid_obj);
    PyTuple_SET_ITEM(req, 2, Py_NewRef(phys_obj));
    PyTuple_SET_ITEM(req, 3, total_obj);
    PyTuple_SET_ITEM(req, 4, code);
    PyTuple_SET_ITEM(req, 5, Py_NewRef(now_obj));
    PyTuple_SET_ITEM(req, 6, q_obj);
    PyTuple_SET_ITEM(req, 7, keys);
    PyTuple_SET_ITEM(req, 8, uniq);
    PyTuple_SET_ITEM(req, 9, sys_obj);
    PyTuple_SET_ITEM(req, 10, ptx_obj);
    PyTuple_SET_ITEM(req, 11, Py_NewRef(r->ps));
    PyObject_GC_UnTrack(req);  /* str, int and None only (see encode_plain_batch) */
    return req;
}

static PyObject *encode_network_run(PyObject *msgs, PyObject *queue_table, long long base, long long now,
                                    const net_ctx *ctx) {
    PyObject *request_type = ctx->request_type;
    Py_ssize_t addr_len = ctx->addr_len;
    if (message_type == NULL) { PyErr_SetString(PyExc_RuntimeError, "_native.init() was not called"); return NULL; }
    if (addr_len != 4 && addr_len != 16) Py_RETURN_NONE;
    PyTypeObject *rtype = (PyTypeObject *)request_type;
    if (!PyType_IsSubtype(rtype, &PyTuple_Type)) { PyErr_SetString(PyExc_TypeError, "request type must be a tuple"); return NULL; }
    PyObject *seq = PySequence_Fast(msgs, "msgs must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    net_rec *recs = PyMem_Calloc(n ? n : 1, sizeof(net_rec));
    queue_slot *queues = PyMem_Malloc(sizeof(queue_slot) * 64);
    Py_ssize_t nqueues = 0, cap_queues = 64;
    PyObject *result = NULL, *data = NULL, *requests = NULL, *offsets = NULL, *uniqs = NULL, *seen = NULL;
    if (recs == NULL || queues == NULL) { PyErr_NoMemory(); goto fail; }
    Py_ssize_t sum = 0;
    int last_queue = -1;
    int64_t first_q = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = items[i];
        net_rec *r = &recs[i];
        if (!net_read(m, ctx, now, r)) goto decline;
        PyObject *topic = r->topic;
        int qi = -1;
        if (last_queue >= 0 && queues[last_queue].qid == r->qid &&
            (queues[last_queue].topic == topic || PyUnicode_Compare(queues[last_queue].topic, topic) == 0))
            qi = last_queue;
        else
            for (Py_ssize_t j = 0; j < nqueues; j++)
                if (queues[j].qid == r->qid && (queues[j].topic == topic || PyUnicode_Compare(queues[j].topic, topic) == 0)) {
                    qi = (int)j;
                    break;
                }
        if (qi < 0) {
            if (nqueues == MAX_QUEUES) goto decline;
            if (nqueues == cap_queues) {
                queue_slot *nq = PyMem_Realloc(queues, sizeof(queue_slot) * cap_queues * 2);
                if (nq == NULL) { PyErr_NoMemory(); goto fail; }
                queues = nq;
                cap_queues *= 2;
            }
            PyObject *qkey = queue_key(topic, (int)r->qid);
            if (qkey == NULL) goto fail;
            PyObject *cur = PyDict_GetItemWithError(queue_table, qkey);
            int64_t start = 0;
            if (cur == NULL && PyErr_Occurred()) { Py_DECREF(qkey); goto fail; }
            if (cur != NULL && !as_i64(cur, INT64_MIN, INT64_MAX - 1 - n, &start)) { Py_DECREF(qkey); goto decline; }
            queues[nqueues].topic = topic;
            queues[nqueues].qid = r->qid;
            queues[nqueues].qkey = qkey;
            queues[nqueues].next = start;
            qi = (int)nqueues++;
        }
        last_queue = qi;
        r->q = queues[qi].next++;
        if (first_q < 0) first_q = r->q;
        sum += r->total;
        if (sum > PY_SSIZE_T_MAX / 2) goto decline;
    }
    if (base < 0 || base > INT64_MAX - sum) goto decline;
    data = PyBytes_FromStringAndSize(NULL, sum);
    requests = PyList_New(n);
    offsets = PyList_New(n);
    uniqs = PyList_New(n);
    seen = PyDict_New();
    if (data == NULL || requests == NULL || offsets == NULL || uniqs == NULL || seen == NULL) goto fail;
    PyObject *now_obj = PyLong_FromLongLong(now);
    if (now_obj == NULL) goto fail;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(data);
    int64_t phys = base;
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        net_rec *r = &recs[i];
        net_write(out, r, phys, now, ctx);
        out += r->total;
        PyObject *phys_obj = PyLong_FromLongLong(phys), *uniq = NULL;
        PyObject *req = phys_obj != NULL ? net_request(r, ctx, phys_obj, now_obj, &uniq) : NULL;
        if (req == NULL) {
            Py_XDECREF(phys_obj);
            ok = 0;
            break;
        }
        PyList_SET_ITEM(requests, i, req);
        PyList_SET_ITEM(offsets, i, phys_obj);
        PyList_SET_ITEM(uniqs, i, uniq);
        phys += r->total;
    }
    Py_DECREF(now_obj);
    if (!ok) {
        /* a strict UTF-8 decode of a slice cannot fail where the whole string encoded; anything else is real */
        goto fail;
    }
    for (Py_ssize_t j = 0; j < nqueues; j++) {
        PyObject *v = PyLong_FromLongLong(queues[j].next);
        if (v == NULL || PyDict_SetItem(seen, queues[j].qkey, v) < 0) { Py_XDECREF(v); goto fail; }
        Py_DECREF(v);
    }
    result = Py_BuildValue("(NNNNNL)", data, requests, offsets, uniqs, seen, (long long)first_q);
    data = requests = offsets = uniqs = seen = NULL;
    goto done;
decline:
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    Py_XDECREF(data); Py_XDECREF(requests); Py_XDECREF(offsets); Py_XDECREF(uniqs); Py_XDECREF(seen);
    if (queues != NULL)
        for (Py_ssize_t j = 0; j < nqueues; j++) Py_DECREF(queues[j].qkey);
    PyMem_Free(recs);
    PyMem_Free(queues);
    Py_DECREF(seq);
    return result;
}

/* index_keys(requests, end_phy, rollback_type) -> (hashes int32 bytes, phy int64 bytes, ts int64 bytes) or None */
static PyObject *index_keys(PyObject *self, PyObject *args) {
    PyObject *requests;
    long long end_phy;
    int rollback;
    if (!PyArg_ParseTuple(args, "OLi", &requests, &end_phy, &rollback)) return NULL;
    PyObject *seq = PySequence_Fast(requests, "requests must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    growbuf hb = {0}, pb = {0}, tb = {0};
    PyObject *result = NULL;
    PyObject *last_topic = NULL;
    uint32_t topic_hash = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = items[i];
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 12) goto decline;
        PyObject *topic = PyTuple_GET_ITEM(r, 0), *keys = PyTuple_GET_ITEM(r, 7), *uniq = PyTuple_GET_ITEM(r, 8);
        int64_t off, ts, sys_flag;
        if (!as_i64(PyTuple_GET_ITEM(r, 2), INT64_MIN, INT64_MAX, &off) ||
            !as_i64(PyTuple_GET_ITEM(r, 5), INT64_MIN, INT64_MAX, &ts) ||
            !as_i64(PyTuple_GET_ITEM(r, 9), INT64_MIN, INT64_MAX, &sys_flag))
            goto decline;
        if (off < end_phy || (sys_flag & rollback) == rollback) continue;
        if (!PyUnicode_CheckExact(topic)) goto decline;
        if (topic != last_topic) {
            topic_hash = 0;
            if (java_hash_append(topic, 0, PyUnicode_GET_LENGTH(topic), &topic_hash) < 0) goto decline;
            topic_hash = 31u * topic_hash + '#';
            last_topic = topic;
        }
        Py_ssize_t m = 0;
        if (uniq != Py_None) {
            if (!PyUnicode_CheckExact(uniq)) goto decline;
            uint32_t h = topic_hash;
            if (java_hash_append(uniq, 0, PyUnicode_GET_LENGTH(uniq), &h) < 0) goto decline;
            if (gb_reserve(&hb, 4) < 0) goto fail;
            int32_t v = index_hash(h);
            memcpy(hb.p + hb.n, &v, 4); hb.n += 4;
            m++;
        }
        if (keys != Py_None) {
            if (!PyUnicode_CheckExact(keys)) goto decline;
            Py_ssize_t len = PyUnicode_GET_LENGTH(keys), start = 0;
            int kind = PyUnicode_KIND(keys);
            const void *d = PyUnicode_DATA(keys);
            for (Py_ssize_t j = 0; j <= len; j++) {
                if (kind == PyUnicode_1BYTE_KIND && j < len) {  /* to the next space (or the end) at once */
                    const void *sp = memchr((const char *)d + j, ' ', (size_t)(len - j));
                    j = sp != NULL ? (Py_ssize_t)((const char *)sp - (const char *)d) : len;
                }
                if (j == len || PyUnicode_READ(kind, d, j) == ' ') {
                    if (j > start) {
                        uint32_t h = topic_hash;
                        if (java_hash_append(keys, start, j, &h) < 0) goto decline;
                        if (gb_reserve(&hb, 4) < 0) goto fail;
                        int32_t v = index_hash(h);
                        memcpy(hb.p + hb.n, &v, 4); hb.n += 4;
                        m++;
                    }
                    start = j + 1;
                }
            }
        }
        if (m) {
            if (gb_reserve(&pb, 8 * m) < 0 || gb_reserve(&tb, 8 * m) < 0) goto fail;
            for (Py_ssize_t k = 0; k < m; k++) {
                memcpy(pb.p + pb.n, &off, 8); pb.n += 8;
                memcpy(tb.p + tb.n, &ts, 8); tb.n += 8;
            }
            end_phy = off;
        }
    }
    result = Py_BuildValue("(y#y#y#)", hb.p ? hb.p : "", hb.n, pb.p ? pb.p : "", pb.n, tb.p ? tb.p : "", tb.n);
    goto done;
decline:
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    PyMem_Free(hb.p); PyMem_Free(pb.p); PyMem_Free(tb.p);
    Py_DECREF(seq);
    return result;
}

/* group_units(requests, prepared_flag) -> [((topic, qid), units int64 bytes (offset, size, tags, cq)), ...] */
static PyObject *group_units(PyObject *self, PyObject *args) {
    PyObject *requests;
    int prepared;
    if (!PyArg_ParseTuple(args, "Oi", &requests, &prepared)) return NULL;
    PyObject *seq = PySequence_Fast(requests, "requests must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    typedef struct { PyObject *topic; int64_t qid; growbuf b; } group;
    Py_ssize_t ng = 0, cap = 16;
    group *groups = PyMem_Calloc(cap, sizeof(group));
    PyObject *result = NULL;
    if (groups == NULL) { Py_DECREF(seq); return PyErr_NoMemory(); }
    Py_ssize_t last = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = items[i];
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 12) goto decline;
        int64_t v[4], qid, sys_flag;
        if (!as_i64(PyTuple_GET_ITEM(r, 9), INT64_MIN, INT64_MAX, &sys_flag)) goto decline;
        if (sys_flag & prepared) continue;
        PyObject *topic = PyTuple_GET_ITEM(r, 0);
        if (!PyUnicode_CheckExact(topic) ||
            !as_i64(PyTuple_GET_ITEM(r, 1), INT64_MIN, INT64_MAX, &qid) ||
            !as_i64(PyTuple_GET_ITEM(r, 2), INT64_MIN, INT64_MAX, &v[0]) ||
            !as_i64(PyTuple_GET_ITEM(r, 3), INT64_MIN, INT64_MAX, &v[1]) ||
            !as_i64(PyTuple_GET_ITEM(r, 4), INT64_MIN, INT64_MAX, &v[2]) ||
            !as_i64(PyTuple_GET_ITEM(r, 6), INT64_MIN, INT64_MAX, &v[3]))
            goto decline;
        Py_ssize_t g = -1;
        if (last >= 0 && groups[last].qid == qid &&
            (groups[last].topic == topic || PyUnicode_Compare(groups[last].topic, topic) == 0))
            g = last;
        else
            for (Py_ssize_t j = 0; j < ng; j++)
                if (groups[j].qid == qid && (groups[j].topic == topic || PyUnicode_Compare(groups[j].topic, topic) == 0)) {
                    g = j;
                    break;
                }
        if (g < 0) {
            if (ng == cap) {
                group *ngp = PyMem_Realloc(groups, sizeof(group) * cap * 2);
                if (ngp == NULL) { PyErr_NoMemory(); goto fail; }
                memset(ngp + cap, 0, sizeof(group) * cap);
                groups = ngp;
                cap *= 2;
            }
            groups[ng].topic = topic;
            groups[ng].qid = qid;
            g = ng++;
        }
        last = g;
        if (gb_reserve(&groups[g].b, 32) < 0) goto fail;
        memcpy(groups[g].b.p + groups[g].b.n, v, 32);
        groups[g].b.n += 32;
    }
    result = PyList_New(ng);
    if (result == NULL) goto fail;
    for (Py_ssize_t j = 0; j < ng; j++) {
        PyObject *item = Py_BuildValue("((OL)y#)", groups[j].topic, (long long)groups[j].qid, groups[j].b.p,
                                       groups[j].b.n);
        if (item == NULL) { Py_CLEAR(result); goto fail; }
        PyList_SET_ITEM(result, j, item);
    }
    goto done;
decline:
    result = Py_NewRef(Py_None);
    goto done;
fail:
    result = NULL;
done:
    for (Py_ssize_t j = 0; j < ng; j++) PyMem_Free(groups[j].b.p);
    PyMem_Free(groups);
    Py_DECREF(seq);
    return result;
}

/* format_ids(head, c0, k) -> [head + "%04X" % ((c0 + i) & 0xFFFF) for i in range(k)]  (UNIQ_KEY ids) */
static PyObject *format_ids(PyObject *self, PyObject *args) {
    PyObject *head;
    long c0;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "Uln", &head, &c0, &k)) return NULL;
    if (!PyUnicode_IS_ASCII(head) || k < 0) Py_RETURN_NONE;
    Py_ssize_t hl = PyUnicode_GET_LENGTH(head);
    const char *h = (const char *)PyUnicode_1BYTE_DATA(head);
    PyObject *out = PyList_New(k);
    if (out == NULL) return NULL;
    static const char hex[] = "0123456789ABCDEF";
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *s = PyUnicode_New(hl + 4, 127);
        if (s == NULL) { Py_DECREF(out); return NULL; }
        char *d = (char *)PyUnicode_1BYTE_DATA(s);
        memcpy(d, h, hl);
        unsigned c = (unsigned)((c0 + i) & 0xFFFF);
        d[hl] = hex[c >> 12]; d[hl + 1] = hex[(c >> 8) & 15]; d[hl + 2] = hex[(c >> 4) & 15]; d[hl + 3] = hex[c & 15];
        PyList_SET_ITEM(out, i, s);
    }
    return out;
}

/* cq_pack(units int64 (n, 4) bytes, expect_q, prev_end) -> (20-byte units, last end) or None
 * ConsumeQueue._put_small_in_order's check and pack: every unit's queue offset must be the next one and its
 * record must end past the one before (else None: the general path decides). */
static PyObject *cq_pack(PyObject *self, PyObject *args) {
    Py_buffer ub;
    long long expect_q, prev_end;
    if (!PyArg_ParseTuple(args, "y*LL", &ub, &expect_q, &prev_end)) return NULL;
    Py_ssize_t n = ub.len / 32;
    PyObject *out = NULL;
    if (ub.len != n * 32) { PyErr_SetString(PyExc_ValueError, "units must be rows of 4 int64"); goto done; }
    out = PyBytes_FromStringAndSize(NULL, n * 20);
    if (out == NULL) goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    const unsigned char *u = ub.buf;
    for (Py_ssize_t i = 0; i < n; i++, u += 32, p += 20) {
        int64_t v[4];
        memcpy(v, u, 32);
        if (v[1] < INT32_MIN || v[1] > INT32_MAX || (v[1] > 0 && v[0] > INT64_MAX - v[1]) ||
            (v[1] < 0 && v[0] < INT64_MIN - v[1])) {  /* the reference's struct.pack / int math decides */
            Py_CLEAR(out);
            out = Py_NewRef(Py_None);
            goto done;
        }
        int64_t end = v[0] + v[1];
        if (v[3] != expect_q || end <= prev_end) {
            Py_CLEAR(out);
            out = Py_NewRef(Py_None);
            goto done;
        }
        put_i64(p, v[0]); put_i32(p + 8, (int32_t)v[1]); put_i64(p + 12, v[2]);
        prev_end = end;
        expect_q++;
    }
    out = Py_BuildValue("(NL)", out, prev_end);
done:
    PyBuffer_Release(&ub);
    return out;
}

/* put_index_entries(mm, entries_base, hash_slot_num, index_num, count, begin_timestamp, hashes int32,
 *                   phy int64, ts int64) -> (written, slots newly used, begin phy offset or None, begin ts)
 * IndexFile._put_hash once per entry, in order, into the mapped file (entries and slot table; the caller
 * writes the header): the bytes putKey would leave, entry after entry. */
#define INDEX_NOGIL_MIN 256  /* entries from which put_index_entries lets other threads run meanwhile */
static PyObject *put_index_entries(PyObject *self, PyObject *args) {
    Py_buffer mm, hb, pb, tb;
    Py_ssize_t entries_base, slots, index_num, count;
    long long begin_ts;
    if (!PyArg_ParseTuple(args, "w*nnnnLy*y*y*", &mm, &entries_base, &slots, &index_num, &count, &begin_ts,
                          &hb, &pb, &tb))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = hb.len / 4;
    if (hb.len != n * 4 || pb.len != n * 8 || tb.len != n * 8 || slots <= 0 || count < 0 ||
        entries_base < 40 + slots * 4 || entries_base + index_num * 20 > mm.len) {
        PyErr_SetString(PyExc_ValueError, "put_index_entries: inconsistent sizes");
        goto out;
    }
    Py_ssize_t k = index_num - count;
    if (k > n) k = n;
    if (k < 0) k = 0;
    unsigned char *base = mm.buf;
    const int32_t *hs = hb.buf;
    const int64_t *ps = pb.buf, *ts = tb.buf;
    int64_t begin_phy = 0;
    int begin_set = 0;
    Py_ssize_t used = 0;
    for (Py_ssize_t i = 0; i < k; i++) {  /* checked first: the loop below runs without the GIL */
        int32_t h;
        memcpy(&h, hs + i, 4);
        if (h < 0) { PyErr_SetString(PyExc_ValueError, "negative key hash"); goto out; }
    }
    /* A long run of entries is written without the GIL (page faults on fresh index pages then overlap with
       the put thread); a short one (a dispatch pass of a few records) keeps it: handing the GIL over and
       taking it back costs more than the writes, and with another thread running it waits out that thread's
       switch interval. Only the dispatch thread writes the last index file; a reader (select_by_hash)
       follows a slot to its entry, so each entry is stored before its slot points at it (release fence). */
    PyThreadState *ts_save = k >= INDEX_NOGIL_MIN ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < k; i++, count++) {
        int32_t h;
        int64_t phy, t;
        memcpy(&h, hs + i, 4);
        memcpy(&phy, ps + i, 8);
        memcpy(&t, ts + i, 8);
        unsigned char *slot = base + 40 + (Py_ssize_t)(h % slots) * 4;
        int64_t sv = get_i32(slot);
        if (sv <= 0 || sv > count) sv = 0;
        int64_t td = 0;
        if (begin_ts > 0) {
            int64_t diff = (int64_t)((uint64_t)t - (uint64_t)begin_ts);  /* wraps like Java long */
            td = diff < 0 ? 0 : (diff / 1000 > INT32_MAX ? INT32_MAX : diff / 1000);
        }
        unsigned char *e = base + entries_base + count * 20;
        put_i32(e, h); put_i64(e + 4, phy); put_i32(e + 12, (int32_t)td); put_i32(e + 16, (int32_t)sv);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        put_i32(slot, (int32_t)count);
        if (count <= 1) { begin_phy = phy; begin_ts = t; begin_set = 1; }
        if (sv == 0) used++;
    }
    if (ts_save != NULL) PyEval_RestoreThread(ts_save);
    if (begin_set) result = Py_BuildValue("(nnLL)", k, used, (long long)begin_phy, begin_ts);
    else result = Py_BuildValue("(nnOL)", k, used, Py_None, begin_ts);
out:
    PyBuffer_Release(&mm); PyBuffer_Release(&hb); PyBuffer_Release(&pb); PyBuffer_Release(&tb);
    return result;
}

/* ---------------------------------------------------------------------------------------------- */
/* skim_records(buf, pos, limit, check_crc, max_records, keep, states, prop_crc=False)                  */
/*   -> (records, next_pos, state, reason), with prop_crc (records, next_pos, state, reason, undecided)   */
/* prop_crc: the trailer part of recovery.prop_crc_damage per record (a 0x02, `__CRC32#` 0x01, 10 digits,  */
/* 0x02 at the record's end, equal to the CRC of the bytes before the last 20: kept; a different CRC:     */
/* damage "__CRC32# property mismatch", the walk stops before the record). A record without that trailer  */
/* is kept and its index listed in `undecided`: the caller runs prop_crc_damage's full check on it.       */
#define MAGIC_V1 ((int32_t)0xDAA320A7)
#define MAGIC_V2 ((int32_t)0xDAA320AB)
#define MAGIC_BLANK ((int32_t)0xCBD43194)


static PyObject *skim_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, limit, max_records;
    int check_crc, keep, prop_crc = 0;
    PyObject *states;  /* (ok, blank, end, damage) strings */
    if (!PyArg_ParseTuple(args, "y*nnpnpO!|p", &view, &pos, &limit, &check_crc, &max_records, &keep,
                          &PyTuple_Type, &states, &prop_crc))
        return NULL;
    if (prop_crc && !keep) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "prop_crc needs keep");
        return NULL;
    }
    if (PyTuple_GET_SIZE(states) != 4) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "states must be 4 strings");
        return NULL;
    }
    const unsigned char *b = view.buf;
    if (limit > view.len || pos < 0) { PyBuffer_Release(&view); Py_RETURN_NONE; }  /* the reference reports it */
    PyObject *out = PyList_New(0), *undecided = prop_crc ? PyList_New(0) : NULL;
    if (out == NULL || (prop_crc && undecided == NULL)) {
        Py_XDECREF(out); Py_XDECREF(undecided); PyBuffer_Release(&view); return NULL;
    }
    Py_ssize_t count = 0;
    int state = 2; /* end */
    char reason[160] = "";
    while (pos < limit) {
        if (count >= max_records) { state = 0; break; }
        if (limit - pos < 8) { state = 2; break; }
        const unsigned char *p = b + pos;
        int32_t total = get_i32(p), magic = get_i32(p + 4);
        if (magic != MAGIC_V1 && magic != MAGIC_V2) {
            if (magic == MAGIC_BLANK) { state = 1; break; }
            if (total == 0 && magic == 0) { state = 2; break; }
            state = 3;
            snprintf(reason, sizeof reason, "illegal magic code 0x%08x", (uint32_t)magic);
            break;
        }
        Py_ssize_t rec_end = pos + (Py_ssize_t)total;
        if (total < 91 || rec_end > limit) {
            state = 3;
            if (total <= 0 || rec_end > limit)
                snprintf(reason, sizeof reason, "total size %d runs past the readable data", total);
            else
                snprintf(reason, sizeof reason, "record shorter than its header");
            break;
        }
        int32_t sys_flag = get_i32(p + 36);
        Py_ssize_t born = sys_flag & 0x10 ? 20 : 8, store = sys_flag & 0x20 ? 20 : 8;
        Py_ssize_t hsize = 72 + born + store;
        if (hsize != 88 && total < hsize + 3) { state = 3; snprintf(reason, sizeof reason, "record shorter than its header"); break; }
        uint32_t crc = (uint32_t)get_i32(p + 8);
        int32_t queue_id = get_i32(p + 12);
        int64_t queue_offset = get_i64(p + 20);
        int64_t store_ts = get_i64(p + 48 + born);
        int32_t body_len = get_i32(p + hsize - 4);
        Py_ssize_t bpos = pos + hsize, tpos = bpos + body_len;
        if (body_len < 0 || tpos > rec_end) { state = 3; snprintf(reason, sizeof reason, "body length runs past the record"); break; }
        if (check_crc && body_len) {
            uint32_t c;
            if (body_len >= 65536) {  /* the buffer stays exported: other threads may run meanwhile */
                Py_BEGIN_ALLOW_THREADS
                c = vf_crc32(b + bpos, body_len) & 0x7FFFFFFFu;
                Py_END_ALLOW_THREADS
            } else c = vf_crc32(b + bpos, body_len) & 0x7FFFFFFFu;
            if (c != crc) { state = 3; snprintf(reason, sizeof reason, "body CRC mismatch"); break; }
        }
        Py_ssize_t topic_len, fixed;
        if (magic == MAGIC_V2) {
            /* the Python reference reads the 2 bytes through struct, which fails past the buffer's end */
            if (tpos + 2 > view.len) goto decline;
            topic_len = get_i16(b + tpos);
            tpos += 2;
            fixed = 76;
        } else {
            if (tpos >= view.len) goto decline;
            topic_len = b[tpos];
            tpos += 1;
            fixed = 75;
            if (topic_len > 127) { state = 3; snprintf(reason, sizeof reason, "V1 topic length byte is negative"); break; }
        }
        Py_ssize_t ppos = tpos + topic_len;
        if (topic_len < 0 || ppos + 2 > rec_end) { state = 3; snprintf(reason, sizeof reason, "topic length runs past the record"); break; }
        Py_ssize_t prop_len = get_i16(b + ppos);
        Py_ssize_t expected = fixed + hsize - 72 + body_len + topic_len + prop_len;
        if (prop_len < 0 || expected != total) {
            state = 3;
            if (prop_len < 0 || ppos + 2 + prop_len > rec_end)
                snprintf(reason, sizeof reason, "properties length runs past the record");
            else
                snprintf(reason, sizeof reason, "total size %d != computed %zd", total, expected);
            break;
        }
        if (prop_crc) {
            const unsigned char *t = b + rec_end - 21;
            int has = total > 112 && t[0] == 2 && t[20] == 2 && memcmp(t + 1, "__CRC32#\x01", 9) == 0;
            uint64_t want = 0;
            for (int k = 19; has && k >= 10; k--) {  /* the digits, least-significant first */
                if (t[k] < '0' || t[k] > '9') has = 0;
                else want = want * 10 + (uint64_t)(t[k] - '0');
            }
            if (has) {
                uint32_t c;
                if (total >= 65536) {
                    Py_BEGIN_ALLOW_THREADS
                    c = vf_crc32(p, total - 20) & 0x7FFFFFFFu;
                    Py_END_ALLOW_THREADS
                } else c = vf_crc32(p, total - 20) & 0x7FFFFFFFu;
                if (want != c) { state = 3; snprintf(reason, sizeof reason, "__CRC32# property mismatch"); break; }
            } else {
                PyObject *ix = PyLong_FromSsize_t(count);
                if (ix == NULL || PyList_Append(undecided, ix) < 0) {
                    Py_XDECREF(ix);
                    Py_DECREF(out);
                    Py_DECREF(undecided);
                    PyBuffer_Release(&view);
                    return NULL;
                }
                Py_DECREF(ix);
            }
        }
        if (keep) {
            PyObject *t = Py_BuildValue("(nilLiLy#)", pos, (int)total, (long)queue_id, (long long)queue_offset,
                                        (int)sys_flag, (long long)store_ts, (const char *)(b + tpos), topic_len);
            if (t == NULL || PyList_Append(out, t) < 0) {
                Py_XDECREF(t);
                Py_DECREF(out);
                Py_XDECREF(undecided);
                PyBuffer_Release(&view);
                return NULL;
            }
            Py_DECREF(t);
        }
        count++;
        pos = rec_end;
    }
    PyBuffer_Release(&view);
    if (prop_crc) return Py_BuildValue("(NnOsN)", out, pos, PyTuple_GET_ITEM(states, state), reason, undecided);
    return Py_BuildValue("(NnOs)", out, pos, PyTuple_GET_ITEM(states, state), reason);
decline:  /* a read past the buffer: the reference's own error message decides */
    PyBuffer_Release(&view);
    Py_DECREF(out);
    Py_XDECREF(undecided);
    Py_RETURN_NONE;
}

/* crc32(data, value=0) -> zlib.crc32(data, value) */
static PyObject *crc32_py(PyObject *self, PyObject *args) {
    Py_buffer view;
    unsigned int value = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &view, &value)) return NULL;
    uint32_t c;
    if (view.len >= 65536) {  /* a short one keeps the GIL (see put_index_entries) */
        Py_BEGIN_ALLOW_THREADS
        c = crc32_update(value, view.buf, view.len);
        Py_END_ALLOW_THREADS
    } else c = crc32_update(value, view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

/* count_missing_uniq(msgs): how many Messages have neither a uniq key nor a properties string (those the
 * store gives a UNIQ_KEY: CommitLog._uniq_keys), or None when an item is not exactly a Message. */
static PyObject *count_missing_uniq(PyObject *self, PyObject *msgs) {
    if (message_type == NULL) { PyErr_SetString(PyExc_RuntimeError, "_native.init() was not called"); return NULL; }
    PyObject *seq = PySequence_Fast(msgs, "msgs must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), need = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *m = items[i];
        if (Py_TYPE(m) != message_type) { Py_DECREF(seq); Py_RETURN_NONE; }
        PyObject *u = field(m, F_UNIQ_KEY), *ps = field(m, F_PROPERTIES_STRING);
        if (u == NULL || ps == NULL) { Py_DECREF(seq); Py_RETURN_NONE; }
        need += u == Py_None && ps == Py_None;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(need);
}

/* copy_into(dst, pos, src): dst[pos:pos + len(src)] = src, without the GIL for 64 KiB and more (a batch
 * copied into a mapped commitlog file: first writes to fresh pages fault them in, which then overlaps with
 * the dispatch thread). The caller owns the region (the put lock); readers stop at the write position. */
static PyObject *copy_into(PyObject *self, PyObject *args) {
    Py_buffer dst, src;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "w*ny*", &dst, &pos, &src)) return NULL;
    if (pos < 0 || src.len > dst.len || pos > dst.len - src.len) {
        PyBuffer_Release(&dst); PyBuffer_Release(&src);
        PyErr_SetString(PyExc_ValueError, "copy_into: the bytes do not fit at that position");
        return NULL;
    }
    if (src.len >= 65536) {
        Py_BEGIN_ALLOW_THREADS
        memcpy((char *)dst.buf + pos, src.buf, src.len);
        Py_END_ALLOW_THREADS
    } else memcpy((char *)dst.buf + pos, src.buf, src.len);
    PyBuffer_Release(&dst); PyBuffer_Release(&src);
    Py_RETURN_NONE;
}

/* populate(buf, start, end): fault in the pages of buf[start:end] for writing ahead of the writer,
 * without the GIL (madvise MADV_POPULATE_WRITE, Linux 5.14+): the first write to a page of a fresh
 * mapped commitlog file otherwise faults it in inside the put lock (zeroing it: ~10% of a single put's
 * CPU here). Pages only, no byte is written (a put writing the same pages meanwhile is unaffected).
 * Returns the bytes populated, 0 when the kernel lacks the advice (the caller stops asking). */
#include <sys/mman.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static PyObject *populate(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "w*nn", &buf, &start, &end)) return NULL;
    if (start < 0 || end < start || end > buf.len) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "populate: the range is not inside the buffer");
        return NULL;
    }
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) page = 4096;
    uintptr_t lo = (uintptr_t)buf.buf + (uintptr_t)start, hi = (uintptr_t)buf.buf + (uintptr_t)end;
    lo &= ~(uintptr_t)(page - 1);  /* whole pages: the mapping starts on a page boundary */
    int rc = 0, err = 0;
    if (hi > lo) {
        Py_BEGIN_ALLOW_THREADS
        rc = madvise((void *)lo, (size_t)(hi - lo), MADV_POPULATE_WRITE);
        if (rc != 0) err = errno;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&buf);
    if (rc != 0) {
        if (err == EINVAL || err == ENOSYS) return PyLong_FromLong(0);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSize_t(hi > lo ? (size_t)(hi - lo) : 0);
}

/* ============================================================================================== */
/* verify (store/repair.py): the per-record and per-unit loops of `rmq-eventstore verify`.          */
/*                                                                                                  */
/* These functions only CONFIRM what is intact; anything else (a damaged record, a unit or index   */
/* entry that does not match its record, a SCHEDULE_TOPIC record, non-ASCII keys or tags, a read    */
/* past a buffer) is handed back to repair.py, which runs its pure-Python reference check on that   */
/* item alone, so the findings and their wording are the reference's by construction. Without a    */
/* live writer the walk also passes each record's consume-queue unit and index entries while the     */
/* record is at hand (one read per record); beside one, the unit and index loops read the records   */
/* again, so the body CRC here folds with PCLMULQDQ when the CPU has it (3-4x zlib's table loop);    */
/* the values are zlib's (tests compare them).                                                      */
/*                                                                                                  */
/*   verify_crc32   zlib.crc32(data) (the folding CRC; for the tests)                               */
/*   verify_scan    _verify_commit_log's walk: skim_records' checks and states, the records' count  */
/*                  and last offset per queue merged into a dict, `__CRC32#` trailers decided       */
/*   verify_units   _verify_consume_queues' unit loop over one span of a consume queue file         */
/*   verify_index   _verify_index's entry loop over a span of an index file                         */
/* ============================================================================================== */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define VF_HAVE_CLMUL 1
/* The reflected CRC-32 folding of Intel's "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ" (as in Chromium's zlib, crc32_simd.c): `len` >= 64 and a multiple of 16, `crc` and the
 * result in the inverted (running) form. */
__attribute__((target("pclmul,sse4.1")))
static uint32_t vf_crc_fold(const unsigned char *buf, Py_ssize_t len, uint32_t crc) {
    __m128i x0, x1, x2, x3, x4, x5, x6, x7, x8, y5, y6, y7, y8;
    x1 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
    x2 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
    x3 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
    x4 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
    x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)crc));
    x0 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);  /* k1, k2 */
    buf += 64;
    len -= 64;
    while (len >= 64) {
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x6 = _mm_clmulepi64_si128(x2, x0, 0x00);
        x7 = _mm_clmulepi64_si128(x3, x0, 0x00);
        x8 = _mm_clmulepi64_si128(x4, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x2 = _mm_clmulepi64_si128(x2, x0, 0x11);
        x3 = _mm_clmulepi64_si128(x3, x0, 0x11);
        x4 = _mm_clmulepi64_si128(x4, x0, 0x11);
        y5 = _mm_loadu_si128((const __m128i *)(buf + 0x00));
        y6 = _mm_loadu_si128((const __m128i *)(buf + 0x10));
        y7 = _mm_loadu_si128((const __m128i *)(buf + 0x20));
        y8 = _mm_loadu_si128((const __m128i *)(buf + 0x30));
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x5), y5);
        x2 = _mm_xor_si128(_mm_xor_si128(x2, x6), y6);
        x3 = _mm_xor_si128(_mm_xor_si128(x3, x7), y7);
        x4 = _mm_xor_si128(_mm_xor_si128(x4, x8), y8);
        buf += 64;
        len -= 64;
    }
    x0 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);  /* k3, k4 */
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x3), x5);
    x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(x1, x4), x5);
    while (len >= 16) {
        x2 = _mm_loadu_si128((const __m128i *)buf);
        x5 = _mm_clmulepi64_si128(x1, x0, 0x00);
        x1 = _mm_clmulepi64_si128(x1, x0, 0x11);
        x1 = _mm_xor_si128(_mm_xor_si128(x1, x2), x5);
        buf += 16;
        len -= 16;
    }
    /* 128 -> 64 bits */
    x2 = _mm_clmulepi64_si128(x1, x0, 0x10);
    x3 = _mm_setr_epi32(~0, 0, ~0, 0);
    x1 = _mm_srli_si128(x1, 8);
    x1 = _mm_xor_si128(x1, x2);
    x0 = _mm_set_epi64x(0, 0x0163cd6124LL);  /* k5 */
    x2 = _mm_srli_si128(x1, 4);
    x1 = _mm_and_si128(x1, x3);
    x1 = _mm_clmulepi64_si128(x1, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    /* Barrett reduction to 32 bits */
    x0 = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);  /* P(x)', u' */
    x2 = _mm_and_si128(x1, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x10);
    x2 = _mm_and_si128(x2, x3);
    x2 = _mm_clmulepi64_si128(x2, x0, 0x00);
    x1 = _mm_xor_si128(x1, x2);
    return (uint32_t)_mm_extract_epi32(x1, 1);
}
static int vf_clmul = -1;  /* -1: not probed yet */
#endif

/* zlib.crc32(p[0:n]) */
static uint32_t vf_crc32(const unsigned char *p, Py_ssize_t n) {
#ifdef VF_HAVE_CLMUL
    if (vf_clmul < 0) {
        __builtin_cpu_init();
        vf_clmul = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    }
    if (vf_clmul && n >= 64) {
        Py_ssize_t chunk = n & ~(Py_ssize_t)15;
        uint32_t c = ~vf_crc_fold(p, chunk, 0xFFFFFFFFu);
        return chunk == n ? c : crc32_update(c, p + chunk, n - chunk);
    }
#endif
    return crc32_update(0, p, n);
}

/* verify_crc32(data) -> zlib.crc32(data) */
static PyObject *verify_crc32(PyObject *self, PyObject *args) {
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "y*", &view)) return NULL;
    uint32_t c = vf_crc32(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

typedef struct {
    int32_t total, magic, queue_id, sys_flag;
    int64_t queue_offset;
    Py_ssize_t topic_pos, topic_len, props_pos, prop_len;
} vf_rec;

/* TopicValidator.RMQ_SYS_SCHEDULE_TOPIC (codec.SCHEDULE_TOPIC): its consume queue units carry a delivery
 * time where other topics' carry a tags code, so the verify loops leave its records and units to the
 * reference pass */
static const char VF_SCHEDULE_TOPIC[] = "SCHEDULE_TOPIC_XXXX";

static inline int vf_is_schedule_topic(const void *topic, Py_ssize_t len) {
    return len == (Py_ssize_t)sizeof VF_SCHEDULE_TOPIC - 1 && memcmp(topic, VF_SCHEDULE_TOPIC, (size_t)len) == 0;
}

/* skim_records' checks on the record at b[pos:] (limit: the readable end; blen: the buffer's length):
 * 0 a record (r filled), 1 BLANK, 2 end (zeroed space, or no room for a header), 3 damage (`reason`),
 * -1 a read past the buffer (the Python reference's own error message decides). */
static int vf_record(const unsigned char *b, Py_ssize_t blen, Py_ssize_t pos, Py_ssize_t limit, int check_crc,
                     vf_rec *r, char *reason, size_t rn) {
    if (limit - pos < 8) return 2;
    const unsigned char *p = b + pos;
    int32_t total = get_i32(p), magic = get_i32(p + 4);
    if (magic != MAGIC_V1 && magic != MAGIC_V2) {
        if (magic == MAGIC_BLANK) return 1;
        if (total == 0 && magic == 0) return 2;
        snprintf(reason, rn, "illegal magic code 0x%08x", (uint32_t)magic);
        return 3;
    }
    Py_ssize_t rec_end = pos + (Py_ssize_t)total;
    if (total < 91 || rec_end > limit) {
        if (total <= 0 || rec_end > limit)
            snprintf(reason, rn, "total size %d runs past the readable data", total);
        else
            snprintf(reason, rn, "record shorter than its header");
        return 3;
    }
    int32_t sys_flag = get_i32(p + 36);
    Py_ssize_t born = sys_flag & 0x10 ? 20 : 8, store = sys_flag & 0x20 ? 20 : 8;
    Py_ssize_t hsize = 72 + born + store;
    if (hsize != 88 && total < hsize + 3) { snprintf(reason, rn, "record shorter than its header"); return 3; }
    uint32_t crc = (uint32_t)get_i32(p + 8);
    int32_t body_len = get_i32(p + hsize - 4);
    Py_ssize_t bpos = pos + hsize, tpos = bpos + body_len;
    if (body_len < 0 || tpos > rec_end) { snprintf(reason, rn, "body length runs past the record"); return 3; }
    if (check_crc && body_len && (vf_crc32(b + bpos, body_len) & 0x7FFFFFFFu) != crc) {
        snprintf(reason, rn, "body CRC mismatch");
        return 3;
    }
    Py_ssize_t topic_len, fixed;
    if (magic == MAGIC_V2) {
        if (tpos + 2 > blen) return -1;
        topic_len = get_i16(b + tpos);
        tpos += 2;
        fixed = 76;
    } else {
        if (tpos >= blen) return -1;
        topic_len = b[tpos];
        tpos += 1;
        fixed = 75;
        if (topic_len > 127) { snprintf(reason, rn, "V1 topic length byte is negative"); return 3; }
    }
    Py_ssize_t ppos = tpos + topic_len;
    if (topic_len < 0 || ppos + 2 > rec_end) { snprintf(reason, rn, "topic length runs past the record"); return 3; }
    Py_ssize_t prop_len = get_i16(b + ppos);
    Py_ssize_t expected = fixed + hsize - 72 + body_len + topic_len + prop_len;
    if (prop_len < 0 || expected != total) {
        if (prop_len < 0 || ppos + 2 + prop_len > rec_end)
            snprintf(reason, rn, "properties length runs past the record");
        else
            snprintf(reason, rn, "total size %d != computed %zd", total, expected);
        return 3;
    }
    r->total = total;
    r->magic = magic;
    r->queue_id = get_i32(p + 12);
    r->queue_offset = get_i64(p + 20);
    r->sys_flag = sys_flag;
    r->topic_pos = tpos;
    r->topic_len = topic_len;
    r->props_pos = ppos + 2;
    r->prop_len = prop_len;
    return 0;
}

/* codec._property on bytes for TAGS, KEYS and UNIQ_KEY in one pass: the value of the LAST "\x02NAME\x01"
 * in "\x02" + props (a name starts a 0x02-separated segment; its value runs to the next 0x02), as a
 * position in props (length in *len) or -1 when absent or empty (an empty value counts as absent). */
typedef struct { Py_ssize_t tags, tags_len, keys, keys_len, uniq, uniq_len; } vf_props;

static void vf_parse_props(const unsigned char *props, Py_ssize_t pl, vf_props *o) {
    o->tags = o->keys = o->uniq = -1;
    o->tags_len = o->keys_len = o->uniq_len = 0;
    Py_ssize_t a = 0;
    while (a <= pl) {
        const unsigned char *z = a < pl ? memchr(props + a, 2, (size_t)(pl - a)) : NULL;
        Py_ssize_t e = z ? z - props : pl, n = e - a;
        const unsigned char *g = props + a;
        if (n >= 5 && memcmp(g, "TAGS\x01", 5) == 0) { o->tags = e > a + 5 ? a + 5 : -1; o->tags_len = n - 5; }
        else if (n >= 5 && memcmp(g, "KEYS\x01", 5) == 0) { o->keys = e > a + 5 ? a + 5 : -1; o->keys_len = n - 5; }
        else if (n >= 9 && memcmp(g, "UNIQ_KEY\x01", 9) == 0) { o->uniq = e > a + 9 ? a + 9 : -1; o->uniq_len = n - 9; }
        if (z == NULL) break;
        a = e + 1;
    }
}

static inline int vf_ascii(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) if (p[i] & 0x80) return 0;
    return 1;
}

static inline uint32_t vf_hash(uint32_t h, const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) h = 31u * h + p[i];
    return h;
}

/* the commitlog files, as repair.py passes them: [(file_from_offset, buffer, mapped_size)], sorted */
typedef struct {
    Py_ssize_t n;
    int64_t file_size;
    int64_t *from;
    Py_ssize_t *mapped;
    Py_buffer *views;
} vf_files;

static void vf_files_release(vf_files *f) {
    for (Py_ssize_t i = 0; i < f->n; i++) PyBuffer_Release(&f->views[i]);
    PyMem_Free(f->from);
    PyMem_Free(f->mapped);
    PyMem_Free(f->views);
    f->n = 0;
    f->from = NULL; f->mapped = NULL; f->views = NULL;
}

static int vf_files_get(PyObject *list, int64_t file_size, vf_files *f) {
    f->n = 0;
    f->file_size = file_size;
    Py_ssize_t n = PyList_GET_SIZE(list);
    f->from = PyMem_Calloc(n ? n : 1, sizeof(int64_t));
    f->mapped = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    f->views = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    if (!f->from || !f->mapped || !f->views) { vf_files_release(f); PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long from;
        Py_ssize_t mapped;
        PyObject *buf;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, i), "LOn", &from, &buf, &mapped)) { vf_files_release(f); return -1; }
        if (PyObject_GetBuffer(buf, &f->views[i], PyBUF_SIMPLE) < 0) { vf_files_release(f); return -1; }
        f->n = i + 1;
        f->from[i] = from;
        f->mapped[i] = mapped > f->views[i].len ? -1 : mapped;  /* -1: leave it to the reference */
    }
    return 0;
}

/* MappedFileQueue.find_mapped_file_by_offset: the file holding `off`, -1 when none */
static Py_ssize_t vf_file_of(const vf_files *f, int64_t off) {
    if (f->n == 0 || off < f->from[0] || off >= f->from[f->n - 1] + f->file_size) return -1;
    int64_t idx = off / f->file_size - f->from[0] / f->file_size;
    if (idx >= 0 && idx < f->n && f->from[idx] <= off && off < f->from[idx] + f->file_size) return (Py_ssize_t)idx;
    for (Py_ssize_t i = 0; i < f->n; i++)
        if (f->from[i] <= off && off < f->from[i] + f->file_size) return i;
    return -1;
}

/* The record at commitlog offset `off`, if _check_record would find a whole one there (structure and CRC):
 * 1 with r and *base filled, 0 otherwise (the reference decides). */
static int vf_record_at(const vf_files *f, int64_t off, vf_rec *r, const unsigned char **base) {
    Py_ssize_t i = vf_file_of(f, off);
    if (i < 0 || f->mapped[i] < 0) return 0;
    char reason[160];
    Py_ssize_t pos = (Py_ssize_t)(off - f->from[i]);
    if (pos >= f->mapped[i]) return 0;
    const unsigned char *b = f->views[i].buf;
    if (vf_record(b, f->views[i].len, pos, f->mapped[i], 1, r, reason, sizeof reason) != 0) return 0;
    *base = b;
    return 1;
}

/* per-queue tallies of verify_scan: an open-addressing table keyed by (topic bytes, queue id) */
typedef struct {
    const unsigned char *topic;  /* into the buffer (valid during the call) */
    Py_ssize_t tlen;
    int32_t qid;
    int used, has_cut;
    int64_t cut, n, last;
    /* the queue's consume queue spans when verify_scan checks units beside the walk: units k..k+n-1 at
     * views[j].buf + pos (20 bytes each); looked up with the slot (nspans -1: the queue is not given) */
    Py_ssize_t nspans, hint;
    int64_t *sk, *sn;
    Py_ssize_t *spos;
    Py_buffer *sviews;
    int64_t rs, re;  /* the open range of units passed (re == -1: none) */
} vf_slot;

static void vf_slot_release(vf_slot *s) {
    for (Py_ssize_t j = 0; j < s->nspans; j++) if (s->sviews[j].obj != NULL) PyBuffer_Release(&s->sviews[j]);
    PyMem_Free(s->sk); PyMem_Free(s->sn); PyMem_Free(s->spos); PyMem_Free(s->sviews);
    s->nspans = -1; s->sk = s->sn = NULL; s->spos = NULL; s->sviews = NULL;
}

/* the slot's spans from queues[(topic, qid)] = [(k, buffer, pos, n)] (absent: none) */
static int vf_slot_spans(vf_slot *s, PyObject *queues) {
    s->nspans = -1;
    s->re = -1;
    if (queues == NULL || queues == Py_None) return 0;
    PyObject *key = Py_BuildValue("(y#i)", (const char *)s->topic, s->tlen, (int)s->qid);
    if (key == NULL) return -1;
    PyObject *lst = PyDict_GetItemWithError(queues, key);  /* borrowed */
    Py_DECREF(key);
    if (lst == NULL) return PyErr_Occurred() ? -1 : 0;
    if (!PyList_Check(lst)) { PyErr_SetString(PyExc_TypeError, "queues values must be lists"); return -1; }
    Py_ssize_t n = PyList_GET_SIZE(lst);
    s->sk = PyMem_Calloc(n ? n : 1, sizeof(int64_t));
    s->sn = PyMem_Calloc(n ? n : 1, sizeof(int64_t));
    s->spos = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    s->sviews = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    s->nspans = 0;
    if (!s->sk || !s->sn || !s->spos || !s->sviews) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t j = 0; j < n; j++) {
        long long k, cnt;
        Py_ssize_t pos;
        PyObject *buf;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(lst, j), "LOnL", &k, &buf, &pos, &cnt)) return -1;
        if (PyObject_GetBuffer(buf, &s->sviews[j], PyBUF_SIMPLE) < 0) return -1;
        s->nspans = j + 1;
        if (pos < 0 || cnt < 0 || pos + cnt * 20 > s->sviews[j].len) {
            PyErr_SetString(PyExc_ValueError, "verify_scan: consume queue span out of range");
            return -1;
        }
        s->sk[j] = k; s->sn[j] = cnt; s->spos[j] = pos;
    }
    return 0;
}

/* unit q of the slot's queue (20 bytes), NULL when no span holds it */
static const unsigned char *vf_slot_unit(vf_slot *s, int64_t q) {
    for (Py_ssize_t t = 0; t < s->nspans; t++) {
        Py_ssize_t j = (s->hint + t) % s->nspans;
        if (s->sk[j] <= q && q < s->sk[j] + s->sn[j]) {
            s->hint = j;
            return (const unsigned char *)s->sviews[j].buf + s->spos[j] + (q - s->sk[j]) * 20;
        }
    }
    return NULL;
}

/* close the slot's open range of passed units into `out` as (topic, qid, start, end) */
static int vf_slot_flush(vf_slot *s, PyObject *out) {
    if (s->re < 0 || out == NULL) return 0;
    PyObject *t = Py_BuildValue("(y#iLL)", (const char *)s->topic, s->tlen, (int)s->qid, (long long)s->rs,
                                (long long)s->re);
    if (t == NULL || PyList_Append(out, t) < 0) { Py_XDECREF(t); return -1; }
    Py_DECREF(t);
    s->re = -1;
    return 0;
}

static uint32_t vf_slot_hash(const unsigned char *t, Py_ssize_t n, int32_t qid) {
    uint32_t h = 2166136261u;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ t[i]) * 16777619u;
    return (h ^ (uint32_t)qid) * 2654435761u;
}

static vf_slot *vf_slot_find(vf_slot **tab, Py_ssize_t *cap, Py_ssize_t *used, const unsigned char *t,
                             Py_ssize_t tl, int32_t qid, PyObject *cut, PyObject *queues) {
    if ((*used + 1) * 2 > *cap) {  /* grow */
        Py_ssize_t ncap = *cap * 2;
        vf_slot *nt = PyMem_Calloc((size_t)ncap, sizeof(vf_slot));
        if (nt == NULL) { PyErr_NoMemory(); return NULL; }
        for (Py_ssize_t i = 0; i < *cap; i++) {
            if (!(*tab)[i].used) continue;
            uint32_t h = vf_slot_hash((*tab)[i].topic, (*tab)[i].tlen, (*tab)[i].qid) & (uint32_t)(ncap - 1);
            while (nt[h].used) h = (h + 1) & (uint32_t)(ncap - 1);
            nt[h] = (*tab)[i];
        }
        PyMem_Free(*tab);
        *tab = nt;
        *cap = ncap;
    }
    uint32_t h = vf_slot_hash(t, tl, qid) & (uint32_t)(*cap - 1);
    for (;;) {
        vf_slot *s = &(*tab)[h];
        if (!s->used) break;
        if (s->qid == qid && s->tlen == tl && memcmp(s->topic, t, (size_t)tl) == 0) return s;
        h = (h + 1) & (uint32_t)(*cap - 1);
    }
    vf_slot *s = &(*tab)[h];
    s->used = 1;
    s->nspans = -1;
    s->re = -1;
    s->topic = t;
    s->tlen = tl;
    s->qid = qid;
    (*used)++;
    if (PyDict_GET_SIZE(cut)) {
        PyObject *k = PyBytes_FromStringAndSize((const char *)t, tl);
        if (k == NULL) return NULL;
        PyObject *v = PyDict_GetItemWithError(cut, k);  /* borrowed */
        Py_DECREF(k);
        if (v == NULL && PyErr_Occurred()) return NULL;
        if (v != NULL) {
            long long c = PyLong_AsLongLong(v);
            if (c == -1 && PyErr_Occurred()) return NULL;
            s->has_cut = 1;
            s->cut = c;
        }
    }
    if (vf_slot_spans(s, queues) < 0) return NULL;
    return s;
}

/* indexKeyHashMethod of "topic#key" for the record's UNIQ_KEY and every KEYS token (split on spaces), all
 * ASCII (a non-ASCII topic gives none, a non-ASCII key is left out: a miss then goes to the reference) */
static int vf_key_hashes(const unsigned char *b, const vf_rec *r, int32_t *hashes, int max) {
    int nh = 0;
    if (!vf_ascii(b + r->topic_pos, r->topic_len)) return 0;
    uint32_t th = 31u * vf_hash(0, b + r->topic_pos, r->topic_len) + '#';
    const unsigned char *props = b + r->props_pos;
    vf_props pr;
    vf_parse_props(props, r->prop_len, &pr);
    if (pr.uniq >= 0 && vf_ascii(props + pr.uniq, pr.uniq_len))
        hashes[nh++] = index_hash(vf_hash(th, props + pr.uniq, pr.uniq_len));
    Py_ssize_t a = pr.keys, stop = pr.keys + pr.keys_len;
    while (pr.keys >= 0 && a < stop) {
        Py_ssize_t z = a;
        while (z < stop && props[z] != ' ') z++;
        if (z > a && nh < max && vf_ascii(props + a, z - a)) hashes[nh++] = index_hash(vf_hash(th, props + a, z - a));
        a = z + 1;
    }
    return nh;
}

/* The index files verify_scan checks beside the walk: [(buffer, entries_pos, count)] in the index pass's
 * order; entries 1..count-1 are read through a cursor (file, entry) that follows the walk. */
typedef struct {
    Py_ssize_t n;
    Py_buffer *views;
    Py_ssize_t *epos, *count;
} vf_ixfiles;

static void vf_ixfiles_release(vf_ixfiles *f) {
    for (Py_ssize_t i = 0; i < f->n; i++) if (f->views[i].obj != NULL) PyBuffer_Release(&f->views[i]);
    PyMem_Free(f->views); PyMem_Free(f->epos); PyMem_Free(f->count);
    f->n = 0; f->views = NULL; f->epos = NULL; f->count = NULL;
}

static int vf_ixfiles_get(PyObject *list, vf_ixfiles *f) {
    Py_ssize_t n = PyList_GET_SIZE(list);
    f->n = 0;
    f->views = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    f->epos = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    f->count = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    if (!f->views || !f->epos || !f->count) { vf_ixfiles_release(f); PyErr_NoMemory(); return -1; }
    f->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *buf;
        Py_ssize_t epos, count;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, i), "Onn", &buf, &epos, &count)) { vf_ixfiles_release(f); return -1; }
        if (buf == Py_None) continue;  /* not checked beside the walk (count stays 0) */
        if (PyObject_GetBuffer(buf, &f->views[i], PyBUF_SIMPLE) < 0) { vf_ixfiles_release(f); return -1; }
        if (epos < 0 || count < 0 || epos + count * 20 > f->views[i].len) {
            vf_ixfiles_release(f);
            PyErr_SetString(PyExc_ValueError, "verify_scan: index entries out of range");
            return -1;
        }
        f->epos[i] = epos;
        f->count[i] = count;
    }
    return 0;
}

/* append (file, start, end) to the confirmed ranges, merged with the last one when they touch */
static int vf_confirm(PyObject *ranges, Py_ssize_t *rf, Py_ssize_t *rs, Py_ssize_t *re, Py_ssize_t f, Py_ssize_t i) {
    if (*rf == f && *re == i) { (*re)++; return 0; }
    if (*rf >= 0) {
        PyObject *t = Py_BuildValue("(nnn)", *rf, *rs, *re);
        if (t == NULL || PyList_Append(ranges, t) < 0) { Py_XDECREF(t); return -1; }
        Py_DECREF(t);
    }
    *rf = f; *rs = i; *re = i + 1;
    return 0;
}

/* verify_scan(buf, pos, limit, base, max_records, cut, counts, states)
 *   -> (next_pos, state, reason, records, undecided) or None (the reference walks this chunk).
 * skim_records(buf, pos, limit, True, max_records, keep=False)'s walk; for every record that is not a
 * prepared transaction (and not before its topic's deletion cutoff `cut[topic]`), counts[(topic, qid)]
 * (a [count, last commitlog offset] list, created when missing) is updated. `undecided` lists the buffer
 * positions of the records whose last 20 bytes start with "__CRC32#\x01" and that this loop could not
 * pass (recovery.prop_crc_damage decides them); one whose trailer is well formed and equal passes.
 *
 * With `index` ([(buffer or None, entries_pos, count)], the index files in the index pass's order) and the
 * cursor (ix_file, ix_entry), the index entries are checked beside the walk while each record is at hand:
 * entries before the record's offset are left to the index pass, one AT it passes when its hash is one of
 * the record's keys (the record just passed the walk's checks, CRC included: what _check_record would find),
 * the cursor stops at an entry past it. The result then also has the cursor and `confirmed`, the passed
 * entries as (file, start, end) ranges; the index pass checks only the others.
 *
 * With `queues` ({(topic, qid): [(first unit, buffer, pos, units)]}, the spans the unit pass will read),
 * the unit at each walked record's queue offset passes when it points at the record with its size and tags
 * code; the result's last item lists the passed units as (topic, qid, start, end) ranges. With either, the
 * result is (next_pos, state, reason, records, undecided, ix_file, ix_entry, index ranges or None,
 * unit ranges or None). */
static PyObject *verify_scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, limit, max_records, ixf = 0, ixi = 1;
    long long base;
    PyObject *cut, *counts, *states, *ixlist = Py_None, *queues = Py_None;
    if (!PyArg_ParseTuple(args, "y*nnLnO!O!O!|OnnO", &view, &pos, &limit, &base, &max_records, &PyDict_Type, &cut,
                          &PyDict_Type, &counts, &PyTuple_Type, &states, &ixlist, &ixf, &ixi, &queues))
        return NULL;
    if (limit > view.len || pos < 0 || PyTuple_GET_SIZE(states) != 4) { PyBuffer_Release(&view); Py_RETURN_NONE; }
    const unsigned char *b = view.buf;
    Py_ssize_t cap = 64, used = 0, count = 0;
    vf_slot *tab = PyMem_Calloc((size_t)cap, sizeof(vf_slot));
    PyObject *undecided = PyList_New(0), *result = NULL, *confirmed = NULL, *cq_confirmed = NULL;
    vf_ixfiles ix = {0};
    Py_ssize_t rf = -1, rs = 0, re = 0;  /* the open range of confirmed entries */
    if (tab == NULL || undecided == NULL) { PyErr_NoMemory(); goto done; }
    if (ixlist != Py_None) {
        if (!PyList_Check(ixlist)) { PyErr_SetString(PyExc_TypeError, "index must be a list"); goto done; }
        if (vf_ixfiles_get(ixlist, &ix) < 0) goto done;
        confirmed = PyList_New(0);
        if (confirmed == NULL) goto done;
    }
    if (queues != Py_None) {
        if (!PyDict_Check(queues)) { PyErr_SetString(PyExc_TypeError, "queues must be a dict"); goto done; }
        if ((cq_confirmed = PyList_New(0)) == NULL) goto done;
    }
    int state = 2;
    char reason[160] = "";
    while (pos < limit) {
        if (count >= max_records) { state = 0; break; }
        vf_rec r;
        int s = vf_record(b, view.len, pos, limit, 1, &r, reason, sizeof reason);
        if (s < 0) { result = Py_None; Py_INCREF(result); goto done; }
        if (s > 0) { state = s; break; }
        const unsigned char *t = b + pos + r.total - 20;
        if (memcmp(t, "__CRC32#\x01", 9) == 0) {
            int pass = r.total > 112 && t[-1] == 2 && t[19] == 2;
            uint64_t want = 0;
            for (int k = 18; pass && k >= 9; k--) {
                if (t[k] < '0' || t[k] > '9') pass = 0;
                else want = want * 10 + (uint64_t)(t[k] - '0');
            }
            if (pass) pass = want == (vf_crc32(b + pos, r.total - 20) & 0x7FFFFFFFu);
            if (!pass) {
                PyObject *ix = PyLong_FromSsize_t(pos);
                if (ix == NULL || PyList_Append(undecided, ix) < 0) { Py_XDECREF(ix); goto done; }
                Py_DECREF(ix);
            }
        }
        if (!(r.sys_flag & 0x4)) {  /* TRANSACTION_PREPARED_TYPE */
            const unsigned char *topic = b + r.topic_pos;
            vf_slot *sl = vf_slot_find(&tab, &cap, &used, topic, r.topic_len, r.queue_id, cut,
                                       cq_confirmed != NULL ? queues : NULL);
            if (sl == NULL) goto done;
            if (!(sl->has_cut && base + pos < sl->cut)) {
                sl->n++;
                sl->last = base + pos;
            }
            /* its consume queue unit, while the record is at hand: it passes when it points here with the
             * record's size and tags code (the unit pass's checks; a SCHEDULE_TOPIC_XXXX record or a
             * non-ASCII TAGS value is left to the pass) */
            const unsigned char *u = sl->nspans > 0 ? vf_slot_unit(sl, r.queue_offset) : NULL;
            if (u != NULL && get_i64(u) == base + pos && get_i32(u + 8) == r.total &&
                !vf_is_schedule_topic(topic, r.topic_len)) {
                int64_t code = 0;
                int ok = 1;
                if (r.prop_len) {
                    vf_props pr;
                    vf_parse_props(b + r.props_pos, r.prop_len, &pr);
                    if (pr.tags >= 0) {
                        if (vf_ascii(b + r.props_pos + pr.tags, pr.tags_len))
                            code = (int32_t)vf_hash(0, b + r.props_pos + pr.tags, pr.tags_len);
                        else ok = 0;
                    }
                }
                if (ok && code == get_i64(u + 12)) {
                    if (sl->re == r.queue_offset) sl->re++;
                    else {
                        if (vf_slot_flush(sl, cq_confirmed) < 0) goto done;
                        sl->rs = r.queue_offset;
                        sl->re = r.queue_offset + 1;
                    }
                }
            }
        }
        if (confirmed != NULL) {  /* the index entries at this record */
            int32_t hashes[16];
            int nh = -1;
            int64_t at = base + pos;
            while (ixf < ix.n) {
                if (ixi >= ix.count[ixf]) { ixf++; ixi = 1; continue; }
                const unsigned char *e = (const unsigned char *)ix.views[ixf].buf + ix.epos[ixf] + ixi * 20;
                int64_t phy = get_i64(e + 4);
                if (phy > at) break;
                if (phy == at) {
                    if (nh < 0) nh = vf_key_hashes(b, &r, hashes, 16);
                    int32_t h = get_i32(e);
                    for (int k = 0; k < nh; k++)
                        if (hashes[k] == h) {
                            if (vf_confirm(confirmed, &rf, &rs, &re, ixf, ixi) < 0) goto done;
                            break;
                        }
                }
                ixi++;
            }
        }
        count++;
        pos += r.total;
    }
    if (confirmed != NULL && rf >= 0 && vf_confirm(confirmed, &rf, &rs, &re, -2, 0) < 0) goto done;
    for (Py_ssize_t i = 0; i < cap; i++)
        if (tab[i].used && vf_slot_flush(&tab[i], cq_confirmed) < 0) goto done;
    for (Py_ssize_t i = 0; i < cap; i++) {
        vf_slot *sl = &tab[i];
        if (!sl->used || sl->n == 0) continue;
        PyObject *key = Py_BuildValue("(y#i)", (const char *)sl->topic, sl->tlen, (int)sl->qid);
        if (key == NULL) goto done;
        PyObject *c = PyDict_GetItemWithError(counts, key);  /* borrowed */
        if (c == NULL) {
            if (PyErr_Occurred()) { Py_DECREF(key); goto done; }
            c = Py_BuildValue("[LL]", (long long)sl->n, (long long)sl->last);
            if (c == NULL || PyDict_SetItem(counts, key, c) < 0) { Py_XDECREF(c); Py_DECREF(key); goto done; }
            Py_DECREF(c);
        } else {
            if (!PyList_Check(c) || PyList_GET_SIZE(c) != 2) {
                Py_DECREF(key);
                PyErr_SetString(PyExc_TypeError, "counts values must be [count, last] lists");
                goto done;
            }
            long long n0 = PyLong_AsLongLong(PyList_GET_ITEM(c, 0));
            if (n0 == -1 && PyErr_Occurred()) { Py_DECREF(key); goto done; }
            PyObject *nn = PyLong_FromLongLong(n0 + sl->n), *ll = PyLong_FromLongLong(sl->last);
            if (nn == NULL || ll == NULL) { Py_XDECREF(nn); Py_XDECREF(ll); Py_DECREF(key); goto done; }
            PyList_SetItem(c, 0, nn);  /* steals */
            PyList_SetItem(c, 1, ll);
        }
        Py_DECREF(key);
    }
    if (ixlist != Py_None || queues != Py_None)
        result = Py_BuildValue("(nOsnOnnOO)", pos, PyTuple_GET_ITEM(states, state), reason, count, undecided, ixf, ixi,
                               confirmed != NULL ? confirmed : Py_None, cq_confirmed != NULL ? cq_confirmed : Py_None);
    else
        result = Py_BuildValue("(nOsnO)", pos, PyTuple_GET_ITEM(states, state), reason, count, undecided);
done:
    if (tab != NULL)
        for (Py_ssize_t i = 0; i < cap; i++) if (tab[i].used) vf_slot_release(&tab[i]);
    Py_XDECREF(cq_confirmed);
    PyMem_Free(tab);
    Py_XDECREF(undecided);
    Py_XDECREF(confirmed);
    vf_ixfiles_release(&ix);
    PyBuffer_Release(&view);
    return result;
}

/* verify_units(cq_buf, pos, n, first_q, files, file_size, cl_min, cl_end, topic, qid)
 *   -> (held, deferred): the n units at cq_buf[pos:] (queue offsets first_q...). `held` counts those that
 * are not blank fill units; `deferred` lists (q, offset, size, tags code) of every unit this loop did not
 * pass: below cl_min units are expired (passed), at or past cl_end the reference decides (the log may
 * have grown), else a unit passes when a whole record (structure, body CRC) of `size` bytes starts at its
 * offset, of this topic and queue id, with queue offset q and the unit's tags code (a non-ASCII TAGS value
 * or a SCHEDULE_TOPIC_XXXX record is deferred). */
static PyObject *verify_units(PyObject *self, PyObject *args) {
    Py_buffer cq, topic;
    Py_ssize_t pos, n;
    long long first_q, file_size, cl_min, cl_end;
    PyObject *files_list;
    int qid;
    if (!PyArg_ParseTuple(args, "y*nnLO!LLLy*i", &cq, &pos, &n, &first_q, &PyList_Type, &files_list, &file_size,
                          &cl_min, &cl_end, &topic, &qid))
        return NULL;
    PyObject *deferred = NULL, *result = NULL;
    vf_files files = {0};
    if (pos < 0 || n < 0 || pos + n * 20 > cq.len || file_size <= 0) {
        PyErr_SetString(PyExc_ValueError, "verify_units: span out of range");
        goto out;
    }
    if (vf_files_get(files_list, file_size, &files) < 0) goto out;
    deferred = PyList_New(0);
    if (deferred == NULL) goto out;
    int schedule = vf_is_schedule_topic(topic.buf, topic.len);
    Py_ssize_t held = 0;
    const unsigned char *u = (const unsigned char *)cq.buf + pos;
    for (Py_ssize_t i = 0; i < n; i++, u += 20) {
        int64_t off = get_i64(u), tags = get_i64(u + 12);
        int32_t size = get_i32(u + 8);
        if (off == 0 && size == 0x7FFFFFFF) continue;  /* a blank fill unit */
        held++;
        if (off < cl_min) continue;
        int ok = 0;
        if (off < cl_end && !schedule) {
            vf_rec r;
            const unsigned char *b;
            if (vf_record_at(&files, off, &r, &b) && r.total == size && r.queue_id == qid &&
                r.queue_offset == first_q + i && r.topic_len == topic.len &&
                memcmp(b + r.topic_pos, topic.buf, (size_t)topic.len) == 0) {
                int64_t code = 0;
                ok = 1;
                if (r.prop_len) {
                    vf_props pr;
                    vf_parse_props(b + r.props_pos, r.prop_len, &pr);
                    if (pr.tags >= 0) {
                        if (vf_ascii(b + r.props_pos + pr.tags, pr.tags_len))
                            code = (int32_t)vf_hash(0, b + r.props_pos + pr.tags, pr.tags_len);
                        else ok = 0;
                    }
                }
                ok = ok && code == tags;
            }
        }
        if (!ok) {
            PyObject *t = Py_BuildValue("(LLiL)", (long long)(first_q + i), (long long)off, (int)size, (long long)tags);
            if (t == NULL || PyList_Append(deferred, t) < 0) { Py_XDECREF(t); goto out; }
            Py_DECREF(t);
        }
    }
    result = Py_BuildValue("(nO)", held, deferred);
out:
    Py_XDECREF(deferred);
    vf_files_release(&files);
    PyBuffer_Release(&cq);
    PyBuffer_Release(&topic);
    return result;
}

/* verify_index(idx_buf, entries_pos, first, end, files, file_size, cl_min, cl_end) -> deferred
 * Entries first..end-1 of the index file (20 bytes each from entries_pos: hash, phy offset, ...).
 * `deferred` lists (i, hash, phy) of the entries this loop did not pass: below cl_min they are expired
 * (passed), at or past cl_end the reference decides; else an entry passes when a whole record (structure,
 * body CRC) starts at phy and `topic#key` of its UNIQ_KEY or of a KEYS token (split on spaces) hashes
 * (indexKeyHashMethod) to the entry's hash, all ASCII; anything else is deferred. */
static PyObject *verify_index(PyObject *self, PyObject *args) {
    Py_buffer idx;
    Py_ssize_t epos, first, end;
    long long file_size, cl_min, cl_end;
    PyObject *files_list;
    if (!PyArg_ParseTuple(args, "y*nnnO!LLL", &idx, &epos, &first, &end, &PyList_Type, &files_list, &file_size,
                          &cl_min, &cl_end))
        return NULL;
    PyObject *deferred = NULL, *result = NULL;
    vf_files files = {0};
    if (epos < 0 || first < 0 || end < first || epos + end * 20 > idx.len || file_size <= 0) {
        PyErr_SetString(PyExc_ValueError, "verify_index: span out of range");
        goto out;
    }
    if (vf_files_get(files_list, file_size, &files) < 0) goto out;
    deferred = PyList_New(0);
    if (deferred == NULL) goto out;
    /* the record last found whole and its keys' hashes (the entries of one record are neighbours) */
    int64_t last_phy = -1;
    int32_t hashes[16];
    int nh = 0;
    for (Py_ssize_t i = first; i < end; i++) {
        const unsigned char *e = (const unsigned char *)idx.buf + epos + i * 20;
        int32_t h = get_i32(e);
        int64_t phy = get_i64(e + 4);
        if (phy < cl_min) continue;
        int ok = 0;
        if (phy < cl_end) {
            if (phy != last_phy) {
                vf_rec lr;
                const unsigned char *lb;
                last_phy = -1;
                nh = 0;
                if (vf_record_at(&files, phy, &lr, &lb)) {
                    last_phy = phy;
                    nh = vf_key_hashes(lb, &lr, hashes, 16);
                }
            }
            if (last_phy == phy)
                for (int k = 0; k < nh && !ok; k++) ok = hashes[k] == h;
        }
        if (!ok) {
            PyObject *t = Py_BuildValue("(niL)", i, (int)h, (long long)phy);
            if (t == NULL || PyList_Append(deferred, t) < 0) { Py_XDECREF(t); goto out; }
            Py_DECREF(t);
        }
    }
    result = deferred;
    deferred = NULL;
out:
    Py_XDECREF(deferred);
    vf_files_release(&files);
    PyBuffer_Release(&idx);
    return result;
}
/* ============================================================================================== */
/* end of the verify block                                                                          */
/* ============================================================================================== */
/* THE PULL READ (issue 16, branch pull-native): the broker's match-all read of a queue            */
/* (MessageStore._get_matching_all) and the client's decode of a pull body (codec.decode_records). */
/* Both give up ("not mine to decide") exactly where their Python references take another branch.  */
/* ============================================================================================== */

/* MessageExt's slots (common/message.py), looked up by name once (init_pull) */
enum {
    X_STORE_SIZE, X_MAGIC, X_BODY_CRC, X_QUEUE_ID, X_FLAG, X_QUEUE_OFFSET, X_PHYS, X_SYS_FLAG, X_BORN_TS,
    X_BORN_HOST, X_BORN_PORT, X_STORE_TS, X_STORE_HOST, X_STORE_PORT, X_RECONSUME, X_PREP_TX, X_BODY,
    X_TOPIC, X_PROPS, X_PARSED, X_COUNT
};
static const char *ext_names[X_COUNT] = {
    "store_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset", "commit_log_offset", "sys_flag",
    "born_timestamp", "born_host_bytes", "born_port", "store_timestamp", "store_host_bytes", "store_port",
    "reconsume_times", "prepared_transaction_offset", "body", "topic", "properties_string", "_properties",
};
static PyTypeObject *ext_type = NULL;
static Py_ssize_t ext_offsets[X_COUNT];

static PyObject *init_pull(PyObject *self, PyObject *args) {
    PyObject *tp;
    if (!PyArg_ParseTuple(args, "O!", &PyType_Type, &tp)) return NULL;
    Py_ssize_t offs[X_COUNT];
    if (slot_offsets(tp, ext_names, X_COUNT, offs) < 0) return NULL;
    memcpy(ext_offsets, offs, sizeof offs);
    Py_XSETREF(ext_type, (PyTypeObject *)Py_NewRef(tp));
    Py_RETURN_NONE;
}

#define REC_MAGIC_V1 ((int32_t)0xDAA320A7u)  /* codec.MESSAGE_MAGIC_CODE */
#define REC_MAGIC_V2 ((int32_t)0xDAA320ABu)  /* codec.MESSAGE_MAGIC_CODE_V2 */
#define SF_COMPRESSED 0x1
#define SF_BORN_V6 (1 << 4)
#define SF_STORE_V6 (1 << 5)
#define SF_COMPRESSION_MASK 0x700

/* the object of the previous record's field when the value is the same, else a new one (kept for the next) */
static inline PyObject *same_long(PyObject **slot, int64_t *val, int64_t v) {
    if (*slot != NULL && *val == v) return Py_NewRef(*slot);
    PyObject *o = PyLong_FromLongLong(v);
    if (o == NULL) return NULL;
    Py_XSETREF(*slot, Py_NewRef(o));
    *val = v;
    return o;
}
static inline PyObject *same_bytes(PyObject **slot, const unsigned char *p, Py_ssize_t len) {
    if (*slot != NULL && PyBytes_GET_SIZE(*slot) == len && memcmp(PyBytes_AS_STRING(*slot), p, (size_t)len) == 0)
        return Py_NewRef(*slot);
    PyObject *o = PyBytes_FromStringAndSize((const char *)p, len);
    if (o == NULL) return NULL;
    Py_XSETREF(*slot, Py_NewRef(o));
    return o;
}

/* decode_records(buf: bytes, pos, out: list, decompress) -> pos: appends a MessageExt to `out` for each
 * record from `pos` on that codec.decode_records' fast branch decodes itself, and returns the position of
 * the first record it does not (one that branch hands to decode_message: anything unusual, or a ZLIB body
 * to inflate), or len(buf). The caller decodes that record in Python and calls again after it. */
static PyObject *dr_cache[X_COUNT];
static int64_t dr_cached[X_COUNT];
static PyObject *dr_topic;  /* the last topic decoded, kept from call to call (reused for the same ASCII bytes) */

/* The loop of decode_records over b[0:n] from `pos`: the position of the first record it leaves, -1 on an
 * error, -2 when `props` (given: pop_take's) declined a record. `props(ctx, topic, p, pl, queue id, queue
 * offset)` makes a record's properties string (a new reference; NULL: an error if one is set, else declined)
 * instead of its UTF-8 decode. */
typedef PyObject *(*dr_props_fn)(void *ctx, PyObject *topic, const unsigned char *p, Py_ssize_t pl, int32_t qid,
                                 int64_t qoff);
static Py_ssize_t decode_records_core(const unsigned char *b, Py_ssize_t n, Py_ssize_t pos, PyObject *out,
                                      int decompress, dr_props_fn props, void *ctx) {
    PyObject *topic = NULL;  /* the last topic decoded, and where its bytes are */
    const unsigned char *topic_at = NULL;
    Py_ssize_t topic_len = -1;
    /* the previous record's field objects (same_long / same_bytes), kept from call to call: a lone consumer's
     * batches of one message share them too (under the GIL; every object is immutable) */
    PyObject **cache = dr_cache;
    int64_t *cached = dr_cached;
    int declined = 0;
    if (pos < 0) pos = 0;
    while (pos < n) {
        if (pos + 40 > n) break;
        const unsigned char *r = b + pos;
        int32_t sys_flag = get_i32(r + 36);
        Py_ssize_t born_len = (sys_flag & SF_BORN_V6) ? 16 : 4, store_len = (sys_flag & SF_STORE_V6) ? 16 : 4;
        Py_ssize_t hsize = 80 + born_len + store_len;  /* 88 / 100 / 100 / 112 (codec._HEADER_SIZES) */
        if (pos + hsize > n) break;
        int32_t total = get_i32(r), magic = get_i32(r + 4);
        if (magic != REC_MAGIC_V1 && magic != REC_MAGIC_V2) break;
        if (total <= 0 || pos + total > n) break;
        Py_ssize_t rec_end = pos + total;
        int32_t body_len = get_i32(r + hsize - 4);
        if (body_len < 0) break;
        Py_ssize_t bpos = pos + hsize, tpos = bpos + body_len;
        if (tpos + 4 > rec_end) break;
        Py_ssize_t tl;
        if (magic == REC_MAGIC_V1) { tl = b[tpos]; tpos += 1; if (tl > 127) break; }
        else { tl = get_i16(b + tpos); tpos += 2; if (tl < 0) break; }
        Py_ssize_t ppos = tpos + tl;
        if (ppos + 2 > rec_end) break;
        Py_ssize_t pl = get_i16(b + ppos);
        ppos += 2;
        if (pl < 0 || ppos + pl != rec_end) break;
        if (decompress && (sys_flag & SF_COMPRESSED) &&
            ((sys_flag & SF_COMPRESSION_MASK) == 0 || (sys_flag & SF_COMPRESSION_MASK) == 0x300)) break;
        /* the record is one the fast branch decodes: build its MessageExt */
        if (topic == NULL || tl != topic_len || memcmp(topic_at, b + tpos, (size_t)tl) != 0) {
            PyObject *t;
            if (dr_topic != NULL && PyUnicode_IS_ASCII(dr_topic) && PyUnicode_GET_LENGTH(dr_topic) == tl
                && memcmp(PyUnicode_1BYTE_DATA(dr_topic), b + tpos, (size_t)tl) == 0) {
                t = Py_NewRef(dr_topic);  /* what the decode of these ASCII bytes gives */
            } else {
                t = PyUnicode_DecodeUTF8((const char *)b + tpos, tl, "replace");
                if (t == NULL) goto fail;
                Py_XSETREF(dr_topic, Py_NewRef(t));
            }
            Py_XSETREF(topic, t);
            topic_at = b + tpos;
            topic_len = tl;
        }
        PyObject *m = ext_type->tp_alloc(ext_type, 0);
        if (m == NULL) goto fail;
        PyObject *v[X_COUNT];
        const unsigned char *h = r + 48 + born_len;  /* born port */
        /* fields equal to the previous record's share its (immutable) objects: one batch's records differ
         * only in offsets, CRC, body and properties */
        v[X_STORE_SIZE] = same_long(&cache[X_STORE_SIZE], &cached[X_STORE_SIZE], total);
        v[X_MAGIC] = same_long(&cache[X_MAGIC], &cached[X_MAGIC], magic);
        v[X_BODY_CRC] = PyLong_FromLong(get_i32(r + 8));
        v[X_QUEUE_ID] = same_long(&cache[X_QUEUE_ID], &cached[X_QUEUE_ID], get_i32(r + 12));
        v[X_FLAG] = same_long(&cache[X_FLAG], &cached[X_FLAG], get_i32(r + 16));
        v[X_QUEUE_OFFSET] = PyLong_FromLongLong(get_i64(r + 20));
        v[X_PHYS] = PyLong_FromLongLong(get_i64(r + 28));
        v[X_SYS_FLAG] = same_long(&cache[X_SYS_FLAG], &cached[X_SYS_FLAG], sys_flag);
        v[X_BORN_TS] = same_long(&cache[X_BORN_TS], &cached[X_BORN_TS], get_i64(r + 40));
        v[X_BORN_HOST] = same_bytes(&cache[X_BORN_HOST], r + 48, born_len);
        v[X_BORN_PORT] = same_long(&cache[X_BORN_PORT], &cached[X_BORN_PORT], get_i32(h));
        v[X_STORE_TS] = same_long(&cache[X_STORE_TS], &cached[X_STORE_TS], get_i64(h + 4));
        v[X_STORE_HOST] = same_bytes(&cache[X_STORE_HOST], h + 12, store_len);
        h += 12 + store_len;
        v[X_STORE_PORT] = same_long(&cache[X_STORE_PORT], &cached[X_STORE_PORT], get_i32(h));
        v[X_RECONSUME] = same_long(&cache[X_RECONSUME], &cached[X_RECONSUME], get_i32(h + 4));
        v[X_PREP_TX] = same_long(&cache[X_PREP_TX], &cached[X_PREP_TX], get_i64(h + 8));
        v[X_BODY] = PyBytes_FromStringAndSize((const char *)b + bpos, body_len);
        v[X_TOPIC] = Py_NewRef(topic);
        v[X_PROPS] = props != NULL ? props(ctx, topic, b + ppos, pl, get_i32(r + 12), get_i64(r + 20))
                     : pl ? PyUnicode_DecodeUTF8((const char *)b + ppos, pl, "replace") : PyUnicode_New(0, 0);
        v[X_PARSED] = Py_NewRef(Py_None);
        int bad = 0;
        for (int i = 0; i < X_COUNT; i++) {
            if (v[i] == NULL) bad = 1;
            *(PyObject **)((char *)m + ext_offsets[i]) = v[i];  /* the fresh object's slots are NULL */
        }
        if (bad || PyList_Append(out, m) < 0) {
            Py_DECREF(m);
            if (bad && props != NULL && v[X_PROPS] == NULL && !PyErr_Occurred()) declined = 1;
            goto fail;
        }
        Py_DECREF(m);
        pos = rec_end;
    }
    Py_XDECREF(topic);
    return pos < n ? pos : n;
fail:
    Py_XDECREF(topic);
    return declined ? -2 : -1;
}

static PyObject *decode_records_c(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *out;
    Py_ssize_t pos;
    int decompress;
    if (!PyArg_ParseTuple(args, "O!nO!p", &PyBytes_Type, &buf_obj, &pos, &PyList_Type, &out, &decompress))
        return NULL;
    if (ext_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "init_pull(MessageExt) was not called");
        return NULL;
    }
    Py_ssize_t got = decode_records_core((const unsigned char *)PyBytes_AS_STRING(buf_obj), PyBytes_GET_SIZE(buf_obj),
                                         pos, out, decompress, NULL, NULL);
    return got < 0 ? NULL : PyLong_FromSsize_t(got);
}

/* read_runs(units, queue_offset, max_msg_nums, max_total, mem_floor, mem_bytes, mem_count, disk_bytes,
 *           disk_count, min_phy, span) -> (status, taken, total, max_pulled, body, layout) or None
 * MessageStore._get_matching_all's loop over consume-queue units given as their stored bytes (20 per unit,
 * big-endian offset / size / tags code). span(offset) -> (file start, readable end, file view) or None
 * is called when a record is outside the file last looked up. status: 0 NO_MATCHED_MESSAGE, 1
 * MESSAGE_WAS_REMOVING, 2 FOUND. body: the records back to back (one copy out of the mapped files);
 * layout: native int64 (queue offset, commitlog offset, size) per record. None when a file view can no
 * longer be read (the file was destroyed under the read): the caller then reads unit by unit. */
typedef struct { PyObject *view; Py_ssize_t start, len; } pull_run;

/* the file holding commitlog offset `at`: 1 with its start, readable end and view (a new reference) in
 * *base / *limit / *view; 0 for none (span returned None); -1 with an error set */
typedef int (*rr_span_fn)(void *ctx, long long at, long long *base, long long *limit, PyObject **view);

static int rr_span_call(void *ctx, long long at, long long *base, long long *limit, PyObject **view) {
    PyObject *s = PyObject_CallFunction((PyObject *)ctx, "L", at);
    if (s == NULL) return -1;
    if (s == Py_None) { Py_DECREF(s); return 0; }
    PyObject *v;
    if (!PyArg_ParseTuple(s, "LLO", base, limit, &v)) { Py_DECREF(s); return -1; }
    *view = Py_NewRef(v);
    Py_DECREF(s);
    return 1;
}

static PyObject *rr_core(const unsigned char *ubuf, Py_ssize_t ulen, long long offset, long long max_msg_nums,
                         long long max_total, long long mem_floor, long long mem_bytes, long long mem_count,
                         long long disk_bytes, long long disk_count, long long min_phy, rr_span_fn span_fn,
                         void *span_ctx);

static PyObject *read_runs(PyObject *self, PyObject *args) {
    Py_buffer units;
    long long offset, max_msg_nums, max_total, mem_floor, mem_bytes, mem_count, disk_bytes, disk_count, min_phy;
    PyObject *span;
    if (!PyArg_ParseTuple(args, "y*LLLLLLLLLO", &units, &offset, &max_msg_nums, &max_total, &mem_floor,
                          &mem_bytes, &mem_count, &disk_bytes, &disk_count, &min_phy, &span))
        return NULL;
    PyObject *r = rr_core(units.buf, units.len, offset, max_msg_nums, max_total, mem_floor, mem_bytes, mem_count,
                          disk_bytes, disk_count, min_phy, rr_span_call, span);
    PyBuffer_Release(&units);
    return r;
}

/* read_runs' loop over `ulen / 20` units at `ubuf`, the span looked up by span_fn */
static PyObject *rr_core(const unsigned char *ubuf, Py_ssize_t ulen, long long offset, long long max_msg_nums,
                         long long max_total, long long mem_floor, long long mem_bytes, long long mem_count,
                         long long disk_bytes, long long disk_count, long long min_phy, rr_span_fn span_fn,
                         void *span_ctx) {
    PyObject *result = NULL, *cur_view = NULL, *body = NULL, *layout = NULL;
    Py_ssize_t nunits = ulen / 20;
    pull_run *runs = PyMem_Malloc(sizeof(pull_run) * (nunits ? nunits : 1));
    int64_t *lay = PyMem_Malloc(sizeof(int64_t) * 3 * (nunits ? nunits : 1));
    Py_ssize_t nruns = 0;
    if (runs == NULL || lay == NULL) { PyErr_NoMemory(); goto done; }
    const unsigned char *u = ubuf;
    int status = 0;
    long long cur_base = -1, cur_limit = -1, run_end = -1, count = 0, total = 0, taken = 0, max_pulled = -1;
    for (Py_ssize_t i = 0; i < nunits; i++, u += 20) {
        long long offset_py = get_i64(u), size_py = get_i32(u + 8);
        if (count && total) {
            if (count >= max_msg_nums || total + size_py > max_total) break;
            if (offset_py >= mem_floor) {
                if (total + size_py > mem_bytes || count > mem_count - 1) break;
            } else if (total + size_py > disk_bytes || count > disk_count - 1) break;
        }
        taken++;
        if (size_py == 0x7FFFFFFF || size_py <= 0) continue;
        if (offset_py < min_phy) {
            if (!count) status = 1;
            continue;
        }
        /* size_py > 0 here; past int64 (a damaged unit) the end is as unreadable as Python's big int */
        long long end = offset_py > LLONG_MAX - size_py ? LLONG_MAX : offset_py + size_py;
        if (offset_py < cur_base || end > cur_limit) {
            long long base, limit;
            PyObject *view = NULL;
            int found = span_fn(span_ctx, offset_py, &base, &limit, &view);
            if (found < 0) goto done;
            if (!found) {
                cur_base = cur_limit = -1;
            } else {
                cur_base = base;
                cur_limit = limit;
                Py_XSETREF(cur_view, view);
            }
            if (offset_py < cur_base || end > cur_limit) {
                if (!count) status = 1;
                continue;
            }
        }
        if (offset_py == run_end && nruns && runs[nruns - 1].view == cur_view) {
            runs[nruns - 1].len += size_py;
        } else {
            runs[nruns].view = Py_NewRef(cur_view);
            runs[nruns].start = (Py_ssize_t)(offset_py - cur_base);
            runs[nruns].len = (Py_ssize_t)size_py;
            nruns++;
        }
        run_end = end;
        lay[3 * count] = offset + taken - 1;
        lay[3 * count + 1] = offset_py;
        lay[3 * count + 2] = size_py;
        count++;
        total += size_py;
        max_pulled = offset_py;
        status = 2;
    }
    body = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (body == NULL) goto done;
    {
        char *dst = PyBytes_AS_STRING(body);
        for (Py_ssize_t k = 0; k < nruns; k++) {
            Py_buffer vb;
            if (PyObject_GetBuffer(runs[k].view, &vb, PyBUF_SIMPLE) < 0) {
                if (PyErr_ExceptionMatches(PyExc_ValueError)) { PyErr_Clear(); result = Py_NewRef(Py_None); }
                goto done;
            }
            if (runs[k].start < 0 || runs[k].start + runs[k].len > vb.len) {  /* not the file it was */
                PyBuffer_Release(&vb);
                result = Py_NewRef(Py_None);
                goto done;
            }
            memcpy(dst, (const char *)vb.buf + runs[k].start, (size_t)runs[k].len);
            dst += runs[k].len;
            PyBuffer_Release(&vb);
        }
    }
    layout = PyBytes_FromStringAndSize((const char *)lay, (Py_ssize_t)(sizeof(int64_t) * 3 * count));
    if (layout == NULL) goto done;
    {   /* Py_BuildValue("iLLLOO", ...) without its format's parse (branch pop-ck: ~900 instructions a read) */
        PyObject *st = PyLong_FromLong(status), *tk = PyLong_FromLongLong(taken), *to = PyLong_FromLongLong(total),
                 *mp = PyLong_FromLongLong(max_pulled);
        result = st && tk && to && mp ? PyTuple_Pack(6, st, tk, to, mp, body, layout) : NULL;
        Py_XDECREF(st); Py_XDECREF(tk); Py_XDECREF(to); Py_XDECREF(mp);
    }
done:
    for (Py_ssize_t k = 0; k < nruns; k++) Py_DECREF(runs[k].view);
    PyMem_Free(runs);
    PyMem_Free(lay);
    Py_XDECREF(cur_view);
    Py_XDECREF(body);
    Py_XDECREF(layout);
    return result;
}
/* ==================================== end of THE PULL READ ==================================== */
/* The remoting frame codec (issue 16, the request path): rmq_eventstore/remoting/command.py's     */
/* RemotingCommand.encode and FrameDecoder.feed's JSON frames in C. Both give way to the Python     */
/* reference ("not mine to decide": None, or stopping before a frame) for anything outside the      */
/* plain shapes every peer sends, so results and errors stay the reference's by construction;       */
/* tests/test_remoting_native.py compares the two on generated inputs.                              */
/*                                                                                                  */
/*   remoting_init    remoting_init(RemotingCommand, SerializeType.JSON): the slots, looked up once  */
/*   remoting_encode  RemotingCommand.encode: the frame bytes, or None                              */
/*   remoting_decode  FrameDecoder.feed's loop: (commands, position) over the JSON frames it can    */
/*                    decode from `position` on, stopping at the first it leaves to Python          */
/* ============================================================================================== */
enum { RC_CODE, RC_LANGUAGE, RC_VERSION, RC_OPAQUE, RC_FLAG, RC_REMARK, RC_EXT, RC_BODY, RC_STYPE, RC_COUNT };
static const char *rc_names[RC_COUNT] = {
    "code", "language", "version", "opaque", "flag", "remark", "ext_fields", "body", "serialize_type",
};
static PyTypeObject *rc_type = NULL;
static Py_ssize_t rc_offsets[RC_COUNT];
static PyObject *rc_stype_json = NULL;  /* SerializeType.JSON, what a decoded JSON frame carries */

static inline PyObject *rc_get(PyObject *o, int f) { return *(PyObject **)((char *)o + rc_offsets[f]); }
static inline void rc_set(PyObject *o, int f, PyObject *v) { /* steals v; the slot was empty */
    *(PyObject **)((char *)o + rc_offsets[f]) = v;
}

static PyObject *remoting_init(PyObject *self, PyObject *args) {
    PyObject *tp, *stype;
    if (!PyArg_ParseTuple(args, "O!O", &PyType_Type, &tp, &stype)) return NULL;
    Py_ssize_t offs[RC_COUNT];
    if (slot_offsets(tp, rc_names, RC_COUNT, offs) < 0) return NULL;
    memcpy(rc_offsets, offs, sizeof offs);
    Py_XSETREF(rc_type, (PyTypeObject *)Py_NewRef(tp));
    Py_XSETREF(rc_stype_json, Py_NewRef(stype));
    Py_RETURN_NONE;
}

/* -- encoding ----------------------------------------------------------------------------------- */
typedef struct { unsigned char *p; Py_ssize_t len, cap; unsigned char small[1024]; } rbuf;

static int rbuf_grow(rbuf *b, Py_ssize_t need) {
    if (b->len + need <= b->cap) return 1;
    Py_ssize_t cap = b->cap * 2;
    while (cap < b->len + need) cap *= 2;
    unsigned char *q;
    if (b->p == b->small) {
        q = PyMem_Malloc(cap);
        if (q != NULL) memcpy(q, b->p, b->len);
    } else q = PyMem_Realloc(b->p, cap);
    if (q == NULL) return 0;
    b->p = q;
    b->cap = cap;
    return 1;
}
static inline int rbuf_put(rbuf *b, const void *s, Py_ssize_t n) {
    if (!rbuf_grow(b, n)) return 0;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 1;
}
static inline void rbuf_free(rbuf *b) { if (b->p != b->small) PyMem_Free(b->p); }

/* The frame of a command whose JSON header is b->p[8:b->len] (8 bytes left for the two length words) and whose
 * body is body[0:blen]: the two length words set, header and body in one bytes object. None (a new reference)
 * when it would not fit a frame's int32 length, NULL with a MemoryError. */
static PyObject *rbuf_frame(rbuf *b, const char *body, Py_ssize_t blen) {
    Py_ssize_t hlen = b->len - 8;
    if ((long long)hlen + 4 + blen > 0x7FFFFFFF) Py_RETURN_NONE;
    put_i32(b->p, (int32_t)(4 + hlen + blen));
    put_i32(b->p + 4, (int32_t)hlen);
    PyObject *res = PyBytes_FromStringAndSize(NULL, b->len + blen);
    if (res != NULL) {
        memcpy(PyBytes_AS_STRING(res), b->p, b->len);
        if (blen) memcpy(PyBytes_AS_STRING(res) + b->len, body, blen);
    }
    return res;
}

/* What a frame builder answers after its writes stopped: None when they declined (no error set, or an error
 * that only means "not this shape"), NULL when they ran out of memory. */
static PyObject *rbuf_declined(void) {
    if (PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError)) return NULL;
        PyErr_Clear();
    }
    Py_RETURN_NONE;
}

/* whether `{x:d}` of an int of this type is int's own formatting (int, bool, IntEnum: their __format__
 * is int.__format__); the answer for up to 8 types is kept */
static PyTypeObject *int_like_types[8];
static int int_like(PyObject *o) {
    PyTypeObject *t = Py_TYPE(o);
    if (t == &PyLong_Type) return 1;
    if (!PyLong_Check(o)) return 0;
    for (int i = 0; i < 8 && int_like_types[i] != NULL; i++)
        if (int_like_types[i] == t) return 1;
    PyObject *f = PyObject_GetAttrString((PyObject *)t, "__format__");
    PyObject *g = PyObject_GetAttrString((PyObject *)&PyLong_Type, "__format__");
    int same = f != NULL && f == g;
    Py_XDECREF(f);
    Py_XDECREF(g);
    PyErr_Clear();
    if (same)
        for (int i = 0; i < 8; i++)
            if (int_like_types[i] == NULL) { int_like_types[i] = (PyTypeObject *)Py_NewRef(t); break; }
    return same;
}

/* an int as `{x:d}` writes it; 0 (error cleared) when it is no int or does not fit 64 bits */
static int rbuf_int(rbuf *b, PyObject *o) {
    if (!int_like(o)) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
    char tmp[24], *e = tmp + sizeof tmp, *d = e;  /* the digits by hand: snprintf costs ~1,300 instructions */
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do { *--d = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) *--d = '-';
    return rbuf_put(b, d, e - d);
}

/* the bytes json.JSONEncoder(ensure_ascii=False) escapes: control characters, '"' and '\\' */
static const unsigned char jstr_esc[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    0, 0, 1, ['\\'] = 1,
};

/* a str as json.JSONEncoder(ensure_ascii=False) writes it, in UTF-8; 0 (error cleared) when it is no
 * exact str or does not encode (a lone surrogate: the reference raises, so it decides) */
static int rbuf_jstr(rbuf *b, PyObject *o) {
    if (!PyUnicode_CheckExact(o)) return 0;
    Py_ssize_t n;
    const char *s = PyUnicode_AsUTF8AndSize(o, &n);
    if (s == NULL) { PyErr_Clear(); return 0; }
    if (!rbuf_grow(b, n * 6 + 2)) return 0;  /* the worst case: every byte \u00XX */
    unsigned char *d = b->p + b->len;
    *d++ = '"';
    static const char hex[] = "0123456789abcdef";
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t run = i;  /* a run of bytes written as they are, copied at once */
        while (i < n && !jstr_esc[(unsigned char)s[i]]) i++;
        if (i > run) { memcpy(d, s + run, i - run); d += i - run; }
        if (i == n) break;
        unsigned char c = (unsigned char)s[i];
        *d++ = '\\';
        switch (c) {
        case '"': *d++ = '"'; break;
        case '\\': *d++ = '\\'; break;
        case '\b': *d++ = 'b'; break;
        case '\f': *d++ = 'f'; break;
        case '\n': *d++ = 'n'; break;
        case '\r': *d++ = 'r'; break;
        case '\t': *d++ = 't'; break;
        default: *d++ = 'u'; *d++ = '0'; *d++ = '0'; *d++ = hex[c >> 4]; *d++ = hex[c & 15];
        }
    }
    *d++ = '"';
    b->len = d - b->p;
    return 1;
}

#define RPUT(lit) rbuf_put(&b, lit, sizeof(lit) - 1)
static PyObject *remoting_encode(PyObject *self, PyObject *cmd) {
    if (rc_type == NULL || Py_TYPE(cmd) != rc_type) Py_RETURN_NONE;
    PyObject *code = rc_get(cmd, RC_CODE), *lang = rc_get(cmd, RC_LANGUAGE), *version = rc_get(cmd, RC_VERSION),
             *opaque = rc_get(cmd, RC_OPAQUE), *flag = rc_get(cmd, RC_FLAG), *remark = rc_get(cmd, RC_REMARK),
             *ext = rc_get(cmd, RC_EXT), *body = rc_get(cmd, RC_BODY);
    if (!code || !lang || !version || !opaque || !flag || !remark || !ext || !body) Py_RETURN_NONE;
    if (ext != Py_None && !PyDict_CheckExact(ext)) Py_RETURN_NONE;
    Py_ssize_t blen = 0;
    if (body == Py_None) blen = 0;
    else if (PyBytes_CheckExact(body)) blen = PyBytes_GET_SIZE(body);
    else Py_RETURN_NONE;
    rbuf b;
    b.p = b.small; b.len = 8; b.cap = sizeof b.small;  /* the two length words first */
    int ok = RPUT("{\"code\":") && rbuf_int(&b, code) && RPUT(",\"language\":") && rbuf_jstr(&b, lang) &&
             RPUT(",\"version\":") && rbuf_int(&b, version) && RPUT(",\"opaque\":") && rbuf_int(&b, opaque) &&
             RPUT(",\"flag\":") && rbuf_int(&b, flag);
    if (ok && remark != Py_None) ok = RPUT(",\"remark\":") && rbuf_jstr(&b, remark);
    if (ok && ext != Py_None && PyDict_GET_SIZE(ext) > 0) {
        ok = RPUT(",\"extFields\":{");
        Py_ssize_t it = 0;
        PyObject *k, *v;
        int first = 1;
        while (ok && PyDict_Next(ext, &it, &k, &v)) {
            ok = (first || RPUT(",")) && rbuf_jstr(&b, k) && RPUT(":") && rbuf_jstr(&b, v);
            first = 0;
        }
        ok = ok && RPUT("}");
    }
    ok = ok && RPUT(",\"serializeTypeCurrentRPC\":\"JSON\"}");
    PyObject *res = ok ? rbuf_frame(&b, blen ? PyBytes_AS_STRING(body) : NULL, blen) : rbuf_declined();
    rbuf_free(&b);
    return res;
}
#undef RPUT

/* -- decoding ------------------------------------------------------------------------------------ */
/* A JSON header in the plain shape: an object whose known fields have their types (code, opaque, flag,
 * version: integers in int32; language, remark: strings; extFields: an object of strings) and whose other
 * fields are strings, integers, true, false or null. Anything else returns "give way" (0, no error). */
#define J_GIVE_WAY 0
#define J_OK 1
#define J_ERROR (-1)

typedef struct { const unsigned char *p, *end; } jcur;

static inline void j_ws(jcur *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static inline int j_hex4(const unsigned char *p, uint32_t *out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char h = p[i];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= h - '0';
        else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
        else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
        else return 0;
    }
    *out = v;
    return 1;
}

/* the bytes j_string stops at: control characters, '"', '\\' and non-ASCII */
static const unsigned char j_scan[256] = {
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
};

/* the string at c->p (its opening quote); *out a new str, or NULL with want_value 0 (only checked) */
static int j_string(jcur *c, PyObject **out, int want_value) {
    const unsigned char *s = ++c->p, *q = s;
    int escaped = 0, ascii = 1;
    for (;;) {
        while (q < c->end && !j_scan[*q]) q++;  /* plain ASCII: one table look-up a byte */
        if (q >= c->end || *q == '"') break;
        if (*q == '\\') { escaped = 1; q += 2; continue; }
        if (*q < 0x20) return J_GIVE_WAY;  /* json's strict mode refuses control characters */
        ascii = 0;  /* >= 0x80 */
        q++;
    }
    if (q >= c->end) return J_GIVE_WAY;
    c->p = q + 1;
    if (!escaped) {
        if (ascii && !want_value) return J_OK;
        PyObject *v = ascii ? PyUnicode_DecodeASCII((const char *)s, q - s, NULL)
                            : PyUnicode_DecodeUTF8((const char *)s, q - s, "surrogatepass");
        if (v == NULL) {
            if (PyErr_ExceptionMatches(PyExc_MemoryError)) return J_ERROR;
            PyErr_Clear();
            return J_GIVE_WAY;
        }
        if (want_value) *out = v; else Py_DECREF(v);
        return J_OK;
    }
    /* with escapes: expanded into UTF-8 (a lone surrogate as its 3-byte form), decoded with surrogatepass,
     * which reads what json's scanner makes of the same text */
    unsigned char tmp[512], *buf = tmp;
    if (q - s > (Py_ssize_t)sizeof tmp) {
        buf = PyMem_Malloc(q - s);
        if (buf == NULL) { PyErr_NoMemory(); return J_ERROR; }
    }
    unsigned char *d = buf;
    int rc = J_OK;
    for (const unsigned char *p = s; p < q;) {
        if (*p != '\\') { *d++ = *p++; continue; }
        p++;
        switch (*p++) {
        case '"': *d++ = '"'; break;
        case '\\': *d++ = '\\'; break;
        case '/': *d++ = '/'; break;
        case 'b': *d++ = '\b'; break;
        case 'f': *d++ = '\f'; break;
        case 'n': *d++ = '\n'; break;
        case 'r': *d++ = '\r'; break;
        case 't': *d++ = '\t'; break;
        case 'u': {
            uint32_t u;
            if (q - p < 4 || !j_hex4(p, &u)) { rc = J_GIVE_WAY; goto done; }
            p += 4;
            if (u >= 0xD800 && u <= 0xDBFF && q - p >= 6 && p[0] == '\\' && p[1] == 'u') {
                uint32_t u2;
                if (!j_hex4(p + 2, &u2)) { rc = J_GIVE_WAY; goto done; }
                if (u2 >= 0xDC00 && u2 <= 0xDFFF) {
                    u = 0x10000 + ((u - 0xD800) << 10) + (u2 - 0xDC00);
                    p += 6;
                }
            }
            if (u < 0x80) *d++ = (unsigned char)u;
            else if (u < 0x800) { *d++ = 0xC0 | (u >> 6); *d++ = 0x80 | (u & 63); }
            else if (u < 0x10000) { *d++ = 0xE0 | (u >> 12); *d++ = 0x80 | ((u >> 6) & 63); *d++ = 0x80 | (u & 63); }
            else {
                *d++ = 0xF0 | (u >> 18); *d++ = 0x80 | ((u >> 12) & 63);
                *d++ = 0x80 | ((u >> 6) & 63); *d++ = 0x80 | (u & 63);
            }
            break;
        }
        default: rc = J_GIVE_WAY; goto done;
        }
    }
    {
        PyObject *v = PyUnicode_DecodeUTF8((const char *)buf, d - buf, "surrogatepass");
        if (v == NULL) {
            rc = PyErr_ExceptionMatches(PyExc_MemoryError) ? J_ERROR : J_GIVE_WAY;
            if (rc == J_GIVE_WAY) PyErr_Clear();
        } else if (want_value) *out = v;
        else Py_DECREF(v);
    }
done:
    if (buf != tmp) PyMem_Free(buf);
    return rc;
}

/* an integer (no fraction, no exponent, at most 18 digits) */
static int j_int(jcur *c, long long *out) {
    const unsigned char *p = c->p;
    int neg = 0;
    if (p < c->end && *p == '-') { neg = 1; p++; }
    if (p >= c->end || *p < '0' || *p > '9') return J_GIVE_WAY;
    const unsigned char *digits = p;
    long long v = 0;
    if (*p == '0') p++;
    else while (p < c->end && *p >= '0' && *p <= '9') { v = v * 10 + (*p - '0'); p++; if (p - digits > 18) return J_GIVE_WAY; }
    if (p < c->end && (*p == '.' || *p == 'e' || *p == 'E')) return J_GIVE_WAY;
    c->p = p;
    *out = neg ? -v : v;
    return J_OK;
}

static int j_literal(jcur *c, const char *lit, Py_ssize_t n) {
    if (c->end - c->p < n || memcmp(c->p, lit, n) != 0) return J_GIVE_WAY;
    c->p += n;
    return J_OK;
}

static inline int key_is(const unsigned char *k, Py_ssize_t n, const char *name, Py_ssize_t m) {
    return n == m && memcmp(k, name, m) == 0;
}

/* j_string for an extFields key: a short plain ASCII key (no escapes: every peer's) is taken from a small
 * table of the keys read lately (same text, same str: no allocation, its hash already computed); any other
 * goes through j_string */
#define JKEY_CACHE 64
#define JKEY_MAX 32
static PyObject *jkey_cache[JKEY_CACHE];
static int j_key(jcur *c, PyObject **out) {
    const unsigned char *s = c->p + 1, *q = s;
    while (q < c->end && !j_scan[*q]) q++;
    Py_ssize_t n = q - s;
    if (q >= c->end || *q != '"' || n == 0 || n > JKEY_MAX) return j_string(c, out, 1);
    unsigned slot = ((unsigned)n * 31u + s[0] * 7u + s[n - 1] + s[n / 2] * 3u) % JKEY_CACHE;
    PyObject *k = jkey_cache[slot];
    if (k != NULL && PyUnicode_GET_LENGTH(k) == n && memcmp(PyUnicode_1BYTE_DATA(k), s, n) == 0) {
        *out = Py_NewRef(k);
    } else {
        k = PyUnicode_DecodeASCII((const char *)s, n, NULL);
        if (k == NULL) return J_ERROR;  /* ASCII by the scan: only a memory error */
        Py_XSETREF(jkey_cache[slot], Py_NewRef(k));
        *out = k;
    }
    c->p = q + 1;
    return J_OK;
}

/* extFields' object of strings into a new dict */
static int j_ext(jcur *c, PyObject **out) {
    c->p++;  /* '{' */
    PyObject *d = PyDict_New();
    if (d == NULL) return J_ERROR;
    j_ws(c);
    if (c->p < c->end && *c->p == '}') { c->p++; *out = d; return J_OK; }
    for (;;) {
        PyObject *k = NULL, *v = NULL;
        int rc;
        j_ws(c);
        if (c->p >= c->end || *c->p != '"') { Py_DECREF(d); return J_GIVE_WAY; }
        if ((rc = j_key(c, &k)) != J_OK) { Py_DECREF(d); return rc; }
        j_ws(c);
        if (c->p >= c->end || *c->p != ':') { Py_DECREF(k); Py_DECREF(d); return J_GIVE_WAY; }
        c->p++;
        j_ws(c);
        if (c->p >= c->end || *c->p != '"') { Py_DECREF(k); Py_DECREF(d); return J_GIVE_WAY; }
        if ((rc = j_string(c, &v, 1)) != J_OK) { Py_DECREF(k); Py_DECREF(d); return rc; }
        rc = PyDict_SetItem(d, k, v);
        Py_DECREF(k);
        Py_DECREF(v);
        if (rc < 0) { Py_DECREF(d); return J_ERROR; }
        j_ws(c);
        if (c->p < c->end && *c->p == ',') { c->p++; continue; }
        if (c->p < c->end && *c->p == '}') { c->p++; *out = d; return J_OK; }
        Py_DECREF(d);
        return J_GIVE_WAY;
    }
}

/* The members of a header object, as j_header, send_frame and client_send_take read them. */
/* j_member: the key at c->p (after white space) and the ':' after it, up to its value: J_OK with the key's
 * bytes in *k / *kn (no escape in it: an escaped key is the dict decoder's), J_GIVE_WAY, or J_ERROR */
static int j_member(jcur *c, const unsigned char **k, Py_ssize_t *kn) {
    j_ws(c);
    if (c->p >= c->end || *c->p != '"') return J_GIVE_WAY;
    const unsigned char *s = c->p + 1;
    int rc = j_string(c, NULL, 0);
    if (rc != J_OK) return rc;
    *k = s;
    *kn = c->p - 1 - s;
    if (memchr(s, '\\', *kn) != NULL) return J_GIVE_WAY;
    j_ws(c);
    if (c->p >= c->end || *c->p != ':') return J_GIVE_WAY;
    c->p++;
    j_ws(c);
    return c->p < c->end ? J_OK : J_GIVE_WAY;
}

/* the header's int32 field a key names (code, opaque, flag, version), or NULL */
static long long *j_header_int(const unsigned char *k, Py_ssize_t kn, long long *code, long long *opaque,
                               long long *flag, long long *version) {
    if (key_is(k, kn, "code", 4)) return code;
    if (key_is(k, kn, "opaque", 6)) return opaque;
    if (key_is(k, kn, "flag", 4)) return flag;
    if (key_is(k, kn, "version", 7)) return version;
    return NULL;
}

/* an integer in int32 */
static int j_int32(jcur *c, long long *out) {
    int rc = j_int(c, out);
    if (rc == J_OK && (*out < -0x80000000LL || *out > 0x7FFFFFFFLL)) return J_GIVE_WAY;
    return rc;
}

/* the value of a member nobody keeps: a string, true, false, null or an integer */
static int j_skip_value(jcur *c) {
    long long ignored;
    switch (*c->p) {
    case '"': return j_string(c, NULL, 0);
    case 't': return j_literal(c, "true", 4);
    case 'f': return j_literal(c, "false", 5);
    case 'n': return j_literal(c, "null", 4);
    default: return j_int(c, &ignored);
    }
}

/* after a member: 1 when another follows (its ',' taken), 0 when the object ends (its '}' taken), -1 else */
static int j_next(jcur *c) {
    j_ws(c);
    if (c->p < c->end && *c->p == ',') { c->p++; return 1; }
    if (c->p < c->end && *c->p == '}') { c->p++; return 0; }
    return -1;
}

/* THE ACK BATCH (block above the method table): j_member for the keys as our peers write them, and a
 * BatchAck's bit list as our clients write it, each handing anything else to the general reader */
static int al_member(jcur *c, const unsigned char **k, Py_ssize_t *kn);
static int al_bits_plain(jcur *c, long long *first, long long *count);

/* one JSON header -> a new RemotingCommand (body and serialize type set by the caller) */
static int j_header(const unsigned char *h, Py_ssize_t n, PyObject **out) {
    jcur c = {h, h + n};
    if (n < 2 || *c.p != '{') return J_GIVE_WAY;
    c.p++;
    long long code = 0, opaque = 0, flag = 0, version = 0;
    int have_code = 0;
    PyObject *lang = NULL, *remark = NULL, *ext = NULL;
    int rc = J_GIVE_WAY;
    j_ws(&c);
    if (c.p < c.end && *c.p == '}') goto fail;  /* no code: the reference refuses it */
    for (;;) {
        const unsigned char *k;
        Py_ssize_t kn;
        if ((rc = j_member(&c, &k, &kn)) != J_OK) goto fail;
        rc = J_GIVE_WAY;
        long long *iv = j_header_int(k, kn, &code, &opaque, &flag, &version);
        if (iv != NULL) {
            have_code |= iv == &code;
            if (j_int32(&c, iv) != J_OK) goto fail;
        } else if (key_is(k, kn, "language", 8) || key_is(k, kn, "remark", 6)) {
            PyObject **slot = kn == 8 ? &lang : &remark, *v = NULL;
            if (*c.p != '"') goto fail;
            if ((rc = j_string(&c, &v, 1)) != J_OK) goto fail;
            rc = J_GIVE_WAY;
            Py_XSETREF(*slot, v);
        } else if (key_is(k, kn, "extFields", 9)) {
            PyObject *v = NULL;
            if (*c.p != '{') goto fail;
            if ((rc = j_ext(&c, &v)) != J_OK) goto fail;
            rc = J_GIVE_WAY;
            Py_XSETREF(ext, v);
        } else {  /* another field: checked, not kept */
            if ((rc = j_skip_value(&c)) != J_OK) goto fail;
            rc = J_GIVE_WAY;
        }
        int more = j_next(&c);
        if (more > 0) continue;
        if (more == 0) break;
        goto fail;
    }
    j_ws(&c);
    if (c.p != c.end || !have_code) goto fail;
    if (lang != NULL && PyUnicode_GET_LENGTH(lang) > 16) {
        PyObject *cut = PyUnicode_Substring(lang, 0, 16);
        if (cut == NULL) { rc = J_ERROR; goto fail; }
        Py_SETREF(lang, cut);
    }
    PyObject *o = rc_type->tp_alloc(rc_type, 0);
    if (o == NULL) { rc = J_ERROR; goto fail; }
    PyObject *vals[5] = {PyLong_FromLongLong(code), PyLong_FromLongLong(opaque), PyLong_FromLongLong(flag),
                         PyLong_FromLongLong(version), lang != NULL ? lang : PyUnicode_FromString("JAVA")};
    lang = NULL;
    if (ext == NULL) ext = PyDict_New();
    rc_set(o, RC_CODE, vals[0]);
    rc_set(o, RC_OPAQUE, vals[1]);
    rc_set(o, RC_FLAG, vals[2]);
    rc_set(o, RC_VERSION, vals[3]);
    rc_set(o, RC_LANGUAGE, vals[4]);
    rc_set(o, RC_REMARK, remark != NULL ? remark : Py_NewRef(Py_None));
    rc_set(o, RC_EXT, ext);
    remark = ext = NULL;
    if (!vals[0] || !vals[1] || !vals[2] || !vals[3] || !vals[4] || !rc_get(o, RC_EXT)) {
        Py_DECREF(o);
        return J_ERROR;
    }
    *out = o;
    return J_OK;
fail:
    Py_XDECREF(lang);
    Py_XDECREF(remark);
    Py_XDECREF(ext);
    return rc;
}

static PyObject *remoting_decode(PyObject *self, PyObject *args) {
    Py_buffer src;
    Py_ssize_t pos, max_frame, max_header;
    if (!PyArg_ParseTuple(args, "y*nnn", &src, &pos, &max_frame, &max_header)) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL || rc_type == NULL) { PyBuffer_Release(&src); return out; }
    const unsigned char *base = src.buf;
    Py_ssize_t n = src.len;
    while (n - pos >= 8) {
        int32_t length = get_i32(base + pos), word = get_i32(base + pos + 4);
        Py_ssize_t hlen = word & 0xFFFFFF;
        if (length < 4 || length > max_frame || hlen > max_header || hlen > length - 4 || hlen <= 0) break;
        Py_ssize_t end = pos + 4 + (Py_ssize_t)length;
        if (n < end || ((word >> 24) & 0xFF) != 0) break;  /* incomplete, or not JSON: the reference's */
        Py_ssize_t hstart = pos + 8;
        PyObject *cmd = NULL;
        int rc = j_header(base + hstart, hlen, &cmd);
        if (rc == J_ERROR) goto error;
        if (rc == J_GIVE_WAY) break;
        PyObject *body = PyBytes_FromStringAndSize((const char *)base + hstart + hlen, end - hstart - hlen);
        if (body == NULL) { Py_DECREF(cmd); goto error; }
        rc_set(cmd, RC_BODY, body);
        rc_set(cmd, RC_STYPE, Py_NewRef(rc_stype_json));
        rc = PyList_Append(out, cmd);
        Py_DECREF(cmd);
        if (rc < 0) goto error;
        pos = end;
    }
    PyBuffer_Release(&src);
    PyObject *res = Py_BuildValue("(Nn)", out, pos);
    return res;
error:
    PyBuffer_Release(&src);
    Py_DECREF(out);
    return NULL;
}

#define REMOTING_METHODS                                                                                        \
    {"remoting_init", remoting_init, METH_VARARGS,                                                              \
     "remoting_init(RemotingCommand, SerializeType.JSON): look up the command's slots once."},                  \
    {"remoting_encode", remoting_encode, METH_O, "RemotingCommand.encode: the frame, or None (Python decides)."}, \
    {"remoting_decode", remoting_decode, METH_VARARGS,                                                          \
     "FrameDecoder.feed's loop from a position: (commands, position where Python takes over)."},
/* ============================================================================================== */
/* end of the remoting frame codec                                                                  */
/* ============================================================================================== */

/* ---------------------------------------------------------------------------------------------- */
/* Single put (issue 16, branch put-single): CommitLog._append_one's locked body in one call.        */
#include <time.h>
/* append_one(commit_log, msg, uniq, ctx, file_size) -> PutMessageResult(PUT_OK, AppendMessageResult) or None.
 * The caller holds the put lock. Covers exactly what `CommitLog._append_one` (the Python reference)
 * covers: a current file with room for the record before its last 8 bytes, an existing queue, a plain
 * message; None, with nothing changed, for anything else (the caller then takes the general path). In
 * that case it reads the queue offset from `topic_queue_table`, stamps `begin_time_in_lock`, encodes the
 * record straight into the file's write view (plain_prepare / plain_write / plain_request, the bytes of
 * encode_plain_one), moves `wrote_position` and `store_timestamp`, bumps the queue offset and hands the
 * request to `on_appended(base, end, (request,))`, as the reference does, in its order. */
static PyObject *s_mfq, *s_mapped_files, *s_wrote_position, *s_file_from_offset, *s_write_view, *s_store_ts,
    *s_table, *s_begin_in_lock, *s_on_appended;

static int single_names(void) {
    if (s_on_appended != NULL) return 0;
    const char *names[] = {"mapped_file_queue", "mapped_files", "wrote_position", "file_from_offset", "_write_view",
                           "store_timestamp", "topic_queue_table", "begin_time_in_lock", "on_appended"};
    PyObject **slots[] = {&s_mfq, &s_mapped_files, &s_wrote_position, &s_file_from_offset, &s_write_view,
                          &s_store_ts, &s_table, &s_begin_in_lock, &s_on_appended};
    for (int i = 0; i < 9; i++) {
        PyObject *n = PyUnicode_InternFromString(names[i]);
        if (n == NULL) return -1;
        *slots[i] = n;
    }
    return 0;
}

static int64_t single_now_ms(void) { /* int(time.time() * 1000) */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* an attribute that is an int fitting [lo, hi]: 1; 0 when it is not (error cleared); -1 on a lookup error */
static PyObject *sf_get_any(PyObject *o, PyObject *name);  /* SLOT FIELDS (branch send-core), above the table */
static int sf_set_any(PyObject *o, PyObject *name, PyObject *v);
static int single_attr_i64(PyObject *o, PyObject *name, int64_t lo, int64_t hi, int64_t *out) {
    PyObject *v = sf_get_any(o, name);
    if (v == NULL) return -1;
    int ok = PyLong_CheckExact(v) && as_i64(v, lo, hi, out);
    Py_DECREF(v);
    return ok;
}

static int single_set_i64(PyObject *o, PyObject *name, int64_t v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (x == NULL) return -1;
    int r = sf_set_any(o, name, x);
    Py_DECREF(x);
    return r;
}

/* The result objects of a put, built without running their dataclass __init__: the slots of
 * AppendMessageResult / PutMessageResult (slots=True dataclasses), looked up once by single_init. */
enum { A_STATUS, A_WROTE_OFFSET, A_WROTE_BYTES, A_STORE_TS, A_LOGICS_OFFSET, A_MSG_NUM, A_PAGE_CACHE_RT, A_STORE_HOST,
       A_STORE_PORT, A_OFFSETS, A_UNIQ_KEYS, A_COUNT };
static const char *amr_names[A_COUNT] = {"status", "wrote_offset", "wrote_bytes", "store_timestamp", "logics_offset",
                                         "msg_num", "page_cache_rt", "store_host", "store_port", "offsets", "uniq_keys"};
static const char *pmr_names[3] = {"status", "append_result", "reason"};
static PyTypeObject *amr_type = NULL, *pmr_type = NULL;
static Py_ssize_t amr_off[A_COUNT], pmr_off[3];
static PyObject *amr_ok = NULL, *pmr_ok = NULL;

/* ReputMessageService.notify_appended (the function) and reput.MAX_PENDING: append_one hands a record to
 * that method itself (see single_handoff) */
static PyObject *notify_fn = NULL;
static long long notify_max_pending = 0;

/* single_init(AppendMessageResult, PutMessageResult, AppendMessageStatus.PUT_OK, PutMessageStatus.PUT_OK
 *             [, ReputMessageService.notify_appended, MAX_PENDING]) */
static PyObject *single_init(PyObject *self, PyObject *args) {
    PyObject *at, *pt, *aok, *pok, *nf = NULL;
    long long maxp = 0;
    if (!PyArg_ParseTuple(args, "O!O!OO|OL", &PyType_Type, &at, &PyType_Type, &pt, &aok, &pok, &nf, &maxp)) return NULL;
    if (nf != NULL) {
        if (!PyFunction_Check(nf)) { PyErr_SetString(PyExc_TypeError, "notify_appended must be a function"); return NULL; }
        Py_XSETREF(notify_fn, Py_NewRef(nf));
        notify_max_pending = maxp;
    }
    Py_ssize_t ao[A_COUNT], po[3];
    if (slot_offsets(at, amr_names, A_COUNT, ao) < 0 || slot_offsets(pt, pmr_names, 3, po) < 0) return NULL;
    memcpy(amr_off, ao, sizeof ao); memcpy(pmr_off, po, sizeof po);
    Py_XSETREF(amr_type, (PyTypeObject *)Py_NewRef(at)); Py_XSETREF(pmr_type, (PyTypeObject *)Py_NewRef(pt));
    Py_XSETREF(amr_ok, Py_NewRef(aok)); Py_XSETREF(pmr_ok, Py_NewRef(pok));
    Py_RETURN_NONE;
}

static inline void set_slot(PyObject *o, Py_ssize_t off, PyObject *v) { /* steals v; the slot was NULL */
    *(PyObject **)((char *)o + off) = v;
}

/* PutMessageResult(PUT_OK, AppendMessageResult(PUT_OK, base, total, now, q, 1, rt, host, port, [base], [uniq]), "") */
static PyObject *single_result(PyObject *base_obj, PyObject *total_obj, PyObject *now_obj, PyObject *q_obj, int64_t rt,
                               PyObject *host, PyObject *port, PyObject *uniq) {
    PyObject *a = amr_type->tp_alloc(amr_type, 0);
    if (a == NULL) return NULL;
    PyObject *vals[A_COUNT] = {Py_NewRef(amr_ok), Py_NewRef(base_obj), Py_NewRef(total_obj), Py_NewRef(now_obj),
                               Py_NewRef(q_obj), PyLong_FromLong(1), PyLong_FromLongLong(rt), Py_NewRef(host),
                               Py_NewRef(port), PyList_New(1), PyList_New(1)};
    int bad = 0;
    for (int i = 0; i < A_COUNT; i++) if (vals[i] == NULL) bad = 1;
    if (!bad) {
        PyList_SET_ITEM(vals[A_OFFSETS], 0, Py_NewRef(base_obj));
        PyList_SET_ITEM(vals[A_UNIQ_KEYS], 0, Py_NewRef(uniq));
    }
    for (int i = 0; i < A_COUNT; i++) {
        if (vals[i] != NULL) set_slot(a, amr_off[i], vals[i]);
    }
    if (bad) { Py_DECREF(a); return NULL; }
    PyObject *p = pmr_type->tp_alloc(pmr_type, 0), *reason = PyUnicode_New(0, 0);
    if (p == NULL || reason == NULL) { Py_XDECREF(p); Py_XDECREF(reason); Py_DECREF(a); return NULL; }
    set_slot(p, pmr_off[0], Py_NewRef(pmr_ok));
    set_slot(p, pmr_off[1], a);
    set_slot(p, pmr_off[2], reason);
    return p;
}

/* f"{topic}-{queue_id}" (a new reference), remembered for the last topic seen per queue id modulo 16: a
 * single put to a known queue neither formats nor hashes a new string */
static PyObject *kc_topic[16], *kc_qid[16], *kc_key[16];

static PyObject *single_queue_key(PyObject *topic, PyObject *qid) {
    size_t i = (size_t)PyLong_AsSize_t(qid);
    if (i == (size_t)-1 && PyErr_Occurred()) { PyErr_Clear(); i = 0; }
    i &= 15;
    PyObject *t = kc_topic[i];
    if (t != NULL && (t == topic || PyUnicode_Compare(t, topic) == 0) && PyObject_RichCompareBool(kc_qid[i], qid, Py_EQ) == 1)
        return Py_NewRef(kc_key[i]);
    if (PyErr_Occurred()) return NULL;
    PyObject *key = PyUnicode_FromFormat("%U-%S", topic, qid);
    if (key == NULL) return NULL;
    Py_XSETREF(kc_topic[i], Py_NewRef(topic));
    Py_XSETREF(kc_qid[i], Py_NewRef(qid));
    Py_XSETREF(kc_key[i], Py_NewRef(key));
    return key;
}

/* `on_appended(base, end, (req,))` when it is ReputMessageService.notify_appended of some service: what
 * that method does, without its frame: under MAX_PENDING pending requests the record's chunk goes to
 * `_pending` and `_pending_count` grows; the first hand-off since the loop last woke (`_signalled` false)
 * sets `_wakeup`. The chunk of one request is the request itself (notify_appended's too): no chunk tuple
 * and no 1-tuple are made, so a single put leaves one object, untracked, waiting for the reput thread (the
 * collector's allocation count grows by one per put, not three). 1: done; 0: `cb` is something else (the
 * caller calls it); -1: error. */
static PyObject *h_pending, *h_count, *h_signalled, *h_wakeup, *h_append, *h_set;

static int single_handoff(PyObject *cb, PyObject *req) {
    if (notify_fn == NULL || !PyMethod_Check(cb) || PyMethod_GET_FUNCTION(cb) != notify_fn) return 0;
    if (h_set == NULL) {
        const char *names[] = {"_pending", "_pending_count", "_signalled", "_wakeup", "append", "set"};
        PyObject **slots[] = {&h_pending, &h_count, &h_signalled, &h_wakeup, &h_append, &h_set};
        for (int i = 0; i < 6; i++) {
            PyObject *n = PyUnicode_InternFromString(names[i]);
            if (n == NULL) return -1;
            *slots[i] = n;
        }
    }
    PyObject *svc = PyMethod_GET_SELF(cb);
    int64_t count;
    int got = single_attr_i64(svc, h_count, INT64_MIN, INT64_MAX - 1, &count);
    if (got <= 0) return got;  /* not an int: the method itself decides */
    if (count < notify_max_pending) {
        PyObject *pend = sf_get_any(svc, h_pending);
        if (pend == NULL) return -1;
        PyObject *r = PyObject_CallMethodOneArg(pend, h_append, req);
        Py_DECREF(pend);
        if (r == NULL) return -1;
        Py_DECREF(r);
        if (single_set_i64(svc, h_count, count + 1) < 0) return -1;
    }
    PyObject *sig = sf_get_any(svc, h_signalled);
    if (sig == NULL) return -1;
    int is_set = PyObject_IsTrue(sig);
    Py_DECREF(sig);
    if (is_set < 0) return -1;
    if (!is_set) {
        if (sf_set_any(svc, h_signalled, Py_True) < 0) return -1;
        PyObject *ev = sf_get_any(svc, h_wakeup);
        if (ev == NULL) return -1;
        PyObject *r = PyObject_CallMethodNoArgs(ev, h_set);
        Py_DECREF(ev);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 1;
}

/* The steps append_one and append_one_net share; they differ only in how the record is encoded. A put's
 * state: the commit log, its current file, the queue table and key (new references or NULL), where the
 * record goes and the objects of its offset and timestamp. Each step returns 1 (go on), 0 (decline: the
 * caller takes the general path) or -1 (error set); single_end clears the stamp a declined put left and
 * releases the references. */
typedef struct {
    PyObject *cl, *mf, *table, *key, *base_obj, *now_obj;
    PyObject *cb;  /* on_appended, once single_quiet read it */
    int64_t file_size, pos, from, q, base, now;
    int stamped;  /* begin_time_in_lock is set */
} single_put;

/* nargs, the module's init, the message's type and file_size (the last argument) */
static int single_begin(single_put *sp, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t want, const char *name) {
    memset(sp, 0, sizeof *sp);
    if (nargs != want) { PyErr_Format(PyExc_TypeError, "%s takes %d arguments", name, (int)want); return -1; }
    if (message_type == NULL || amr_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_native.init() / single_init() was not called");
        return -1;
    }
    if (single_names() < 0) return -1;
    sp->cl = args[0];
    if (Py_TYPE(args[1]) != message_type || !as_i64(args[want - 1], 1, INT32_MAX, &sp->file_size)) return 0;
    return 1;
}

/* the current file (files[-1]) with room beyond the END_FILE_MIN_BLANK_LENGTH, and the message's queue
 * offset: topic_queue_table[f"{topic}-{queue_id}"], an existing queue */
static int single_locate(single_put *sp, PyObject *msg) {
    PyObject *mfq = sf_get_any(sp->cl, s_mfq);
    if (mfq == NULL) return -1;
    PyObject *files = sf_get_any(mfq, s_mapped_files);
    Py_DECREF(mfq);
    if (files == NULL) return -1;
    if (!PyList_CheckExact(files) || PyList_GET_SIZE(files) == 0) { Py_DECREF(files); return 0; }
    sp->mf = Py_NewRef(PyList_GET_ITEM(files, PyList_GET_SIZE(files) - 1));
    Py_DECREF(files);
    int got = single_attr_i64(sp->mf, s_wrote_position, 0, sp->file_size, &sp->pos);
    if (got <= 0) return got;
    if (sp->file_size - sp->pos <= 8) return 0;  /* END_FILE_MIN_BLANK_LENGTH: the general path rolls */
    PyObject *topic = field(msg, F_TOPIC), *qid = field(msg, F_QUEUE_ID);
    if (topic == NULL || qid == NULL || !PyUnicode_CheckExact(topic) || !PyLong_CheckExact(qid)) return 0;
    sp->table = sf_get_any(sp->cl, s_table);
    if (sp->table == NULL) return -1;
    if (!PyDict_CheckExact(sp->table)) return 0;
    sp->key = single_queue_key(topic, qid);
    if (sp->key == NULL) return -1;
    PyObject *qo = PyDict_GetItemWithError(sp->table, sp->key);
    if (qo == NULL) return PyErr_Occurred() ? -1 : 0;  /* a new queue: the general path */
    if (!PyLong_CheckExact(qo) || !as_i64(qo, 0, INT64_MAX - 1, &sp->q)) return 0;
    got = single_attr_i64(sp->mf, s_file_from_offset, 0, INT64_MAX - sp->file_size, &sp->from);
    if (got <= 0) return got;
    sp->base = sp->from + sp->pos;
    return 1;
}

/* 1 when the hand-off of this put runs no Python code (on_appended is notify_appended, which
 * single_handoff does itself): with the record's encoding running none either, the put holds the GIL from
 * its store timestamp to its end, so no other thread can look at begin_time_in_lock meanwhile and
 * single_stamp need not set it. 0 otherwise, -1 on error. Keeps on_appended for single_publish. */
static int single_quiet(single_put *sp) {
    sp->cb = sf_get_any(sp->cl, s_on_appended);
    if (sp->cb == NULL) return -1;
    return notify_fn != NULL && PyMethod_Check(sp->cb) && PyMethod_GET_FUNCTION(sp->cb) == notify_fn;
}

/* the store timestamp; begin_time_in_lock = now (cleared again by single_end if the put then declines)
 * unless `quiet` (see single_quiet) */
static int single_stamp(single_put *sp, int quiet) {
    sp->now = single_now_ms();
    sp->base_obj = PyLong_FromLongLong(sp->base);
    sp->now_obj = PyLong_FromLongLong(sp->now);
    if (sp->base_obj == NULL || sp->now_obj == NULL) return -1;
    if (!quiet) {
        if (sf_set_any(sp->cl, s_begin_in_lock, sp->now_obj) < 0) return -1;
        sp->stamped = 1;
    }
    return 1;
}

/* the file's write view, held in dst (the caller releases it) when `total` bytes fit at pos; 0 otherwise */
static int single_view(single_put *sp, Py_ssize_t total, Py_buffer *dst) {
    PyObject *view = sf_get_any(sp->mf, s_write_view);
    if (view == NULL) return -1;
    if (PyObject_GetBuffer(view, dst, PyBUF_WRITABLE) < 0) { Py_DECREF(view); return -1; }
    Py_DECREF(view);
    if (sp->pos > dst->len || total > dst->len - sp->pos) { PyBuffer_Release(dst); return 0; }
    return 1;
}

/* The record (`total` bytes, its request `req`) is in the file: publish it as the reference does
 * (wrote_position, store_timestamp, the queue offset), hand it to on_appended, clear the stamp and build
 * the result (store host and port: the context's). A new reference, or NULL with an error set. */
static PyObject *single_publish(single_put *sp, PyObject *req, int64_t total, PyObject *host, PyObject *port) {
    PyObject *nq = PyLong_FromLongLong(sp->q + 1);
    if (nq == NULL || single_set_i64(sp->mf, s_wrote_position, sp->pos + total) < 0 ||
        sf_set_any(sp->mf, s_store_ts, sp->now_obj) < 0 || PyDict_SetItem(sp->table, sp->key, nq) < 0) {
        Py_XDECREF(nq);
        return NULL;
    }
    Py_DECREF(nq);
    PyObject *cb = sp->cb != NULL ? Py_NewRef(sp->cb) : sf_get_any(sp->cl, s_on_appended);
    if (cb == NULL) return NULL;
    if (cb != Py_None) {
        int h = single_handoff(cb, req);  /* the request is untracked (plain_request): never walked while it waits */
        if (h < 0) { Py_DECREF(cb); return NULL; }
        if (h == 0) {
            /* (request,): a tuple of an untracked tuple, so untracked too */
            PyObject *reqs = PyTuple_Pack(1, req), *cres = NULL;
            PyObject *e_obj = PyLong_FromLongLong(sp->base + total);
            if (reqs != NULL && e_obj != NULL) {
                PyObject_GC_UnTrack(reqs);
                PyObject *cargs[3] = {sp->base_obj, e_obj, reqs};
                cres = PyObject_Vectorcall(cb, cargs, 3, NULL);
            }
            Py_XDECREF(reqs); Py_XDECREF(e_obj);
            if (cres == NULL) { Py_DECREF(cb); return NULL; }
            Py_DECREF(cres);
        }
    }
    Py_DECREF(cb);
    if (sp->stamped) {
        sp->stamped = 0;
        if (single_set_i64(sp->cl, s_begin_in_lock, 0) < 0) return NULL;
    }
    /* the request's total (3) and queue offset (6) are the result's; its uniq key (8) too */
    return single_result(sp->base_obj, PyTuple_GET_ITEM(req, 3), sp->now_obj, PyTuple_GET_ITEM(req, 6),
                         single_now_ms() - sp->now, host, port, PyTuple_GET_ITEM(req, 8));
}

/* a put's return: NULL (got < 0), None (got == 0: a stamp it set is cleared, nothing else changed) or result */
static PyObject *single_end(single_put *sp, int got, PyObject *result) {
    if (sp->stamped && got == 0) {
        if (single_set_i64(sp->cl, s_begin_in_lock, 0) < 0) got = -1;
    }
    Py_XDECREF(sp->key); Py_XDECREF(sp->table); Py_XDECREF(sp->base_obj); Py_XDECREF(sp->now_obj);
    Py_XDECREF(sp->mf); Py_XDECREF(sp->cb);
    if (got < 0) { Py_XDECREF(result); return NULL; }
    if (got == 0) { Py_XDECREF(result); Py_RETURN_NONE; }
    return result;
}

static PyObject *append_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    single_put sp;
    int got = single_begin(&sp, args, nargs, 5, "append_one");
    if (got <= 0) return single_end(&sp, got, NULL);
    PyObject *msg = args[1], *u = args[2], *ctx = args[3];
    int64_t port, sys_flag, max_body, max_record;
    if (!PyTuple_CheckExact(ctx) || PyTuple_GET_SIZE(ctx) != 10) { PyErr_SetString(PyExc_TypeError, "ctx must be a 10-tuple"); return NULL; }
    PyObject *topics = PyTuple_GET_ITEM(ctx, 0), *addr = PyTuple_GET_ITEM(ctx, 1);
    PyObject *tags_cache = PyTuple_GET_ITEM(ctx, 6), *tags_fn = PyTuple_GET_ITEM(ctx, 7);
    PyObject *rt = PyTuple_GET_ITEM(ctx, 8);
    if (!PyDict_CheckExact(topics) || !PyBytes_CheckExact(addr) || !PyDict_CheckExact(tags_cache) ||
        !PyType_Check(rt) || !PyType_IsSubtype((PyTypeObject *)rt, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "bad ctx");
        return NULL;
    }
    if (!as_i64(PyTuple_GET_ITEM(ctx, 2), 0, INT32_MAX, &port) || !as_i64(PyTuple_GET_ITEM(ctx, 3), 0, INT32_MAX, &sys_flag) ||
        !as_i64(PyTuple_GET_ITEM(ctx, 4), 0, INT64_MAX, &max_body) ||
        !as_i64(PyTuple_GET_ITEM(ctx, 5), 0, INT64_MAX, &max_record))
        Py_RETURN_NONE;
    Py_ssize_t addr_len = PyBytes_GET_SIZE(addr);
    if (addr_len != 4 && addr_len != 16) Py_RETURN_NONE;
    const Py_ssize_t reserved = PyObject_IsTrue(PyTuple_GET_ITEM(ctx, 9)) == 1 ? CRC_RESERVED : 0;
    const Py_ssize_t hsize = addr_len == 16 ? 112 : 88;

    PyObject *result = NULL, *req = NULL;
    plain_rec r;
    memset(&r, 0, sizeof r);
    got = single_locate(&sp, msg);
    if (got <= 0) goto done;
    got = plain_prepare(msg, u, topics, hsize, reserved, max_body, max_record, &r);
    if (got <= 0) goto done;
    if (r.total > sp.file_size - sp.pos - 8) { got = 0; goto done; }  /* does not fit before the file's end */
    r.q = sp.q;
    got = single_quiet(&sp);
    if (got < 0) goto done;
    got = single_stamp(&sp, got && (r.tags == NULL || r.tags == Py_None));  /* no tags: no tags_fn call */
    if (got < 0) goto done;
    Py_buffer dst;
    got = single_view(&sp, r.total, &dst);
    if (got <= 0) goto done;
    PyObject *sys_obj = PyLong_FromLongLong(sys_flag), *zero = PyLong_FromLong(0);
    PyObject *empty = PyUnicode_New(0, 0);
    if (sys_obj != NULL && zero != NULL && empty != NULL) {
        unsigned char *props = plain_write(&r, (unsigned char *)dst.buf + sp.pos, sp.base, sp.now, PyBytes_AS_STRING(addr),
                                           addr_len, (int)port, (int)sys_flag, reserved);
        req = plain_request(&r, Py_NewRef(sp.base_obj), props, reserved, tags_cache, tags_fn, (PyTypeObject *)rt,
                            sp.now_obj, sys_obj, zero, empty);
    }
    PyBuffer_Release(&dst);
    Py_XDECREF(sys_obj); Py_XDECREF(zero); Py_XDECREF(empty);
    if (req == NULL) { got = -1; goto done; }
    result = single_publish(&sp, req, r.total, addr, PyTuple_GET_ITEM(ctx, 2));
    if (result == NULL) got = -1;
done:
    Py_XDECREF(req); Py_XDECREF(r.keys);
    return single_end(&sp, got, result);
}
/* uniq_create(generator) -> str or None: UniqueIdGenerator.create's fast path (the millisecond of the ids
 * being issued already has its text `_head` and fewer than 65536 ids): under the generator's `_lock`, the
 * same reads and writes of `_time`, `_time_used`, `_counter` as the Python method, and the same id text.
 * A new millisecond (branch send-core) is served too, as `_claim(1)` serves it: its `_head` is `_prefix` +
 * the 8 hex digits of (ms - `_month_start`) mod 2**32, stored with `_head_time`, while the millisecond lies in
 * [`_month_start`, `_next_month`). None, having changed nothing, when the fast path does not apply (a month
 * roll, 65536 ids in the millisecond, unusual slot values: create() then claims). */
/* A threading.Lock taken and released without a method call (issue 16, branch single-put): a single put
 * takes two uncontended locks (the UniqueIdGenerator's and the put lock) and `lock.acquire()` parses its
 * arguments each time. CPython 3.11 / 3.12's _thread.lock is {PyObject_HEAD; PyThread_type_lock lock_lock;
 * PyObject *in_weakreflist; char locked;}: fl_acquire does what acquire() does first (a non-blocking
 * PyThread_acquire_lock, then locked = 1), fl_release what release() does. Used only after fl_check proved
 * that layout on a lock of the running interpreter (its size; acquire() / release() through Python move
 * `locked` and the PyThread lock as expected); otherwise, and when the lock is busy, the methods are called. */
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
#include <pythread.h>
#define FL_LAYOUT 1
typedef struct {
    PyObject_HEAD
    PyThread_type_lock lock_lock;
    PyObject *in_weakreflist;
    char locked;
} fl_lockobject;
#endif
static PyTypeObject *fl_lock_type = NULL;  /* _thread.lock once its layout checked out */
static int fl_checked = 0;
static PyObject *fl_s_acquire, *fl_s_release;

static void fl_check(void) {
    if (fl_checked) return;
    fl_checked = 1;
    fl_s_acquire = PyUnicode_InternFromString("acquire");
    fl_s_release = PyUnicode_InternFromString("release");
    if (fl_s_acquire == NULL || fl_s_release == NULL) { PyErr_Clear(); return; }
#ifdef FL_LAYOUT
    PyObject *mod = PyImport_ImportModule("_thread");
    PyObject *lock = mod != NULL ? PyObject_CallMethod(mod, "allocate_lock", NULL) : NULL;
    Py_XDECREF(mod);
    if (lock == NULL) { PyErr_Clear(); return; }
    fl_lockobject *l = (fl_lockobject *)lock;
    int ok = Py_TYPE(lock)->tp_basicsize == (Py_ssize_t)sizeof(fl_lockobject) && l->lock_lock != NULL && l->locked == 0;
    PyObject *r = ok ? PyObject_CallMethodNoArgs(lock, fl_s_acquire) : NULL;
    if (r != NULL) {
        Py_DECREF(r);
        ok = l->locked == 1 && PyThread_acquire_lock(l->lock_lock, NOWAIT_LOCK) == 0;  /* held: a try fails */
        r = PyObject_CallMethodNoArgs(lock, fl_s_release);
        if (r == NULL) ok = 0;
        Py_XDECREF(r);
        if (ok && l->locked == 0 && PyThread_acquire_lock(l->lock_lock, NOWAIT_LOCK) == 1) {  /* free: a try takes it */
            PyThread_release_lock(l->lock_lock);
            fl_lock_type = (PyTypeObject *)Py_NewRef((PyObject *)Py_TYPE(lock));
        }
    }
    PyErr_Clear();
    Py_DECREF(lock);
#endif
}

/* take `lock`: 0, or -1 with an error set (acquire() raised) */
static int fl_acquire(PyObject *lock) {
#ifdef FL_LAYOUT
    if (Py_TYPE(lock) == fl_lock_type) {
        fl_lockobject *l = (fl_lockobject *)lock;
        if (PyThread_acquire_lock(l->lock_lock, NOWAIT_LOCK) == 1) {
            l->locked = 1;
            return 0;
        }
    }
#endif
    PyObject *r = PyObject_CallMethodNoArgs(lock, fl_s_acquire);  /* busy (it waits, the GIL released), or another type */
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* release `lock`, which this thread took with fl_acquire: 0, or -1 with an error set */
static int fl_release(PyObject *lock) {
#ifdef FL_LAYOUT
    if (Py_TYPE(lock) == fl_lock_type) {
        fl_lockobject *l = (fl_lockobject *)lock;
        l->locked = 0;
        PyThread_release_lock(l->lock_lock);
        return 0;
    }
#endif
    PyObject *r = PyObject_CallMethodNoArgs(lock, fl_s_release);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* The generator's state is in slots (UniqueIdGenerator.__slots__): their offsets, found once for its type
 * (slot_offsets), are read and written directly, not through attribute look-ups (~8 per id, most of this
 * function's cost). A type whose fields are not object slots is declined (create() runs). */
enum { U_LOCK, U_TIME, U_USED, U_HEAD, U_HEAD_TIME, U_COUNTER, U_PREFIX, U_MONTH_START, U_NEXT_MONTH, U_COUNT };
static const char *u_names[U_COUNT] = {"_lock", "_time", "_time_used", "_head", "_head_time", "_counter", "_prefix",
                                       "_month_start", "_next_month"};
static PyTypeObject *u_type = NULL, *u_bad_type = NULL;  /* the last type that had the slots / did not */
static Py_ssize_t u_off[U_COUNT];

#define U_SLOT(o, i) (*(PyObject **)((char *)(o) + u_off[i]))

/* 1: the slots of `tp` are in u_off; 0: `tp` has no such slots (remembered); -1: error */
static int u_slots(PyTypeObject *tp) {
    if (tp == u_type) return 1;
    if (tp == u_bad_type) return 0;
    Py_ssize_t offs[U_COUNT];
    if (slot_offsets((PyObject *)tp, u_names, U_COUNT, offs) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
        PyErr_Clear();
        Py_XSETREF(u_bad_type, (PyTypeObject *)Py_NewRef((PyObject *)tp));
        return 0;
    }
    memcpy(u_off, offs, sizeof offs);
    Py_XSETREF(u_type, (PyTypeObject *)Py_NewRef((PyObject *)tp));
    return 1;
}

/* an int slot in [lo, hi]: 1; 0 when unset or not such an int */
static int u_get(PyObject *gen, int i, int64_t lo, int64_t hi, int64_t *out) {
    PyObject *v = U_SLOT(gen, i);
    return v != NULL && PyLong_CheckExact(v) && as_i64(v, lo, hi, out);
}

static PyObject *uniq_create(PyObject *self, PyObject *gen) {
    int got = u_slots(Py_TYPE(gen));
    if (got < 0) return NULL;
    if (got == 0) Py_RETURN_NONE;
    fl_check();
    int64_t now = single_now_ms();
    PyObject *lock = U_SLOT(gen, U_LOCK);
    if (lock == NULL) Py_RETURN_NONE;
    Py_INCREF(lock);
    if (fl_acquire(lock) < 0) { Py_DECREF(lock); return NULL; }
    /* the slots are read only now: a thread that held the lock may have changed them */
    PyObject *result = NULL, *head = U_SLOT(gen, U_HEAD);
    int64_t t, used, head_t, counter;
    got = u_get(gen, U_TIME, INT64_MIN, INT64_MAX, &t) && u_get(gen, U_USED, 0, INT64_MAX - 1, &used) &&
          u_get(gen, U_HEAD_TIME, INT64_MIN, INT64_MAX, &head_t) && u_get(gen, U_COUNTER, 0, 0xFFFF, &counter) &&
          head != NULL && PyUnicode_CheckExact(head) && PyUnicode_IS_ASCII(head);
    int new_ms = 0;
    PyObject *new_head = NULL, *new_head_t = NULL, *new_t = NULL, *new_used = NULL, *new_counter = NULL;
    static const char hex[] = "0123456789ABCDEF";
    if (got) {
        if (now > t) { t = now; used = 0; new_ms = 1; }
        if (used >= 0x10000) got = 0;  /* the counter would repeat: _claim borrows the next millisecond */
    }
    if (got && t != head_t) {  /* a new millisecond: its head, as _claim(1) makes it (no month roll) */
        PyObject *prefix = U_SLOT(gen, U_PREFIX);
        int64_t ms0, ms1;
        got = u_get(gen, U_MONTH_START, INT64_MIN, INT64_MAX, &ms0) &&
              u_get(gen, U_NEXT_MONTH, INT64_MIN, INT64_MAX, &ms1) && t >= ms0 && t < ms1 &&
              prefix != NULL && PyUnicode_CheckExact(prefix) && PyUnicode_IS_ASCII(prefix);
        if (got) {
            Py_ssize_t pl = PyUnicode_GET_LENGTH(prefix);
            new_head = PyUnicode_New(pl + 8, 127);
            new_head_t = PyLong_FromLongLong(t);
            if (new_head == NULL || new_head_t == NULL) got = -1;
            else {
                char *d = (char *)PyUnicode_1BYTE_DATA(new_head);
                memcpy(d, PyUnicode_1BYTE_DATA(prefix), pl);
                uint32_t diff = (uint32_t)((uint64_t)t - (uint64_t)ms0);
                for (int k = 0; k < 8; k++) d[pl + k] = hex[(diff >> (28 - 4 * k)) & 15];
                head = new_head;
            }
        }
    }
    if (got > 0) {
        Py_ssize_t hl = PyUnicode_GET_LENGTH(head);
        result = PyUnicode_New(hl + 4, 127);
        new_t = new_ms ? PyLong_FromLongLong(t) : NULL;
        new_used = PyLong_FromLongLong(used + 1);
        new_counter = PyLong_FromLongLong((counter + 1) & 0xFFFF);
        if (result == NULL || (new_ms && new_t == NULL) || new_used == NULL || new_counter == NULL) got = -1;
        else {
            char *d = (char *)PyUnicode_1BYTE_DATA(result);
            memcpy(d, PyUnicode_1BYTE_DATA(head), hl);
            unsigned c = (unsigned)counter;
            d[hl] = hex[c >> 12]; d[hl + 1] = hex[(c >> 8) & 15]; d[hl + 2] = hex[(c >> 4) & 15]; d[hl + 3] = hex[c & 15];
            /* commit, nothing left to fail: the state the Python path leaves (_time written only when it
             * moves; _head and _head_time only for a new millisecond) */
            if (new_ms) Py_XSETREF(U_SLOT(gen, U_TIME), Py_NewRef(new_t));
            Py_XSETREF(U_SLOT(gen, U_USED), Py_NewRef(new_used));
            Py_XSETREF(U_SLOT(gen, U_COUNTER), Py_NewRef(new_counter));
            if (new_head != NULL) {
                Py_XSETREF(U_SLOT(gen, U_HEAD), Py_NewRef(new_head));
                Py_XSETREF(U_SLOT(gen, U_HEAD_TIME), Py_NewRef(new_head_t));
            }
        }
    }
    Py_XDECREF(new_head); Py_XDECREF(new_head_t); Py_XDECREF(new_t); Py_XDECREF(new_used); Py_XDECREF(new_counter);
    if (fl_release(lock) < 0) got = -1;
    Py_DECREF(lock);
    if (got <= 0) {
        Py_XDECREF(result);
        if (got < 0) return NULL;
        Py_RETURN_NONE;
    }
    return result;
}

/* take_requests(pending, popleft, offset, limit, room, out) -> (offset, taken): ReputMessageService.
 * _take_pending's walk over a run of request chunks: (start, end, requests) tuples, or a single put's request
 * alone (a tuple subclass, the DispatchRequest: from its commit_log_offset to that plus its msg_size): while
 * the first chunk starts at `offset`, ends by `limit` and holds requests (a non-empty list or tuple), and
 * fewer than `room` were taken: its requests go to `out`, it is popped, `offset` moves to its end. Anything
 * else (a BLANK, columns, a gap) stops the walk; the Python loop decides what it is. */
static PyObject *take_requests(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyList_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "take_requests(pending, popleft, offset, limit, room, out)");
        return NULL;
    }
    PyObject *pend = args[0], *popleft = args[1], *out = args[5];
    int64_t offset, limit, room;
    if (!as_i64(args[2], INT64_MIN, INT64_MAX, &offset) || !as_i64(args[3], INT64_MIN, INT64_MAX, &limit) ||
        !as_i64(args[4], INT64_MIN, INT64_MAX, &room)) {
        PyErr_SetString(PyExc_TypeError, "offset, limit and room must be ints");
        return NULL;
    }
    Py_ssize_t taken = 0;
    while (taken < room) {
        Py_ssize_t n = PyObject_Length(pend);
        if (n < 0) { return NULL; }
        if (n == 0) break;
        PyObject *chunk = PySequence_GetItem(pend, 0);
        if (chunk == NULL) { return NULL; }
        int64_t start, end, size;
        PyObject *reqs;
        if (PyTuple_Check(chunk) && !PyTuple_CheckExact(chunk)) {  /* a request alone */
            if (PyTuple_GET_SIZE(chunk) < 4 || !as_i64(PyTuple_GET_ITEM(chunk, 2), 0, INT64_MAX / 2, &start) ||
                !as_i64(PyTuple_GET_ITEM(chunk, 3), 1, INT32_MAX, &size) || start != offset || start + size > limit) {
                Py_DECREF(chunk);
                break;
            }
            if (PyList_Append(out, chunk) < 0) { Py_DECREF(chunk); return NULL; }
            Py_DECREF(chunk);
            PyObject *popped = PyObject_CallNoArgs(popleft);
            if (popped == NULL) { return NULL; }
            Py_DECREF(popped);
            offset = start + size;
            taken += 1;
            continue;
        }
        if (!PyTuple_CheckExact(chunk) || PyTuple_GET_SIZE(chunk) != 3 ||
            !as_i64(PyTuple_GET_ITEM(chunk, 0), INT64_MIN, INT64_MAX, &start) ||
            !as_i64(PyTuple_GET_ITEM(chunk, 1), INT64_MIN, INT64_MAX, &end) || start != offset || end > limit ||
            end <= offset) {
            Py_DECREF(chunk);
            break;
        }
        reqs = PyTuple_GET_ITEM(chunk, 2);
        Py_ssize_t k = (PyTuple_CheckExact(reqs) || PyList_CheckExact(reqs)) ? PySequence_Fast_GET_SIZE(reqs) : 0;
        if (k == 0) { Py_DECREF(chunk); break; }
        PyObject **items = PySequence_Fast_ITEMS(reqs);
        for (Py_ssize_t i = 0; i < k; i++) {
            if (PyList_Append(out, items[i]) < 0) { Py_DECREF(chunk); return NULL; }
        }
        Py_DECREF(chunk);
        PyObject *popped = PyObject_CallNoArgs(popleft);
        if (popped == NULL) { return NULL; }
        Py_DECREF(popped);
        offset = end;
        taken += k;
    }
    return Py_BuildValue("(Ln)", (long long)offset, taken);
}

/* end of the single put block                                                                     */
/* ---------------------------------------------------------------------------------------------- */
/* ============================================================================================== */
/* THE BATCH SEND (issue 16, branch send-batch): SEND_BATCH_MESSAGE's per-message work on both ends */
/*  decode_batch_messages: the broker's decode of a batch body into Messages                       */
/*                         (codec.decode_batch_messages_py: decode_batch_body + Message per entry) */
/*  join_message_ids:      the response's comma-joined offsetMsgIds (message_id.join_message_ids_py) */
/*  encode_batch_body:     the client's batch body (codec.encode_batch_body_py)                     */
/*  encode_batch_messages: the client's properties + batch body of Messages (Producer._batch_body_py) */
/*  decorate_batch:        the broker's CLUSTER property, topic and queue of a plain batch (_store)  */
/* Each returns None where the Python reference must decide (it raises the same error it always did). */
/* ============================================================================================== */

/* decode_batch_messages(data, topic, queue_id, sys_flag, born_timestamp, born_host, reconsume_times)
 * -> [Message(topic=topic, body=b, queue_id=queue_id, flag=f, properties_string=p, sys_flag=sys_flag,
 *             born_timestamp=born_timestamp, born_host=born_host, reconsume_times=reconsume_times)]
 * for each (b, f, p) of the batch body; ValueError (the reference's text) when malformed; None when the
 * Message slots are not bound or data is not bytes. The header values are stored as given, as the
 * Message constructor would. */
static PyObject *decode_batch_messages(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "decode_batch_messages takes 7 arguments");
        return NULL;
    }
    PyObject *data = args[0], *topic = args[1], *queue_id = args[2], *sys_flag = args[3], *born_ts = args[4],
             *born_host = args[5], *reconsume = args[6];
    if (message_type == NULL || !PyBytes_CheckExact(data)) Py_RETURN_NONE;
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
    int64_t n = PyBytes_GET_SIZE(data);
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    PyObject *zero = PyLong_FromLong(0);
    int64_t pos = 0;
    while (pos < n) {
        if (n - pos < 22) {
            PyErr_Format(PyExc_ValueError, "batch body truncated at %lld", (long long)pos);
            goto fail;
        }
        const unsigned char *p = d + pos;
        int64_t size = get_i32(p), blen = get_i32(p + 16);
        int32_t flag = get_i32(p + 12);
        if (size < 22 || pos + size > n || blen < 0 || 20 + blen + 2 > size) {
            PyErr_Format(PyExc_ValueError, "bad inner message size at %lld", (long long)pos);
            goto fail;
        }
        int64_t plen = get_i16(p + 20 + blen);
        if (plen < 0 || 22 + blen + plen != size) {
            PyErr_Format(PyExc_ValueError, "bad inner properties length at %lld", (long long)pos);
            goto fail;
        }
        PyObject *body = PyBytes_FromStringAndSize((const char *)p + 20, (Py_ssize_t)blen);
        if (body == NULL) goto fail;
        PyObject *props = PyUnicode_DecodeUTF8((const char *)p + 22 + blen, (Py_ssize_t)plen, "replace");
        if (props == NULL) { Py_DECREF(body); goto fail; }
        PyObject *fl = PyLong_FromLong(flag);
        if (fl == NULL) { Py_DECREF(body); Py_DECREF(props); goto fail; }
        PyObject *m = message_type->tp_alloc(message_type, 0);
        if (m == NULL) { Py_DECREF(body); Py_DECREF(props); Py_DECREF(fl); goto fail; }
        PyObject *v[F_COUNT];
        v[F_TOPIC] = Py_NewRef(topic);
        v[F_BODY] = body;
        v[F_TAGS] = Py_NewRef(Py_None);
        v[F_KEYS] = Py_NewRef(Py_None);
        v[F_QUEUE_ID] = Py_NewRef(queue_id);
        v[F_FLAG] = fl;
        v[F_PROPERTIES] = Py_NewRef(Py_None);
        v[F_SYS_FLAG] = Py_NewRef(sys_flag);
        v[F_BORN_TIMESTAMP] = Py_NewRef(born_ts);
        v[F_BORN_HOST] = Py_NewRef(born_host);
        v[F_RECONSUME_TIMES] = Py_NewRef(reconsume);
        v[F_PREPARED_TX] = Py_NewRef(zero);
        v[F_PROPERTIES_STRING] = props;
        v[F_UNIQ_KEY] = Py_NewRef(Py_None);
        v[F_FORCE_V2] = Py_NewRef(Py_False);
        for (int f = 0; f < F_COUNT; f++) *(PyObject **)((char *)m + field_offsets[f]) = v[f];
        int r = PyList_Append(out, m);
        Py_DECREF(m);
        if (r < 0) goto fail;
        pos += size;
    }
    Py_DECREF(zero);
    return out;
fail:
    Py_DECREF(zero);
    Py_DECREF(out);
    return NULL;
}

/* join_message_ids(store_host, port, offsets) -> ",".join(create_message_id(store_host, port, o) for o in
 * offsets): upper-case hex of host + port (int32) + offset (int64) per id; None when port or an offset
 * does not fit (the reference raises struct.error) or offsets is not a list of ints. */
static PyObject *join_message_ids(PyObject *self, PyObject *args) {
    Py_buffer host;
    long long port;
    PyObject *offs;
    if (!PyArg_ParseTuple(args, "y*LO", &host, &port, &offs)) return NULL;
    PyObject *result = NULL;
    if (!PyList_CheckExact(offs) || port < INT32_MIN || port > INT32_MAX) { result = Py_NewRef(Py_None); goto done; }
    Py_ssize_t k = PyList_GET_SIZE(offs);
    Py_ssize_t idlen = 2 * (host.len + 12);
    if (k == 0) { result = PyUnicode_New(0, 127); goto done; }
    Py_ssize_t total = k * idlen + (k - 1);
    PyObject *s = PyUnicode_New(total, 127);
    if (s == NULL) goto done;
    char *w = (char *)PyUnicode_1BYTE_DATA(s);
    static const char hex[] = "0123456789ABCDEF";
    /* the host + port prefix is the same for every id */
    char *prefix = w;
    const unsigned char *h = (const unsigned char *)host.buf;
    for (Py_ssize_t j = 0; j < host.len; j++) { *w++ = hex[h[j] >> 4]; *w++ = hex[h[j] & 15]; }
    unsigned char pb[4];
    put_i32(pb, (int32_t)port);
    for (int j = 0; j < 4; j++) { *w++ = hex[pb[j] >> 4]; *w++ = hex[pb[j] & 15]; }
    Py_ssize_t plen = w - prefix;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *o = PyList_GET_ITEM(offs, i);
        int64_t off;
        if (!as_i64(o, INT64_MIN, INT64_MAX, &off)) { Py_DECREF(s); result = Py_NewRef(Py_None); goto done; }
        if (i > 0) { *w++ = ','; memcpy(w, prefix, plen); w += plen; }
        unsigned char ob[8];
        put_i64(ob, off);
        for (int j = 0; j < 8; j++) { *w++ = hex[ob[j] >> 4]; *w++ = hex[ob[j] & 15]; }
    }
    result = s;
done:
    PyBuffer_Release(&host);
    return result;
}

/* encode_batch_body(parts) -> b"".join(per (body, flag, props): [size][magic 0][crc 0][flag][bodyLen]
 * [body][propLen][props utf-8]); None when an entry is not (bytes, int, str), props do not encode strictly,
 * or a length or the flag does not fit its field (the reference raises the same error as before). */
static PyObject *encode_batch_body(PyObject *self, PyObject *parts) {
    if (!PyList_CheckExact(parts)) Py_RETURN_NONE;
    Py_ssize_t k = PyList_GET_SIZE(parts);
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *t = PyList_GET_ITEM(parts, i);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 3) Py_RETURN_NONE;
        PyObject *body = PyTuple_GET_ITEM(t, 0), *flag = PyTuple_GET_ITEM(t, 1), *ps = PyTuple_GET_ITEM(t, 2);
        int64_t f;
        if (!PyBytes_CheckExact(body) || !PyUnicode_CheckExact(ps) || !as_i64(flag, INT32_MIN, INT32_MAX, &f))
            Py_RETURN_NONE;
        Py_ssize_t pl;
        if (PyUnicode_IS_ASCII(ps)) {
            pl = PyUnicode_GET_LENGTH(ps);
        } else {
            const char *u = PyUnicode_AsUTF8AndSize(ps, &pl);  /* cached on the str; fails on a surrogate */
            if (u == NULL) { PyErr_Clear(); Py_RETURN_NONE; }
        }
        int64_t size = 22 + (int64_t)PyBytes_GET_SIZE(body) + pl;
        if (pl > 32767 || size > INT32_MAX) Py_RETURN_NONE;
        total += size;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (out == NULL) return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *t = PyList_GET_ITEM(parts, i);
        PyObject *body = PyTuple_GET_ITEM(t, 0), *ps = PyTuple_GET_ITEM(t, 2);
        Py_ssize_t bl = PyBytes_GET_SIZE(body), pl;
        const char *u = PyUnicode_AsUTF8AndSize(ps, &pl);  /* checked above */
        put_i32(w, (int32_t)(22 + bl + pl));
        memset(w + 4, 0, 8);
        put_i32(w + 12, (int32_t)PyLong_AsLong(PyTuple_GET_ITEM(t, 1)));
        put_i32(w + 16, (int32_t)bl);
        memcpy(w + 20, PyBytes_AS_STRING(body), bl);
        put_i16(w + 20 + bl, (int)pl);
        memcpy(w + 22 + bl, u, pl);
        w += 22 + bl + pl;
    }
    return out;
}
/* encode_batch_messages(msgs, uniqs) -> (batch body, [UNIQ_KEY per message]) or None
 * Producer.send_batch's loop (Producer._batch_body_py, the reference) for Messages without a
 * properties_string: per message the properties build_properties_string gives (TAGS, KEYS, UNIQ_KEY =
 * msg.uniq_key or uniqs[i], then the `properties` dict) plus WAIT=true when no "WAIT\x01" is in them, and the
 * inner message of encode_batch_body. None (nothing done) for anything else: a properties_string, a
 * non-Message, a field of another type than the common ones (str tags, str or list/tuple keys, dict of str
 * properties, bytes body, int32 flag), a surrogate, a properties length over 32767. */
typedef struct { unsigned char *p; Py_ssize_t len, cap; } bsbuf;
static int bs_reserve(bsbuf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    unsigned char *q = PyMem_Realloc(b->p, cap);
    if (q == NULL) { PyErr_NoMemory(); return -1; }
    b->p = q; b->cap = cap;
    return 0;
}
static int bs_put(bsbuf *b, const void *s, Py_ssize_t n) {
    if (bs_reserve(b, n) < 0) return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    return 0;
}
/* 1: appended name \x01 utf8(value) \x02; 0: not coverable (surrogate); -1: error */
static int bs_prop(bsbuf *b, const char *name, Py_ssize_t nl, PyObject *value) {
    Py_ssize_t vl;
    const char *v = PyUnicode_AsUTF8AndSize(value, &vl);
    if (v == NULL) { PyErr_Clear(); return 0; }
    if (bs_reserve(b, nl + vl + 2) < 0) return -1;
    memcpy(b->p + b->len, name, nl); b->len += nl;
    b->p[b->len++] = 1;
    memcpy(b->p + b->len, v, vl); b->len += vl;
    b->p[b->len++] = 2;
    return 1;
}
static int bs_has_wait(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i + 5 <= n; i++)
        if (p[i] == 'W' && memcmp(p + i, "WAIT\x01", 5) == 0) return 1;
    return 0;
}

static PyObject *encode_batch_messages(PyObject *self, PyObject *args) {
    PyObject *msgs, *uniqs;
    if (!PyArg_ParseTuple(args, "OO", &msgs, &uniqs)) return NULL;
    if (message_type == NULL || !(PyList_CheckExact(msgs) || PyTuple_CheckExact(msgs)) || !PyList_CheckExact(uniqs)
        || PySequence_Fast_GET_SIZE(msgs) != PyList_GET_SIZE(uniqs))
        Py_RETURN_NONE;
    Py_ssize_t k = PySequence_Fast_GET_SIZE(msgs);
    PyObject **items = PySequence_Fast_ITEMS(msgs);
    bsbuf b = {NULL, 0, 0};
    PyObject *ids = PyList_New(k);
    if (ids == NULL) return NULL;
    int r;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *m = items[i];
        if (Py_TYPE(m) != message_type) goto uncovered;
        PyObject *body = field(m, F_BODY), *flag = field(m, F_FLAG), *ps = field(m, F_PROPERTIES_STRING),
                 *tags = field(m, F_TAGS), *keys = field(m, F_KEYS), *props = field(m, F_PROPERTIES),
                 *uk = field(m, F_UNIQ_KEY), *u = PyList_GET_ITEM(uniqs, i);
        int64_t fl;
        if (body == NULL || flag == NULL || ps == NULL || tags == NULL || keys == NULL || props == NULL || uk == NULL
            || ps != Py_None || !PyBytes_CheckExact(body) || !as_i64(flag, INT32_MIN, INT32_MAX, &fl))
            goto uncovered;
        /* uniq = msg.uniq_key or u */
        PyObject *uniq;
        if (uk == Py_None) uniq = u;
        else if (PyUnicode_CheckExact(uk)) uniq = PyUnicode_GET_LENGTH(uk) ? uk : u;
        else goto uncovered;
        if (!PyUnicode_CheckExact(uniq)) goto uncovered;
        Py_ssize_t bl = PyBytes_GET_SIZE(body), start = b.len;
        if (bs_reserve(&b, 20) < 0) goto fail;
        b.len += 20;
        if (bs_put(&b, PyBytes_AS_STRING(body), bl) < 0 || bs_reserve(&b, 2) < 0) goto fail;
        b.len += 2;
        Py_ssize_t pstart = b.len;
        if (tags != Py_None) {
            if (!PyUnicode_CheckExact(tags)) goto uncovered;
            if (PyUnicode_GET_LENGTH(tags) && (r = bs_prop(&b, "TAGS", 4, tags)) <= 0) { if (r < 0) goto fail; goto uncovered; }
        }
        if (keys != Py_None) {
            PyObject *kj;
            if (PyUnicode_CheckExact(keys)) {
                kj = Py_NewRef(keys);
            } else if (PyList_CheckExact(keys) || PyTuple_CheckExact(keys)) {
                if (PySequence_Fast_GET_SIZE(keys) == 0) kj = NULL;
                else {
                    PyObject **ki = PySequence_Fast_ITEMS(keys);
                    for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(keys); j++)
                        if (!PyUnicode_CheckExact(ki[j])) goto uncovered;
                    static PyObject *space = NULL;
                    if (space == NULL && (space = PyUnicode_FromString(" ")) == NULL) goto fail;
                    kj = PyUnicode_Join(space, keys);
                    if (kj == NULL) goto fail;
                }
            } else {
                goto uncovered;
            }
            if (kj != NULL) {
                r = PyUnicode_GET_LENGTH(kj) ? bs_prop(&b, "KEYS", 4, kj) : 1;
                Py_DECREF(kj);
                if (r < 0) goto fail;
                if (r == 0) goto uncovered;
            }
        }
        if (PyUnicode_GET_LENGTH(uniq) && (r = bs_prop(&b, "UNIQ_KEY", 8, uniq)) <= 0) { if (r < 0) goto fail; goto uncovered; }
        if (props != Py_None) {
            if (!PyDict_CheckExact(props)) goto uncovered;
            Py_ssize_t dp = 0;
            PyObject *dk, *dv;
            while (PyDict_Next(props, &dp, &dk, &dv)) {
                if (dv == Py_None) continue;
                if (!PyUnicode_CheckExact(dk) || !PyUnicode_CheckExact(dv)) goto uncovered;
                if (PyUnicode_CompareWithASCIIString(dk, "TAGS") == 0 || PyUnicode_CompareWithASCIIString(dk, "KEYS") == 0
                    || PyUnicode_CompareWithASCIIString(dk, "UNIQ_KEY") == 0)
                    continue;
                Py_ssize_t kl;
                const char *kn = PyUnicode_AsUTF8AndSize(dk, &kl);
                if (kn == NULL) { PyErr_Clear(); goto uncovered; }
                if ((r = bs_prop(&b, kn, kl, dv)) <= 0) { if (r < 0) goto fail; goto uncovered; }
            }
        }
        if (!bs_has_wait(b.p + pstart, b.len - pstart) && bs_put(&b, "WAIT\x01true\x02", 10) < 0) goto fail;
        Py_ssize_t pl = b.len - pstart;
        int64_t size = 22 + (int64_t)bl + pl;
        if (pl > 32767 || size > INT32_MAX) goto uncovered;
        unsigned char *h = b.p + start;
        put_i32(h, (int32_t)size);
        memset(h + 4, 0, 8);
        put_i32(h + 12, (int32_t)fl);
        put_i32(h + 16, (int32_t)bl);
        put_i16(h + 20 + bl, (int)pl);
        PyList_SET_ITEM(ids, i, Py_NewRef(uniq));
    }
    PyObject *data = PyBytes_FromStringAndSize((const char *)b.p, b.len);
    PyMem_Free(b.p);
    if (data == NULL) { Py_DECREF(ids); return NULL; }
    PyObject *res = PyTuple_Pack(2, data, ids);
    Py_DECREF(data);
    Py_DECREF(ids);
    return res;
uncovered:
    PyMem_Free(b.p);
    Py_DECREF(ids);
    Py_RETURN_NONE;
fail:
    PyMem_Free(b.p);
    Py_DECREF(ids);
    return NULL;
}
/* decorate_batch(msgs, topic, queue_id, uniq_marker, cluster_marker, cluster) -> True, or False (nothing
 * changed) where SendMessageProcessor._store's loop must decide. The loop for a plain batch (not prepared,
 * one queue): each message gets `topic` and `queue_id`, and its properties the CLUSTER property (`cluster`:
 * marker + value + separator, after a separator when they do not end with one) when `cluster_marker` is not
 * in them. False when a message is not a Message, has properties other than a str or None, lacks
 * `uniq_marker` (None: UNIQ_KEYs are not created), or would end with properties holding "TIMER_" or
 * "DELAY" (timer and delay messages go through the loop). */
static PyObject *decorate_batch(PyObject *self, PyObject *args) {
    PyObject *msgs, *topic, *queue_id, *uniq_marker, *cluster_marker, *cluster;
    if (!PyArg_ParseTuple(args, "O!OOOUU", &PyList_Type, &msgs, &topic, &queue_id, &uniq_marker, &cluster_marker,
                          &cluster))
        return NULL;
    if (message_type == NULL || (uniq_marker != Py_None && !PyUnicode_CheckExact(uniq_marker))) Py_RETURN_FALSE;
    static PyObject *timer_s = NULL, *delay_s = NULL, *sep = NULL;
    if (timer_s == NULL) {
        timer_s = PyUnicode_InternFromString("TIMER_");
        delay_s = PyUnicode_InternFromString("DELAY");
        sep = PyUnicode_InternFromString("\x02");
        if (timer_s == NULL || delay_s == NULL || sep == NULL) return NULL;
    }
    Py_ssize_t k = PyList_GET_SIZE(msgs);
    PyObject *news = PyList_New(k);
    if (news == NULL) return NULL;
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        if (Py_TYPE(m) != message_type) goto uncovered;
        PyObject *ps = field(m, F_PROPERTIES_STRING);
        if (ps == NULL || (ps != Py_None && !PyUnicode_CheckExact(ps))) goto uncovered;
        PyObject *props = ps == Py_None ? PyUnicode_New(0, 0) : Py_NewRef(ps);
        if (props == NULL) goto done;
        PyList_SET_ITEM(news, i, props);
        int c;
        if (uniq_marker != Py_None) {
            if ((c = PyUnicode_Contains(props, uniq_marker)) < 0) goto done;
            if (!c) goto uncovered;
        }
        if ((c = PyUnicode_Contains(props, cluster_marker)) < 0) goto done;
        if (!c) {
            Py_ssize_t n = PyUnicode_GET_LENGTH(props);
            if (n && PyUnicode_READ_CHAR(props, n - 1) != 2) {
                PyObject *t = PyUnicode_Concat(props, sep);
                if (t == NULL) goto done;
                PyList_SET_ITEM(news, i, t);
                Py_DECREF(props);
                props = t;
            }
            PyObject *t = PyUnicode_Concat(props, cluster);
            if (t == NULL) goto done;
            PyList_SET_ITEM(news, i, t);
            Py_DECREF(props);
            props = t;
        }
        if ((c = PyUnicode_Contains(props, timer_s)) < 0) goto done;
        if (c) goto uncovered;
        if ((c = PyUnicode_Contains(props, delay_s)) < 0) goto done;
        if (c) goto uncovered;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        PyObject **slot;
        slot = (PyObject **)((char *)m + field_offsets[F_TOPIC]);
        Py_XSETREF(*slot, Py_NewRef(topic));
        slot = (PyObject **)((char *)m + field_offsets[F_QUEUE_ID]);
        Py_XSETREF(*slot, Py_NewRef(queue_id));
        slot = (PyObject **)((char *)m + field_offsets[F_PROPERTIES_STRING]);
        Py_XSETREF(*slot, Py_NewRef(PyList_GET_ITEM(news, i)));
    }
    result = Py_NewRef(Py_True);
    goto done;
uncovered:
    result = Py_NewRef(Py_False);
done:
    Py_DECREF(news);
    return result;
}
/* ==================================== end of THE BATCH SEND ==================================== */

/* ============================================================================================== */
/* THE NETWORK SINGLE PUT (issue 16, branch send-single): the broker's SEND_MESSAGE(_V2) store      */
/*  append_one_net: CommitLog._append_one_net's locked body for one message that carries a          */
/*                  properties string (what a producer sent): encode_network_batch's record written */
/*                  straight into the current file, then the steps it shares with append_one        */
/*                  (single_locate, single_stamp, single_view, single_publish, single_end).         */
/*                  Reference: CommitLog._append_one_net_py (taken under RMQ_EVENTSTORE_PURE=1).    */
/* ============================================================================================== */

/* append_one_net(commit_log, msg, netctx, file_size) -> PutMessageResult(PUT_OK, AppendMessageResult) or None.
 * The caller holds the put lock. netctx = (topics, store addr, store port, max body, max record, tags
 * cache, tags fn, request type, parse_host, SCHEDULE_TOPIC, append_crc): encode_network_batch's fixed
 * arguments (RecordEncoder.network_context). Taken only for a current file with room for the record before
 * its last 8 bytes and an existing queue, and a message encode_network_batch covers; None, with nothing
 * changed, for anything else (the caller then takes `_append_plain`). */
static int sc_append_net(single_put *sp, PyObject *m, const net_ctx *ctx, PyObject *netctx,
                         PyObject **result);  /* THE SEND CORE (branch send-core2), above the table */
static PyObject *append_one_net(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    single_put sp;
    int got = single_begin(&sp, args, nargs, 4, "append_one_net");
    if (got <= 0) return single_end(&sp, got, NULL);
    PyObject *msg = args[1], *ctx = args[2];
    if (!PyTuple_CheckExact(ctx) || PyTuple_GET_SIZE(ctx) != 11) { PyErr_SetString(PyExc_TypeError, "netctx must be an 11-tuple"); return NULL; }
    PyObject *result = NULL;
    got = single_locate(&sp, msg);
    if (got <= 0) goto done;
    got = single_stamp(&sp, 0);  /* encode_network_batch may call Python (tags, born host) */
    if (got < 0) goto done;
    /* encode_network_batch((msg,), table, base, now, *netctx), without building and parsing its arguments */
    net_ctx nc;
    if (!PyDict_Check(sp.table)) {  /* what the O! of encode_network_batch checked */
        PyErr_SetString(PyExc_TypeError, "the queue table must be a dict");
        got = -1; goto done;
    }
    if (net_ctx_of(ctx, &nc) < 0) { got = -1; goto done; }
    /* the record written straight into the file, its request, single_publish (THE SEND CORE, branch send-core2) */
    got = sc_append_net(&sp, msg, &nc, ctx, &result);
done:
    return single_end(&sp, got, result);
}
/* ============================ end of THE NETWORK SINGLE PUT ==================================== */

/* ---------------------------------------------------------------------------------------------- */
/* put_one(commit_log, msg, uniq_ids, encoder, put_lock, file_size, flush_wakeup) (issue 16, branch     */
/* single-put): CommitLog.put_message's native path in one call, for a store the caller found          */
/* writeable and not SYNC_FLUSH, so a single put runs one Python frame (MessageStore.put_message)       */
/* around it: the UNIQ_KEY (uniq_create, else uniq_ids.create(); none when uniq_ids is None: the store */
/* does not add them), the put lock, append_one or append_one_net under it (the encoder's plain or      */
/* network context), then flush_wakeup() unless it is None. The caller passes the commit log's own      */
/* attributes (read in Python: cheaper than from C). Returns                                           */
/*  - None, having done nothing: not a Message (the caller runs CommitLog.put_message's Python path);   */
/*  - (uniq,): the locked body declined (a file to roll, a new queue, ...); nothing changed but the     */
/*    UNIQ_KEY it drew, which the caller's general path (CommitLog.put_declined) then uses;              */
/*  - the PutMessageResult of the record written.                                                       */
/* The same steps, in the same order, as CommitLog.put_message's native path.                           */
static PyObject *po_create, *po_plain_ctx, *po_plain_context, *po_net_ctx, *po_network_context;

static PyObject *po_ctx(PyObject *enc, PyObject *attr, PyObject *builder) {  /* encoder.<attr> or encoder.<builder>() */
    PyObject *ctx = PyObject_GetAttr(enc, attr);
    if (ctx != NULL && (ctx == Py_None || (PyTuple_CheckExact(ctx) && PyTuple_GET_SIZE(ctx) == 0))) {
        Py_DECREF(ctx);
        ctx = PyObject_CallMethodNoArgs(enc, builder);
    }
    return ctx;
}

static PyObject *put_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "put_one(commit_log, msg, uniq_ids, encoder, put_lock, file_size, flush_wakeup)");
        return NULL;
    }
    if (po_network_context == NULL) {
        const char *names[] = {"create", "_plain_ctx", "plain_context", "_net_ctx", "network_context"};
        PyObject **slots[] = {&po_create, &po_plain_ctx, &po_plain_context, &po_net_ctx, &po_network_context};
        for (int i = 0; i < 5; i++) {
            PyObject *n = PyUnicode_InternFromString(names[i]);
            if (n == NULL) return NULL;
            *slots[i] = n;
        }
    }
    PyObject *cl = args[0], *msg = args[1], *gen = args[2], *enc = args[3], *lock = args[4], *fsize = args[5];
    PyObject *wake = args[6];
    if (message_type == NULL || amr_type == NULL || Py_TYPE(msg) != message_type) Py_RETURN_NONE;
    PyObject *props = field(msg, F_PROPERTIES_STRING), *uk = field(msg, F_UNIQ_KEY);
    int plain = props == NULL || props == Py_None;
    PyObject *uniq;
    if (plain && (uk == NULL || uk == Py_None) && gen != Py_None) {
        uniq = uniq_create(NULL, gen);
        if (uniq == Py_None) { Py_DECREF(uniq); uniq = PyObject_CallMethodNoArgs(gen, po_create); }
        if (uniq == NULL) return NULL;
    } else {
        uniq = Py_NewRef(Py_None);
    }
    PyObject *ctx = plain ? po_ctx(enc, po_plain_ctx, po_plain_context) : po_ctx(enc, po_net_ctx, po_network_context);
    if (ctx == NULL) { Py_DECREF(uniq); return NULL; }
    PyObject *res = NULL;
    fl_check();
    if (fl_acquire(lock) == 0) {
        if (plain) {
            PyObject *a[5] = {cl, msg, uniq, ctx, fsize};
            res = append_one(NULL, a, 5);
        } else {
            PyObject *a[4] = {cl, msg, ctx, fsize};
            res = append_one_net(NULL, a, 4);
        }
        /* release the lock whatever happened, keeping an error the body raised */
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        if (fl_release(lock) < 0) {
            Py_CLEAR(res);
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(tb);
        } else {
            PyErr_Restore(et, ev, tb);
        }
    }
    Py_DECREF(ctx);
    if (res == NULL) { Py_DECREF(uniq); return NULL; }
    if (res == Py_None) {  /* declined: the caller's general path, with the UNIQ_KEY drawn */
        Py_DECREF(res);
        PyObject *t = PyTuple_Pack(1, uniq);
        Py_DECREF(uniq);
        return t;
    }
    Py_DECREF(uniq);
    if (wake != Py_None) {
        PyObject *r = PyObject_CallNoArgs(wake);
        if (r == NULL) { Py_DECREF(res); return NULL; }
        Py_DECREF(r);
    }
    return res;
}

/* POP receipt handles (client/pop_consumer.py): the per-message loops of PopConsumer.pop (append    */
/* each message's POP_CK handle to its unparsed properties string) and of _ack_requests (read the    */
/* handle back and add the message's bit to its BatchAck). Each stops at the first message it does  */
/* not handle and returns its index: the Python reference (pop_set_handles_py, pop_ack_scan_py)      */
/* does that one, then calls again. Generic attribute access (MessageExt has __slots__).             */
/* ============================================================================================== */

static PyObject *ph_s_topic, *ph_s_props, *ph_s_parsed, *ph_s_qid, *ph_s_qoff, *ph_sep, *ph_empty;

static int ph_init_names(void) {
    if (ph_s_topic != NULL)
        return 0;
    if (!(ph_s_topic = PyUnicode_InternFromString("topic")) || !(ph_s_props = PyUnicode_InternFromString("properties_string"))
        || !(ph_s_parsed = PyUnicode_InternFromString("_properties")) || !(ph_s_qid = PyUnicode_InternFromString("queue_id"))
        || !(ph_s_qoff = PyUnicode_InternFromString("queue_offset")) || !(ph_sep = PyUnicode_FromOrdinal(2))
        || !(ph_empty = PyUnicode_FromString("")))
        return -1;
    return 0;
}

/* The attributes both loops read, in place when `cls` is a plain __slots__ class (generic attribute access,
   object slots: MessageExt): bound once per class, read only from messages whose type is exactly `cls`. */
enum { PH_TOPIC, PH_PROPS, PH_PARSED, PH_QID, PH_QOFF, PH_N };
static const char *const ph_slot_names[PH_N] = {"topic", "properties_string", "_properties", "queue_id",
                                                "queue_offset"};
static PyObject *ph_slot_cls; /* strong: the class the offsets are of */
static Py_ssize_t ph_slot_off[PH_N];
static int ph_slots_ok;

/* 1 when cls's attributes are read in place, 0 when through PyObject_GetAttr / SetAttr */
static int ph_bind(PyObject *cls) {
    if (cls == ph_slot_cls)
        return ph_slots_ok;
    Py_ssize_t offs[PH_N];
    int ok = PyType_Check(cls) && ((PyTypeObject *)cls)->tp_getattro == PyObject_GenericGetAttr
             && ((PyTypeObject *)cls)->tp_setattro == PyObject_GenericSetAttr;
    if (ok && slot_offsets(cls, ph_slot_names, PH_N, offs) < 0) {
        PyErr_Clear();
        ok = 0;
    }
    Py_INCREF(cls);
    Py_XSETREF(ph_slot_cls, cls);
    if (ok)
        memcpy(ph_slot_off, offs, sizeof offs);
    ph_slots_ok = ok;
    return ok;
}

/* m.<name> (new reference; NULL with the error): the slot read in place when `fast` (m's type is the bound
   class), the generic lookup otherwise or when the slot is unset (its AttributeError) */
static inline PyObject *ph_attr(PyObject *m, int fast, int f, PyObject *name) {
    if (fast) {
        PyObject *v = *(PyObject **)((char *)m + ph_slot_off[f]);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return PyObject_GetAttr(m, name);
}

/* m is `cls` exactly and its properties are not parsed: 1; 0 when not; -1 on error */
static int ph_plain(PyObject *m, PyObject *cls, int fast) {
    if ((PyObject *)Py_TYPE(m) != cls)
        return 0;
    PyObject *parsed = ph_attr(m, fast, PH_PARSED, ph_s_parsed);
    if (parsed == NULL)
        return -1;
    int plain = parsed == Py_None;
    Py_DECREF(parsed);
    return plain;
}

/* s[a:a+len(p)] == p, compared in place (a different storage kind: not compared, 0) */
static int ph_region_is(PyObject *s, Py_ssize_t a, Py_ssize_t n, PyObject *p) {
    if (PyUnicode_GET_LENGTH(p) != n || PyUnicode_KIND(p) != PyUnicode_KIND(s))
        return 0;
    int kind = PyUnicode_KIND(s);
    return memcmp((const char *)PyUnicode_DATA(s) + (size_t)a * kind, PyUnicode_DATA(p), (size_t)n * kind) == 0;
}

/* s + [SEP when s is not empty and does not end with one] + lead + the digits of off + SEP, as one new string
   (what the reference's f-string makes: the widest storage kind of its parts) */
static PyObject *ph_handle_string(PyObject *s, PyObject *lead, long long off) {
    char digits[24]; /* "%lld" written by hand (snprintf costs ten times more) */
    char rev[24];
    int nd = 0, nr = 0;
    unsigned long long u = off < 0 ? 0ULL - (unsigned long long)off : (unsigned long long)off;
    do {
        rev[nr++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (off < 0)
        digits[nd++] = '-';
    while (nr)
        digits[nd++] = rev[--nr];
    Py_ssize_t ns = PyUnicode_GET_LENGTH(s), nl = PyUnicode_GET_LENGTH(lead);
    int glue = ns > 0 && PyUnicode_READ_CHAR(s, ns - 1) != 2;
    Py_UCS4 maxchar = PyUnicode_MAX_CHAR_VALUE(s);
    if (PyUnicode_MAX_CHAR_VALUE(lead) > maxchar)
        maxchar = PyUnicode_MAX_CHAR_VALUE(lead);
    PyObject *r = PyUnicode_New(ns + glue + nl + nd + 1, maxchar);
    if (r == NULL)
        return NULL;
    int kind = PyUnicode_KIND(r);
    void *data = PyUnicode_DATA(r);
    Py_ssize_t pos = 0;
    if (ns && PyUnicode_CopyCharacters(r, 0, s, 0, ns) < 0)
        goto fail;
    pos = ns;
    if (glue)
        PyUnicode_WRITE(kind, data, pos++, 2);
    if (nl && PyUnicode_CopyCharacters(r, pos, lead, 0, nl) < 0)
        goto fail;
    pos += nl;
    for (int d = 0; d < nd; d++)
        PyUnicode_WRITE(kind, data, pos++, (Py_UCS4)(unsigned char)digits[d]);
    PyUnicode_WRITE(kind, data, pos, 2);
    return r;
fail:
    Py_DECREF(r);
    return NULL;
}

/* pop_set_handles(msgs, start, cls, topic, leads) -> index of the first message not handled (len: all) */
static PyObject *pop_set_handles(PyObject *self, PyObject *args) {
    PyObject *msgs, *cls, *topic, *leads;
    Py_ssize_t i;
    if (!PyArg_ParseTuple(args, "O!nOUO!", &PyList_Type, &msgs, &i, &cls, &topic, &PyDict_Type, &leads))
        return NULL;
    if (ph_init_names() < 0)
        return NULL;
    int fast = ph_bind(cls);
    PyObject *prev_q = NULL, *prev_lead = NULL; /* borrowed: the last queue id looked up and its lead */
    for (; i < PyList_GET_SIZE(msgs); i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i), *t = NULL, *q = NULL, *off = NULL, *s = NULL, *offs = NULL;
        int plain = ph_plain(m, cls, fast);
        if (plain <= 0)
            return plain < 0 ? NULL : PyLong_FromSsize_t(i);
        int ok = 0;
        if (!(t = ph_attr(m, fast, PH_TOPIC, ph_s_topic)))
            goto fail;
        if (!PyUnicode_CheckExact(t))
            goto stop;
        if (t != topic && !(PyUnicode_GET_LENGTH(t) == PyUnicode_GET_LENGTH(topic)
                            && ph_region_is(t, 0, PyUnicode_GET_LENGTH(t), topic))) {
            int same = PyUnicode_Compare(t, topic);
            if (same == -1 && PyErr_Occurred())
                goto fail;
            if (same != 0)
                goto stop;
        }
        if (!(q = ph_attr(m, fast, PH_QID, ph_s_qid)))
            goto fail;
        if (!PyLong_CheckExact(q))
            goto stop;
        PyObject *lead;
        /* the dict does not change during the call (int keys run no Python code): the same int object
           (the small ints are shared) has the same lead */
        if (q == prev_q) {
            lead = prev_lead;
        } else {
            lead = PyDict_GetItemWithError(leads, q); /* borrowed */
            if (lead == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                goto stop;
            }
            prev_q = q; /* m holds q, the list holds m, and leads holds lead, for the whole call */
            prev_lead = lead;
        }
        if (!PyUnicode_CheckExact(lead))
            goto stop;
        if (!(off = ph_attr(m, fast, PH_QOFF, ph_s_qoff)) || !(s = ph_attr(m, fast, PH_PROPS, ph_s_props)))
            goto fail;
        if (!PyLong_CheckExact(off) || !PyUnicode_CheckExact(s))
            goto stop;
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(off, &overflow);
        if (v == -1 && PyErr_Occurred())
            goto fail;
        PyObject *joined;
        if (!overflow) {
            joined = ph_handle_string(s, lead, v);
        } else { /* beyond 64 bits: the generic text */
            if (!(offs = PyObject_Str(off)))
                goto fail;
            Py_ssize_t n = PyUnicode_GET_LENGTH(s);
            int glue = n > 0 && PyUnicode_READ_CHAR(s, n - 1) != 2;
            PyObject *parts = glue ? PyTuple_Pack(5, s, ph_sep, lead, offs, ph_sep)
                                   : PyTuple_Pack(4, s, lead, offs, ph_sep);
            if (parts == NULL)
                goto fail;
            joined = PyUnicode_Join(ph_empty, parts);
            Py_DECREF(parts);
        }
        if (joined == NULL)
            goto fail;
        if (fast) { /* the slot written in place: what the generic set of a member slot does */
            PyObject **slot = (PyObject **)((char *)m + ph_slot_off[PH_PROPS]);
            Py_XSETREF(*slot, joined);
        } else {
            int r = PyObject_SetAttr(m, ph_s_props, joined);
            Py_DECREF(joined);
            if (r < 0)
                goto fail;
        }
        ok = 1;
    stop:
        Py_XDECREF(t);
        Py_XDECREF(q);
        Py_XDECREF(off);
        Py_XDECREF(s);
        Py_XDECREF(offs);
        if (!ok)
            return PyLong_FromSsize_t(i);
        continue;
    fail:
        Py_XDECREF(t);
        Py_XDECREF(q);
        Py_XDECREF(off);
        Py_XDECREF(s);
        Py_XDECREF(offs);
        return NULL;
    }
    return PyLong_FromSsize_t(i);
}

/* The digits of s[a:b] as a non-negative number when they are 1 to 18 ASCII digits (what int(text, 10) reads
   then); -1 for anything else (signs, spaces, underscores, other digits: left to PyLong_FromUnicodeObject). */
static long long ph_digits(PyObject *s, Py_ssize_t a, Py_ssize_t b) {
    if (b <= a || b - a > 18)
        return -1;
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    long long v = 0;
    for (Py_ssize_t i = a; i < b; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < '0' || c > '9')
            return -1;
        v = v * 10 + (long long)(c - '0');
    }
    return v;
}

/* pop_ack_scan(msgs, start, cls, lead, acks) -> index of the first message not handled (len: all); acks maps
   (topic, handle without its last field) to (start offset, bits list, ...): each handled message's
   int(last field) - start offset is appended to the bits. The handle is read in place in the properties
   string; a message with the previous one's topic and handle prefix uses the previous one's entry (what the
   dict answers for the same key: the dict does not change during the call, str keys run no Python code) */
static PyObject *pop_ack_scan(PyObject *self, PyObject *args) {
    PyObject *msgs, *cls, *lead, *acks;
    Py_ssize_t i;
    if (!PyArg_ParseTuple(args, "O!nOUO!", &PyList_Type, &msgs, &i, &cls, &lead, &PyDict_Type, &acks))
        return NULL;
    if (ph_init_names() < 0)
        return NULL;
    Py_ssize_t lead_len = PyUnicode_GET_LENGTH(lead);
    int fast = ph_bind(cls);
    PyObject *prev_t = NULL, *prev_prefix = NULL, *prev_entry = NULL; /* strong references */
    long long prev_start = 0;
    int prev_start_ok = 0;
    PyObject *result = NULL;
    for (; i < PyList_GET_SIZE(msgs); i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i), *s = NULL, *t = NULL, *prefix = NULL, *last = NULL,
                 *key = NULL, *num = NULL, *bit = NULL;
        int plain = ph_plain(m, cls, fast);
        if (plain < 0)
            goto out;
        if (plain == 0)
            break;
        int ok = 0;
        if (!(s = ph_attr(m, fast, PH_PROPS, ph_s_props)))
            goto fail;
        if (!PyUnicode_CheckExact(s))
            goto stop;
        Py_ssize_t n = PyUnicode_GET_LENGTH(s);
        Py_ssize_t j = PyUnicode_Find(s, lead, 0, n, -1);
        if (j == -2)
            goto fail;
        if (j < 0 || (j > 0 && PyUnicode_READ_CHAR(s, j - 1) != 2))
            goto stop;
        Py_ssize_t k = PyUnicode_FindChar(s, 2, j, n, 1);
        if (k == -2)
            goto fail;
        Py_ssize_t h0 = j + lead_len, h1 = k >= 0 ? k : n; /* the handle: s[h0:h1] */
        if (h1 < h0)
            h1 = h0;
        Py_ssize_t sp = h1 > h0 ? PyUnicode_FindChar(s, ' ', h0, h1, -1) : -1;
        if (sp == -2)
            goto fail;
        if (sp < 0)
            goto stop;
        if (!(t = ph_attr(m, fast, PH_TOPIC, ph_s_topic)))
            goto fail;
        PyObject *entry; /* borrowed: from the dict, or the cached previous one */
        if (prev_entry != NULL && PyUnicode_CheckExact(t) && (t == prev_t || PyUnicode_Compare(t, prev_t) == 0)
            && ph_region_is(s, h0, sp - h0, prev_prefix)) {
            entry = prev_entry;
        } else {
            if (PyErr_Occurred())
                goto fail;
            if (!(prefix = PyUnicode_Substring(s, h0, sp)) || !(key = PyTuple_Pack(2, t, prefix)))
                goto fail;
            entry = PyDict_GetItemWithError(acks, key);
            if (entry == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                goto stop;
            }
            if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) < 2
                || !PyList_CheckExact(PyTuple_GET_ITEM(entry, 1)) || !PyLong_CheckExact(PyTuple_GET_ITEM(entry, 0)))
                goto stop;
            Py_CLEAR(prev_entry);
            Py_CLEAR(prev_prefix);
            Py_CLEAR(prev_t);
            if (PyUnicode_CheckExact(t)) { /* a str subclass is looked up every time */
                prev_entry = Py_NewRef(entry);
                prev_prefix = Py_NewRef(prefix);
                prev_t = Py_NewRef(t);
                int overflow = 0;
                prev_start = PyLong_AsLongLongAndOverflow(PyTuple_GET_ITEM(entry, 0), &overflow);
                if (prev_start == -1 && PyErr_Occurred())
                    goto fail;
                prev_start_ok = !overflow;
            }
        }
        long long digits = ph_digits(s, sp + 1, h1), diff;
        if (digits >= 0 && entry == prev_entry && prev_start_ok && !__builtin_sub_overflow(digits, prev_start, &diff)) {
            if (!(bit = PyLong_FromLongLong(diff)))
                goto fail;
        } else {
            if (!(last = PyUnicode_Substring(s, sp + 1, h1)))
                goto fail;
            if (!(num = PyLong_FromUnicodeObject(last, 10))) {
                if (!PyErr_ExceptionMatches(PyExc_ValueError))
                    goto fail;
                PyErr_Clear(); /* the reference raises it */
                goto stop;
            }
            /* int - int runs no Python code: the borrowed entry stays alive */
            if (!(bit = PyNumber_Subtract(num, PyTuple_GET_ITEM(entry, 0))))
                goto fail;
        }
        if (PyList_Append(PyTuple_GET_ITEM(entry, 1), bit) < 0)
            goto fail;
        ok = 1;
    stop:
        Py_XDECREF(s);
        Py_XDECREF(t);
        Py_XDECREF(prefix);
        Py_XDECREF(last);
        Py_XDECREF(key);
        Py_XDECREF(num);
        Py_XDECREF(bit);
        if (!ok)
            break;
        continue;
    fail:
        Py_XDECREF(s);
        Py_XDECREF(t);
        Py_XDECREF(prefix);
        Py_XDECREF(last);
        Py_XDECREF(key);
        Py_XDECREF(num);
        Py_XDECREF(bit);
        goto out;
    }
    result = PyLong_FromSsize_t(i);
out:
    Py_XDECREF(prev_entry);
    Py_XDECREF(prev_prefix);
    Py_XDECREF(prev_t);
    return result;
}
/* ============================================================================================== */
/* end of the POP receipt handle block                                                              */
/* ============================================================================================== */

/* POP offsets (broker/pop_service.py, pop_buffer.py, common/pop.py): the text of a run of consecutive    */
/* queue offsets (a POP response's msgOffsetInfo, the buffer journal's ack lines) and the check that a    */
/* BatchAck's bit list is already what bitset_indexes makes. Python references: offsets_text_py,        */
/* int_run_py (common/pop.py).                                                                           */
/* ===================================================================================================== */

/* offsets_text(start, stop) -> ",".join(map(str, range(start, stop))) */
static PyObject *offsets_text(PyObject *self, PyObject *args) {
    long long start, stop;
    if (!PyArg_ParseTuple(args, "LL", &start, &stop))
        return NULL;
    if (stop <= start)
        return PyUnicode_FromStringAndSize("", 0);
    unsigned long long n = (unsigned long long)stop - (unsigned long long)start;
    if (n > (unsigned long long)(PY_SSIZE_T_MAX / 21))
        return PyErr_NoMemory();
    char *buf = PyMem_Malloc((size_t)n * 21);
    if (buf == NULL)
        return PyErr_NoMemory();
    char *p = buf;
    char digits[24];
    for (long long v = start;; v++) {
        unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
        int k = 0;
        do {
            digits[k++] = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        if (v < 0)
            *p++ = '-';
        while (k)
            *p++ = digits[--k];
        if (v == stop - 1)
            break;
        *p++ = ',';
    }
    PyObject *out = PyUnicode_DecodeASCII(buf, p - buf, NULL);
    PyMem_Free(buf);
    return out;
}

/* int_run(value) -> True when value is a non-empty list of ints (exactly int: no bool, no float) each one  */
/* more than the one before it (then sorted(set(map(int, value))) == value)                                */
static PyObject *int_run(PyObject *self, PyObject *value) {
    if (!PyList_CheckExact(value) || PyList_GET_SIZE(value) == 0)
        Py_RETURN_FALSE;
    Py_ssize_t n = PyList_GET_SIZE(value);
    long long prev = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(value, i);
        if (!PyLong_CheckExact(x))
            Py_RETURN_FALSE;
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
        if (overflow)
            Py_RETURN_FALSE;
        if (v == -1 && PyErr_Occurred())
            return NULL;
        if (i > 0 && (prev == LLONG_MAX || v != prev + 1))
            Py_RETURN_FALSE;
        prev = v;
    }
    Py_RETURN_TRUE;
}
/* ============================ end of POP offsets ===================================================== */

/* SLOT FIELDS (issue speed, branch send-core; the block above the method table): the dispatch pass reads and
 * writes its objects' fields by slot offset, through these */
typedef struct { PyTypeObject *tp; unsigned int tag; Py_ssize_t off; } sf_entry;
typedef struct { sf_entry e[4]; } sf_cache;  /* one field name's offsets in the last four types */
static PyObject *sf_get(PyObject *o, PyObject *name, sf_cache *c);
static int sf_set(PyObject *o, PyObject *name, sf_cache *c, PyObject *v);
static int ds_i64(PyObject *o, int i, int64_t lo, int64_t hi, int64_t *out);
static int ds_set_i64(PyObject *o, int i, int64_t v);

/* ============================================================================================== */
/* THE DISPATCH PASS (issue 16, branch dispatch-native): a dispatch pass over single puts in one call */
/*  dispatch_singles: ReputMessageService's pass (take_pending, MessageStore._dispatch: the consume    */
/*  queue units and the index entries, the checkpoint's logics time) for the common case: requests     */
/*  that single puts handed over alone, each going in order into its queue's current consume-queue     */
/*  file and into the current index file. It stops before the first record that is anything else      */
/*  (a chunk of several, columns, a BLANK, a transaction record, a topic with a deletion cutoff, a      */
/*  queue not created yet, a consume-queue or index file that is full, new, read-only or closed, a key  */
/*  with a lone surrogate); the general Python pass takes it from there, so what it covers gets the     */
/*  Python path's bytes by construction (tests/test_dispatch_native.py compares the two stores).        */
/* ============================================================================================== */
#define DS_MAX_TAKE 256     /* records per call */
#define DS_MAX_QUEUES 16    /* distinct queues per call */
#define DS_MAX_KEYS 64      /* index entries per record */

enum { D_MAPPED_FILES, D_FROM, D_WROTE, D_COMMITTED, D_TRANSIENT, D_REPUT_FROM, D_DISPATCHED, D_PENDING, D_PCOUNT,
       D_SIGNALLED, D_LISTENERS, D_CUTOFFS, D_FILES, D_READ_ONLY, D_MFQ, D_MAXPHYS, D_FIRST_CREATE, D_FILE_SIZE,
       D_WRITE_VIEW, D_INDEX_COUNT, D_INDEX_NUM, D_SLOT_NUM, D_ENTRIES_BASE, D_BEGIN_TS, D_END_TS, D_BEGIN_PHY,
       D_END_PHY, D_SLOT_COUNT, D_MM, D_DIRTY, D_CHECKPOINT, D_LOGICS_TS, D_POPLEFT, D_INDEX_ENABLE, D_GATED, D_N };
static const char *d_strs[D_N] = {
    "mapped_files", "file_from_offset", "wrote_position", "committed_position", "transient", "reput_from_offset",
    "dispatched_offset", "_pending", "_pending_count", "_signalled", "listeners", "cutoffs", "_files", "read_only",
    "mapped_file_queue", "_max_physic_offset", "first_create_in_queue", "file_size", "_write_view", "_index_count",
    "index_num", "hash_slot_num", "_entries_base", "_begin_timestamp", "_end_timestamp", "_begin_phy_offset",
    "_end_phy_offset", "_hash_slot_count", "mm", "_dirty", "checkpoint", "logics_msg_timestamp", "popleft",
    "message_index_enable", "_gated"};
static PyObject *d_names[D_N];
static sf_cache d_cache[D_N];  /* where each field is a slot (sf_get / sf_set, SLOT FIELDS) */

typedef struct {
    PyObject *cq, *topic, *mf;  /* new references */
    int64_t qid, wrote, wrote0, file_size, max_phys, last_cq;
    Py_buffer view;
    int has_view;
} ds_queue;

/* an attribute's truth: 1, 0, or -1 (error set) */
static int ds_truth(PyObject *o, int i) {
    PyObject *v = sf_get(o, d_names[i], &d_cache[i]);
    if (v == NULL) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* the commit log's readable end (MappedFileQueue.get_max_offset): 1, 0 when not plain ints, -1 on error */
static int ds_max_offset(PyObject *mfq, int64_t *out) {
    PyObject *files = sf_get(mfq, d_names[D_MAPPED_FILES], &d_cache[D_MAPPED_FILES]);
    if (files == NULL) return -1;
    int got = 1;
    if (!PyList_CheckExact(files)) got = 0;
    else if (PyList_GET_SIZE(files) == 0) *out = 0;
    else {
        PyObject *f = PyList_GET_ITEM(files, PyList_GET_SIZE(files) - 1);
        Py_INCREF(f);
        int64_t from, pos;
        int tr = ds_truth(f, D_TRANSIENT);
        if (tr < 0) got = -1;
        if (got > 0) got = ds_i64(f, D_FROM, 0, INT64_MAX / 2, &from);
        if (got > 0) got = ds_i64(f, tr ? D_COMMITTED : D_WROTE, 0, INT64_MAX / 2, &pos);
        if (got > 0) *out = from + pos;
        Py_DECREF(f);
    }
    Py_DECREF(files);
    return got;
}

/* the index keys of one record (IndexService.build_index: topic#uniqKey, then topic#token per non-empty KEYS
 * token), as index_keys hashes them: the count, or -1 when index_keys would decline (the caller stops) */
static int ds_record_hashes(PyObject *topic, PyObject *uniq, PyObject *keys, int32_t *out) {
    uint32_t topic_hash = 0;
    if (java_hash_append(topic, 0, PyUnicode_GET_LENGTH(topic), &topic_hash) < 0) return -1;
    topic_hash = 31u * topic_hash + '#';
    int m = 0;
    if (uniq != Py_None) {
        if (!PyUnicode_CheckExact(uniq)) return -1;
        uint32_t h = topic_hash;
        if (java_hash_append(uniq, 0, PyUnicode_GET_LENGTH(uniq), &h) < 0) return -1;
        out[m++] = index_hash(h);
    }
    if (keys != Py_None) {
        if (!PyUnicode_CheckExact(keys)) return -1;
        Py_ssize_t len = PyUnicode_GET_LENGTH(keys), start = 0;
        int kind = PyUnicode_KIND(keys);
        const void *d = PyUnicode_DATA(keys);
        for (Py_ssize_t j = 0; j <= len; j++) {
            if (kind == PyUnicode_1BYTE_KIND && j < len) {
                const void *sp = memchr((const char *)d + j, ' ', (size_t)(len - j));
                j = sp != NULL ? (Py_ssize_t)((const char *)sp - (const char *)d) : len;
            }
            if (j == len || PyUnicode_READ(kind, d, j) == ' ') {
                if (j > start) {
                    if (m == DS_MAX_KEYS) return -1;
                    uint32_t h = topic_hash;
                    if (java_hash_append(keys, start, j, &h) < 0) return -1;
                    out[m++] = index_hash(h);
                }
                start = j + 1;
            }
        }
    }
    return m;
}

/* the state of the last index file a pass writes (IndexFile's header fields and mapping) */
typedef struct {
    PyObject *f;  /* new reference, or NULL: no index this pass */
    Py_buffer mm;
    int has_mm, begun;  /* begun: the begin fields were set this pass (send-core: only changed fields written back) */
    int64_t count, count0, index_num, slots, entries_base, begin_ts, end_ts, begin_phy, end_phy, slot_count;
} ds_index;

/* open the last index file for writing: 1, 0 (the general path decides: none, full, read-only, closed,
 * unusual values), -1 on error */
static int ds_index_open(ds_index *ix, PyObject *service) {
    int ro = ds_truth(service, D_READ_ONLY);
    if (ro != 0) return ro < 0 ? -1 : 0;
    PyObject *files = sf_get(service, d_names[D_FILES], &d_cache[D_FILES]);
    if (files == NULL) return -1;
    if (!PyList_CheckExact(files) || PyList_GET_SIZE(files) == 0) { Py_DECREF(files); return 0; }
    ix->f = Py_NewRef(PyList_GET_ITEM(files, PyList_GET_SIZE(files) - 1));
    Py_DECREF(files);
    PyObject *f = ix->f;
    ro = ds_truth(f, D_READ_ONLY);
    if (ro != 0) return ro < 0 ? -1 : 0;
    int got = ds_i64(f, D_INDEX_COUNT, 1, INT32_MAX, &ix->count);
    if (got > 0) got = ds_i64(f, D_INDEX_NUM, 1, INT32_MAX, &ix->index_num);
    if (got > 0) got = ds_i64(f, D_SLOT_NUM, 1, INT32_MAX, &ix->slots);
    if (got > 0) got = ds_i64(f, D_ENTRIES_BASE, 40, INT64_MAX / 4, &ix->entries_base);
    if (got > 0) got = ds_i64(f, D_BEGIN_TS, INT64_MIN, INT64_MAX, &ix->begin_ts);
    if (got > 0) got = ds_i64(f, D_END_TS, INT64_MIN, INT64_MAX, &ix->end_ts);
    if (got > 0) got = ds_i64(f, D_BEGIN_PHY, INT64_MIN, INT64_MAX, &ix->begin_phy);
    if (got > 0) got = ds_i64(f, D_END_PHY, INT64_MIN, INT64_MAX, &ix->end_phy);
    if (got > 0) got = ds_i64(f, D_SLOT_COUNT, INT32_MIN, INT32_MAX, &ix->slot_count);
    if (got <= 0) return got;
    if (ix->count >= ix->index_num || ix->entries_base != 40 + ix->slots * 4) return 0;  /* full: a new file */
    PyObject *mm = sf_get(f, d_names[D_MM], &d_cache[D_MM]);
    if (mm == NULL) return -1;
    if (mm == Py_None || PyObject_GetBuffer(mm, &ix->mm, PyBUF_WRITABLE) < 0) {  /* closed: the general path says */
        PyErr_Clear();
        Py_DECREF(mm);
        return 0;
    }
    Py_DECREF(mm);
    ix->has_mm = 1;
    if (ix->entries_base + ix->index_num * 20 > ix->mm.len) return 0;
    ix->count0 = ix->count;
    return 1;
}

/* IndexFile._put_hash for one entry (put_index_entries' loop body); returns 1 when its slot was empty */
static inline int ds_put_entry(ds_index *ix, int32_t h, int64_t phy, int64_t t) {
    unsigned char *base = ix->mm.buf;
    unsigned char *slot = base + 40 + (Py_ssize_t)(h % ix->slots) * 4;
    int64_t sv = get_i32(slot);
    if (sv <= 0 || sv > ix->count) sv = 0;
    int64_t td = 0;
    if (ix->begin_ts > 0) {
        int64_t diff = (int64_t)((uint64_t)t - (uint64_t)ix->begin_ts);  /* wraps like Java long */
        td = diff < 0 ? 0 : (diff / 1000 > INT32_MAX ? INT32_MAX : diff / 1000);
    }
    unsigned char *e = base + ix->entries_base + ix->count * 20;
    put_i32(e, h); put_i64(e + 4, phy); put_i32(e + 12, (int32_t)td); put_i32(e + 16, (int32_t)sv);
    __atomic_thread_fence(__ATOMIC_RELEASE);  /* a reader following the slot finds the entry written */
    put_i32(slot, (int32_t)ix->count);
    if (ix->count <= 1) { ix->begin_phy = phy; ix->begin_ts = t; ix->begun = 1; }
    ix->count++;
    ix->end_phy = phy;
    ix->end_ts = t;
    return sv == 0;
}

/* a queue's consume-queue state for this pass: 1, 0 (the general path decides), -1 on error */
static int ds_queue_open(ds_queue *q, PyObject *cq) {
    q->cq = Py_NewRef(cq);
    int ro = ds_truth(cq, D_READ_ONLY);
    if (ro != 0) return ro < 0 ? -1 : 0;
    int got = ds_i64(cq, D_MAXPHYS, INT64_MIN, INT64_MAX, &q->max_phys);
    if (got <= 0) return got;
    PyObject *mfq = sf_get(cq, d_names[D_MFQ], &d_cache[D_MFQ]);
    if (mfq == NULL) return -1;
    PyObject *files = sf_get(mfq, d_names[D_MAPPED_FILES], &d_cache[D_MAPPED_FILES]);
    Py_DECREF(mfq);
    if (files == NULL) return -1;
    if (!PyList_CheckExact(files) || PyList_GET_SIZE(files) == 0) { Py_DECREF(files); return 0; }
    q->mf = Py_NewRef(PyList_GET_ITEM(files, PyList_GET_SIZE(files) - 1));
    Py_DECREF(files);
    int64_t from;
    got = ds_i64(q->mf, D_WROTE, 0, INT32_MAX, &q->wrote);
    if (got > 0) got = ds_i64(q->mf, D_FILE_SIZE, 0, INT32_MAX, &q->file_size);
    if (got > 0) got = ds_i64(q->mf, D_FROM, 0, INT64_MAX / 2, &from);
    if (got <= 0) return got;
    if (q->wrote == 0) {  /* a new first file of the queue (fillPreBlank): the general path */
        int fc = ds_truth(q->mf, D_FIRST_CREATE);
        if (fc != 0) return fc < 0 ? -1 : 0;
    }
    PyObject *view = sf_get(q->mf, d_names[D_WRITE_VIEW], &d_cache[D_WRITE_VIEW]);
    if (view == NULL) return -1;
    if (PyObject_GetBuffer(view, &q->view, PyBUF_WRITABLE) < 0) { PyErr_Clear(); Py_DECREF(view); return 0; }
    Py_DECREF(view);
    q->has_view = 1;
    if (q->view.len < q->file_size) return 0;
    q->wrote0 = q->wrote;
    q->last_cq = (from + q->wrote) / 20 - 1;  /* the queue offset the next unit must have, less one */
    return 1;
}

/* the arrival listeners' news of a pass ({(topic, queue id): next queue offset} of the queues it wrote to), or
 * NULL without an error when no listener is to be called: reput.listeners is empty and no gated listener's
 * gate (`_gated`: (fn, obj, attr or None, queues or None), ReputMessageService.add_listener) is open */
static PyObject *ds_grown(PyObject *reput, ds_queue *qs, Py_ssize_t nq) {
    PyObject *ls = sf_get(reput, d_names[D_LISTENERS], &d_cache[D_LISTENERS]);
    if (ls == NULL) return NULL;
    int need = PyObject_IsTrue(ls);
    Py_DECREF(ls);
    if (need < 0) return NULL;
    PyObject *gated = sf_get(reput, d_names[D_GATED], &d_cache[D_GATED]);
    if (gated == NULL) return NULL;
    PyObject *grown = NULL;
    if (!PyList_CheckExact(gated)) need = 1;  /* not ours to read: let Python look */
    if (!need && PyList_GET_SIZE(gated) == 0) goto done;
    grown = PyDict_New();
    if (grown == NULL) goto done;
    for (Py_ssize_t j = 0; j < nq; j++) {
        if (qs[j].wrote == qs[j].wrote0) continue;
        PyObject *qv = PyLong_FromLongLong(qs[j].qid);
        PyObject *key = qv != NULL ? PyTuple_Pack(2, qs[j].topic, qv) : NULL;
        PyObject *nv = PyLong_FromLongLong(qs[j].last_cq + 1);
        int bad = key == NULL || nv == NULL || PyDict_SetItem(grown, key, nv) < 0;
        Py_XDECREF(qv); Py_XDECREF(key); Py_XDECREF(nv);
        if (bad) { Py_CLEAR(grown); goto done; }
    }
    for (Py_ssize_t i = 0; !need && i < PyList_GET_SIZE(gated); i++) {
        PyObject *g = PyList_GET_ITEM(gated, i);
        if (!PyTuple_CheckExact(g) || PyTuple_GET_SIZE(g) != 4) { need = 1; break; }
        PyObject *obj = PyTuple_GET_ITEM(g, 1), *attr = PyTuple_GET_ITEM(g, 2), *queues = PyTuple_GET_ITEM(g, 3);
        int open_ = 1;
        if (attr != Py_None) {
            PyObject *v = PyObject_GetAttr(obj, attr);
            if (v == NULL) { Py_CLEAR(grown); goto done; }
            open_ = PyObject_IsTrue(v);
            Py_DECREF(v);
            if (open_ < 0) { Py_CLEAR(grown); goto done; }
        }
        if (open_ && queues != Py_None) {
            if (!PyFrozenSet_CheckExact(queues)) { need = 1; break; }
            open_ = 0;
            PyObject *it = PyObject_GetIter(queues), *k;
            if (it == NULL) { Py_CLEAR(grown); goto done; }
            while (!open_ && (k = PyIter_Next(it)) != NULL) {
                open_ = PyDict_Contains(grown, k);
                Py_DECREF(k);
            }
            Py_DECREF(it);
            if (open_ < 0 || PyErr_Occurred()) { Py_CLEAR(grown); goto done; }
        }
        if (open_) need = 1;
    }
    if (!need) Py_CLEAR(grown);
done:
    Py_DECREF(gated);
    return grown;
}

/* (taken, grown, behind) as a new tuple, or NULL with an error set (Py_BuildValue's "(nOL)" without parsing
 * a format per call; branch send-core) */
static PyObject *ds_result(Py_ssize_t taken, PyObject *grown, int64_t behind) {
    PyObject *a = PyLong_FromSsize_t(taken), *c = PyLong_FromLongLong(behind);
    PyObject *t = a != NULL && c != NULL ? PyTuple_New(3) : NULL;
    if (t == NULL) { Py_XDECREF(a); Py_XDECREF(c); return NULL; }
    PyTuple_SET_ITEM(t, 0, a);
    PyTuple_SET_ITEM(t, 1, Py_NewRef(grown));
    PyTuple_SET_ITEM(t, 2, c);
    return t;
}

/* dispatch_singles(reput, ctx, here) -> (taken, grown or None, behind)
 * ctx = (commit log's MappedFileQueue, consume_queue_table, topic_deletions, index_service, store config,
 *        store (its checkpoint), dispatch lock). Takes the single puts' requests at the head of
 * reput._pending that start at reput_from_offset and end by the commit log's readable end, writes their
 * consume-queue units and index entries (under the dispatch lock), the checkpoint's logics time, and moves
 * reput_from_offset, dispatched_offset and _pending_count; stops before anything else. `grown` is the
 * arrival listeners' {(topic, queue id): next queue offset} when reput.listeners is not empty and records
 * were taken; `behind` the bytes still written and not dispatched after the pass. With `here` (the calling
 * thread promised the pass, ReputMessageService.dispatch_here) and nothing behind, `_signalled` is cleared
 * in the same step (no thread can put between that look and the clearing). */
static PyObject *dispatch_singles(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_CheckExact(args[1]) || PyTuple_GET_SIZE(args[1]) != 7) {
        PyErr_SetString(PyExc_TypeError, "dispatch_singles(reput, ctx, here)");
        return NULL;
    }
    if (d_names[D_N - 1] == NULL) {
        for (int i = 0; i < D_N; i++) {
            PyObject *n = PyUnicode_InternFromString(d_strs[i]);
            if (n == NULL) return NULL;
            d_names[i] = n;
        }
        if (single_names() < 0) return NULL;
    }
    fl_check();
    PyObject *reput = args[0], *ctx = args[1];
    int here = PyObject_IsTrue(args[2]);
    if (here < 0) return NULL;
    PyObject *cl_mfq = PyTuple_GET_ITEM(ctx, 0), *table = PyTuple_GET_ITEM(ctx, 1),
             *deletions = PyTuple_GET_ITEM(ctx, 2), *index_service = PyTuple_GET_ITEM(ctx, 3),
             *config = PyTuple_GET_ITEM(ctx, 4), *store = PyTuple_GET_ITEM(ctx, 5), *dlock = PyTuple_GET_ITEM(ctx, 6);
    PyObject *pend = NULL, *cut = NULL, *result = NULL, *grown = NULL, *reqs[DS_MAX_TAKE];
    ds_queue qs[DS_MAX_QUEUES];
    ds_index ix;
    memset(&ix, 0, sizeof ix);
    Py_ssize_t nq = 0, npeek = 0, taken = 0;
    int locked = 0, got;
    int64_t limit, offset, dispatched, pcount, last_ts = 0, slots_used = 0;
    if (!PyDict_CheckExact(table)) goto decline;
    got = ds_max_offset(cl_mfq, &limit);
    if (got > 0) got = ds_i64(reput, D_REPUT_FROM, INT64_MIN, INT64_MAX / 2, &offset);
    if (got > 0) got = ds_i64(reput, D_DISPATCHED, INT64_MIN, INT64_MAX / 2, &dispatched);
    if (got > 0) got = ds_i64(reput, D_PCOUNT, 0, INT64_MAX / 2, &pcount);
    if (got < 0) goto fail;
    if (got == 0) goto decline;
    if (offset >= limit) goto finish;
    pend = sf_get(reput, d_names[D_PENDING], &d_cache[D_PENDING]);
    if (pend == NULL) goto fail;
    {   /* the leading requests alone, contiguous from `offset`, ending by `limit` */
        Py_ssize_t n = PyObject_Length(pend);
        if (n < 0) goto fail;
        int64_t at = offset;
        while (npeek < n && npeek < DS_MAX_TAKE) {
            PyObject *r = PySequence_GetItem(pend, npeek);
            if (r == NULL) goto fail;
            int64_t start, size;
            if (!PyTuple_Check(r) || PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) != 12 ||
                !as_i64(PyTuple_GET_ITEM(r, 2), 0, INT64_MAX / 2, &start) ||
                !as_i64(PyTuple_GET_ITEM(r, 3), 1, INT32_MAX, &size) || start != at || start + size > limit) {
                Py_DECREF(r);
                break;
            }
            reqs[npeek++] = r;
            at = start + size;
        }
    }
    if (npeek == 0) goto decline;
    {
        int en = ds_truth(config, D_INDEX_ENABLE);
        if (en < 0) goto fail;
        if (en) {
            got = ds_index_open(&ix, index_service);
            if (got < 0) goto fail;
            if (got == 0) goto decline;  /* no file, a full or closed one: the general path (which makes one) */
        }
    }
    cut = sf_get(deletions, d_names[D_CUTOFFS], &d_cache[D_CUTOFFS]);
    if (cut == NULL) goto fail;
    if (!PyDict_CheckExact(cut)) goto decline;
    if (fl_acquire(dlock) < 0) goto fail;
    locked = 1;
    for (; taken < npeek; taken++) {
        PyObject *r = reqs[taken];
        PyObject *topic = PyTuple_GET_ITEM(r, 0), *qido = PyTuple_GET_ITEM(r, 1);
        int64_t qid, off, size, tags, ts, cqo, sys_flag;
        if (!PyUnicode_CheckExact(topic) || !as_i64(qido, INT32_MIN, INT32_MAX, &qid) ||
            !as_i64(PyTuple_GET_ITEM(r, 2), 0, INT64_MAX / 2, &off) ||
            !as_i64(PyTuple_GET_ITEM(r, 3), 1, INT32_MAX, &size) ||
            !as_i64(PyTuple_GET_ITEM(r, 4), INT64_MIN, INT64_MAX, &tags) ||
            !as_i64(PyTuple_GET_ITEM(r, 5), INT64_MIN, INT64_MAX, &ts) ||
            !as_i64(PyTuple_GET_ITEM(r, 6), 0, INT64_MAX / 32, &cqo) ||
            !as_i64(PyTuple_GET_ITEM(r, 9), INT64_MIN, INT64_MAX, &sys_flag))
            break;
        if (sys_flag & 0x4) break;  /* a prepared or rolled-back transaction record: the general path */
        if (PyDict_GET_SIZE(cut)) {
            int c = PyDict_Contains(cut, topic);
            if (c < 0) goto fail;
            if (c) break;
        }
        /* its queue: one of this pass's, else from the table (a queue not created yet: the general path) */
        ds_queue *q = NULL;
        for (Py_ssize_t j = 0; j < nq; j++)
            if (qs[j].qid == qid && (qs[j].topic == topic || PyUnicode_Compare(qs[j].topic, topic) == 0)) {
                q = &qs[j];
                break;
            }
        if (q == NULL) {
            if (nq == DS_MAX_QUEUES) break;
            PyObject *queues = PyDict_GetItemWithError(table, topic);
            if (queues == NULL && PyErr_Occurred()) goto fail;
            if (queues == NULL || !PyDict_CheckExact(queues)) break;
            PyObject *cq = PyDict_GetItemWithError(queues, qido);
            if (cq == NULL) {
                if (PyErr_Occurred()) goto fail;
                break;
            }
            q = &qs[nq++];
            memset(q, 0, sizeof *q);
            q->topic = Py_NewRef(topic);
            q->qid = qid;
            got = ds_queue_open(q, cq);
            if (got < 0) goto fail;
            if (got == 0) { q->qid = INT64_MIN; break; }  /* kept for the clean-up; matches no later record */
        }
        /* _put_in_order_native's checks: room in the current file, the next queue offset, a later record */
        if (q->wrote + 20 > q->file_size || cqo != q->last_cq + 1 || off + size <= q->max_phys) break;
        int32_t hs[DS_MAX_KEYS];
        int m = 0;
        if (ix.f != NULL && off >= ix.end_phy) {  /* build_index skips what the last file already holds */
            m = ds_record_hashes(topic, PyTuple_GET_ITEM(r, 8), PyTuple_GET_ITEM(r, 7), hs);
            if (m < 0) break;
            if (ix.count + m > ix.index_num) break;  /* the file fills up: the general path rolls it */
        }
        unsigned char *u = (unsigned char *)q->view.buf + q->wrote;
        put_i64(u, off); put_i32(u + 8, (int32_t)size); put_i64(u + 12, tags);
        q->wrote += 20;
        q->max_phys = off + size;
        q->last_cq = cqo;
        for (int k = 0; k < m; k++) slots_used += ds_put_entry(&ix, hs[k], off, ts);
        last_ts = ts;
        offset = off + size;
    }
    /* write back what Python reads: each file's write position, each queue's last record end, the index
     * file's header (the six fields _after_put writes), the checkpoint's logics time, the reput's offsets */
    for (Py_ssize_t j = 0; j < nq; j++) {
        if (qs[j].wrote == qs[j].wrote0) continue;
        if (ds_set_i64(qs[j].mf, D_WROTE, qs[j].wrote) < 0 ||
            ds_set_i64(qs[j].cq, D_MAXPHYS, qs[j].max_phys) < 0)
            goto fail;
    }
    if (ix.f != NULL && ix.count != ix.count0) {
        unsigned char *hp = ix.mm.buf;
        ix.slot_count += slots_used;
        put_i64(hp, ix.begin_ts); put_i64(hp + 8, ix.end_ts); put_i64(hp + 16, ix.begin_phy);
        put_i64(hp + 24, ix.end_phy); put_i32(hp + 32, (int32_t)ix.slot_count); put_i32(hp + 36, (int32_t)ix.count);
        if ((ix.begun && ds_set_i64(ix.f, D_BEGIN_TS, ix.begin_ts) < 0) ||
            ds_set_i64(ix.f, D_END_TS, ix.end_ts) < 0 ||
            (ix.begun && ds_set_i64(ix.f, D_BEGIN_PHY, ix.begin_phy) < 0) ||
            ds_set_i64(ix.f, D_END_PHY, ix.end_phy) < 0 ||
            (slots_used && ds_set_i64(ix.f, D_SLOT_COUNT, ix.slot_count) < 0) ||
            ds_set_i64(ix.f, D_INDEX_COUNT, ix.count) < 0 ||
            sf_set(ix.f, d_names[D_DIRTY], &d_cache[D_DIRTY], Py_True) < 0)
            goto fail;
    }
    if (taken) {
        PyObject *cp = sf_get(store, d_names[D_CHECKPOINT], &d_cache[D_CHECKPOINT]);
        if (cp == NULL) goto fail;
        int rc = cp == Py_None ? 0 : ds_set_i64(cp, D_LOGICS_TS, last_ts);
        Py_DECREF(cp);
        if (rc < 0) goto fail;
        for (Py_ssize_t i = 0; i < taken; i++) {
            PyObject *p = PyObject_CallMethodNoArgs(pend, d_names[D_POPLEFT]);
            if (p == NULL) goto fail;
            Py_DECREF(p);
        }
        PyObject *ov = PyLong_FromLongLong(offset);  /* one int for both offsets */
        int bad = ov == NULL || ds_set_i64(reput, D_PCOUNT, pcount - taken) < 0 ||
                  sf_set(reput, d_names[D_REPUT_FROM], &d_cache[D_REPUT_FROM], ov) < 0 ||
                  sf_set(reput, d_names[D_DISPATCHED], &d_cache[D_DISPATCHED], ov) < 0;
        Py_XDECREF(ov);
        if (bad) goto fail;
        grown = ds_grown(reput, qs, nq);
        if (grown == NULL && PyErr_Occurred()) goto fail;
        dispatched = offset;
    }
    fl_release(dlock);
    locked = 0;
finish:
    got = ds_max_offset(cl_mfq, &limit);  /* again: the dispatch lock may have waited, the GIL released */
    if (got < 0) goto fail;
    if (got == 0) limit = dispatched + 1;  /* unknown: say something is behind, the general path looks */
    if (here && limit <= dispatched && sf_set(reput, d_names[D_SIGNALLED], &d_cache[D_SIGNALLED], Py_False) < 0) goto fail;
    result = ds_result(taken, grown != NULL ? grown : Py_None, limit - dispatched);
    goto done;
decline:
    result = ds_result(0, Py_None, 1);
    goto done;
fail:
    result = NULL;
done:
    if (locked && fl_release(dlock) < 0) Py_CLEAR(result);
    for (Py_ssize_t i = 0; i < npeek; i++) Py_DECREF(reqs[i]);
    for (Py_ssize_t j = 0; j < nq; j++) {
        if (qs[j].has_view) PyBuffer_Release(&qs[j].view);
        Py_XDECREF(qs[j].cq); Py_XDECREF(qs[j].mf); Py_XDECREF(qs[j].topic);
    }
    if (ix.has_mm) PyBuffer_Release(&ix.mm);
    Py_XDECREF(ix.f);
    Py_XDECREF(grown); Py_XDECREF(pend); Py_XDECREF(cut);
    return result;
}
/* ============================ end of THE DISPATCH PASS =============================================== */

/* ============================================================================================== */
/* THE SEND LANE (issue 16, branch lane-native): SendMessageProcessor.lane in one C call.             */
/*  send_lane(cmd, born_host, ctx) serves a plain SEND_MESSAGE_V2 as the Python lane does (its checks, */
/*  in its order, declining before anything changed; the decoration: UNIQ_KEY when missing, CLUSTER;  */
/*  the Message; store.put_message, whose native path is put_one) and writes the response frame itself */
/*  (the bytes RemotingCommand.encode gives the Python lane's response). Returns                       */
/*   - None: not served, nothing changed (the Python lane, SendMessageProcessor.lane, decides);       */
/*   - bytes: the response frame of a stored message;                                                  */
/*   - (PutMessageResult, queue_id): stored or refused but not answered here (a refusal, an unusual    */
/*     result): SendMessageProcessor.lane_answer builds the response as the lane does.                */
/*  ctx = SendMessageProcessor.lane_context(): (processor, topics data version, store, UNIQ_KEY         */
/*  generator, UNIQ_KEY marker, CLUSTER marker, CLUSTER property text, store config). Reads the         */
/*  processor's _lane_counter, _lane_timestamp and _lane_routes and the config's auto_create_uniq_key   */
/*  by name.                                                                                           */
/*  Reference: SendMessageProcessor.lane (tests/test_send_lane_native.py compares them).               */
/* ============================================================================================== */
enum { SL_X0, SL_X1, SL_X2, SL_X3, SL_X4, SL_X5, SL_X6,
       SL_COUNTER, SL_TIMESTAMP, SL_LCOUNTER, SL_LTIMESTAMP, SL_ROUTES, SL_AUTO_UNIQ, SL_PUT, SL_CREATE,
       SL_DELAY, SL_TIMER, SL_TRAN, SL_NAMES };
static const char *sl_texts[SL_NAMES] = {
    /* _LANE_EXTENSIONS: header keys the lane leaves to the full path */
    "streamId", "expectedVersion", "streams", "batch", "properties", "maxReconsumeTimes", "defaultTopicQueueNums",
    "counter", "timestamp", "_lane_counter", "_lane_timestamp", "_lane_routes", "auto_create_uniq_key",
    "put_message", "create",
    "DELAY", "TIMER_", "TRAN_MSG\x01",
};
static PyObject *sl_names[SL_NAMES];

static int sl_init(void) {
    if (sl_names[SL_NAMES - 1] != NULL) return 0;
    for (int i = 0; i < SL_NAMES; i++) {
        PyObject *n = PyUnicode_InternFromString(sl_texts[i]);
        if (n == NULL) return -1;
        sl_names[i] = n;
    }
    return 0;
}

/* a header int as the canonical decimal text int() reads: [-]digits (at most 18); 0 for anything else
 * (the Python lane then decides: int() may still read it, or refuse it) */
static int sl_int_span(const char *p, Py_ssize_t n, long long *out) {
    Py_ssize_t i = 0;
    int neg = 0;
    if (p == NULL) return 0;
    if (n > 0 && p[0] == '-') { neg = 1; i = 1; }
    if (n - i < 1 || n - i > 18) return 0;
    long long r = 0;
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        r = r * 10 + (p[i] - '0');
    }
    *out = neg ? -r : r;
    return 1;
}

static int sl_eq(PyObject *a, PyObject *b) {  /* a == b for the version stamps (ints): 1, 0, -1 error */
    if (a == b) return 1;
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

static inline char *sl_digits(char *e, long long v) {  /* decimal text of v ending at e; returns its start */
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    char *d = e;
    do { *--d = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) *--d = '-';
    return d;
}

/* props decorated as SendMessageProcessor._decorated does: UNIQ_KEY (uniq not NULL) then CLUSTER appended
 * when absent, a separator first when props does not end with one. New reference. */
static PyObject *sl_decorate(PyObject *props, PyObject *uniq_marker, PyObject *uniq, PyObject *cluster_marker,
                             PyObject *cluster) {
    PyObject *parts[6];
    int k = 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(props);
    int ends_sep = n > 0 && PyUnicode_READ_CHAR(props, n - 1) == 2;
    parts[k++] = props;
    static PyObject *sep = NULL;
    if (sep == NULL && (sep = PyUnicode_FromStringAndSize("\x02", 1)) == NULL) return NULL;
    if (uniq != NULL) {
        if (n > 0 && !ends_sep) parts[k++] = sep;
        parts[k++] = uniq_marker; parts[k++] = uniq; parts[k++] = sep;
        ends_sep = 1; n = 1;
    }
    if (cluster != NULL) {
        if (n > 0 && !ends_sep) parts[k++] = sep;
        parts[k++] = cluster;
    }
    if (k == 1) return Py_NewRef(props);
    Py_ssize_t total = 0;
    Py_UCS4 maxc = 127;
    int one_byte = 1;
    for (int i = 0; i < k; i++) {
        if (!PyUnicode_CheckExact(parts[i])) { PyErr_SetString(PyExc_TypeError, "send_lane: a property text is not a str"); return NULL; }
        total += PyUnicode_GET_LENGTH(parts[i]);
        if (PyUnicode_KIND(parts[i]) != PyUnicode_1BYTE_KIND) one_byte = 0;
        else if (!PyUnicode_IS_ASCII(parts[i])) maxc = 255;
    }
    if (!one_byte) {  /* wide characters: str concatenation, as the Python lane */
        PyObject *acc = Py_NewRef(parts[0]);
        for (int i = 1; i < k && acc != NULL; i++) Py_SETREF(acc, PyUnicode_Concat(acc, parts[i]));
        return acc;
    }
    PyObject *s = PyUnicode_New(total, maxc);
    if (s == NULL) return NULL;
    Py_UCS1 *w = PyUnicode_1BYTE_DATA(s);
    for (int i = 0; i < k; i++) {
        Py_ssize_t len = PyUnicode_GET_LENGTH(parts[i]);
        memcpy(w, PyUnicode_1BYTE_DATA(parts[i]), len);
        w += len;
    }
    return s;
}

/* the frame of RemotingCommand(SUCCESS, {msgId, queueId, queueOffset, MSG_REGION, TRACE_ON}, b"", opaque,
 * FLAG_RESPONSE, None, "JAVA", version).encode(); None when the result is not the plain kind */
static int hl_txid_ok(PyObject *txid);
static PyObject *sl_frame(long long opaque, long long version, PyObject *res, long long queue_id, PyObject *txid) {
    if (pmr_type == NULL || Py_TYPE(res) != pmr_type) Py_RETURN_NONE;
    PyObject *status = *(PyObject **)((char *)res + pmr_off[0]), *a = *(PyObject **)((char *)res + pmr_off[1]);
    if (status != pmr_ok || a == NULL || Py_TYPE(a) != amr_type) Py_RETURN_NONE;
    PyObject *host = *(PyObject **)((char *)a + amr_off[A_STORE_HOST]), *port = *(PyObject **)((char *)a + amr_off[A_STORE_PORT]),
             *offs = *(PyObject **)((char *)a + amr_off[A_OFFSETS]), *lo = *(PyObject **)((char *)a + amr_off[A_LOGICS_OFFSET]);
    int64_t port_v, off_v, lo_v;
    if (host == NULL || !PyBytes_CheckExact(host) || PyBytes_GET_SIZE(host) > 16 || port == NULL ||
        !as_i64(port, INT32_MIN, INT32_MAX, &port_v) || offs == NULL || !PyList_CheckExact(offs) ||
        PyList_GET_SIZE(offs) != 1 || !as_i64(PyList_GET_ITEM(offs, 0), INT64_MIN, INT64_MAX, &off_v) ||
        lo == NULL || !as_i64(lo, INT64_MIN, INT64_MAX, &lo_v) || (txid != NULL && !hl_txid_ok(txid)))
        Py_RETURN_NONE;
    /* {"code":0,"language":"JAVA","version":V,"opaque":O,"flag":1,"extFields":{"msgId":"..","queueId":"..",
     *  "queueOffset":"..","MSG_REGION":"DefaultRegion","TRACE_ON":"true"},"serializeTypeCurrentRPC":"JSON"} */
    static const char p1[] = "{\"code\":0,\"language\":\"JAVA\",\"version\":", p2[] = ",\"opaque\":",
                      p3[] = ",\"flag\":1,\"extFields\":{\"msgId\":\"", p4[] = "\",\"queueId\":\"",
                      p5[] = "\",\"queueOffset\":\"",
                      p6[] = "\",\"MSG_REGION\":\"DefaultRegion\",\"TRACE_ON\":\"true\"",
                      p7[] = "},\"serializeTypeCurrentRPC\":\"JSON\"}", px[] = ",\"transactionId\":\"";
    static const char hex[] = "0123456789ABCDEF";
    char buf[8 + sizeof p1 + sizeof p2 + sizeof p3 + sizeof p4 + sizeof p5 + sizeof p6 + sizeof p7 + sizeof px + 4 * 24 +
             2 * 28 + 64 + 2], *w = buf + 8;
    char t[24], *d;
#define SL_LIT(lit) (memcpy(w, lit, sizeof(lit) - 1), w += sizeof(lit) - 1)
#define SL_NUM(v) (d = sl_digits(t + sizeof t, v), memcpy(w, d, t + sizeof t - d), w += t + sizeof t - d)
    SL_LIT(p1); SL_NUM(version); SL_LIT(p2); SL_NUM(opaque); SL_LIT(p3);
    const unsigned char *h = (const unsigned char *)PyBytes_AS_STRING(host);  /* join_message_ids of one offset */
    for (Py_ssize_t j = 0; j < PyBytes_GET_SIZE(host); j++) { *w++ = hex[h[j] >> 4]; *w++ = hex[h[j] & 15]; }
    unsigned char pb[4], ob[8];
    put_i32(pb, (int32_t)port_v);
    for (int j = 0; j < 4; j++) { *w++ = hex[pb[j] >> 4]; *w++ = hex[pb[j] & 15]; }
    put_i64(ob, off_v);
    for (int j = 0; j < 8; j++) { *w++ = hex[ob[j] >> 4]; *w++ = hex[ob[j] & 15]; }
    SL_LIT(p4); SL_NUM(queue_id); SL_LIT(p5); SL_NUM(lo_v); SL_LIT(p6);
    if (txid != NULL) {  /* a half message's (THE HALF LANE): hl_txid_ok made sure it needs no escape */
        SL_LIT(px);
        memcpy(w, PyUnicode_1BYTE_DATA(txid), PyUnicode_GET_LENGTH(txid));
        w += PyUnicode_GET_LENGTH(txid);
        *w++ = '"';
    }
    SL_LIT(p7);
#undef SL_LIT
#undef SL_NUM
    Py_ssize_t len = w - buf;
    put_i32((unsigned char *)buf, (int32_t)(len - 4));
    put_i32((unsigned char *)buf + 4, (int32_t)(len - 8));
    return PyBytes_FromStringAndSize(buf, len);
}

/* a plain send's fields, from a RemotingCommand (send_lane) or straight from its frame (send_frame) */
enum { SLF_E, SLF_F, SLF_H, SLF_J, SLF_G, SLF_L, SLF_D, SLF_M, SLF_SPANS };
typedef struct {
    PyObject *topic, *props;           /* borrowed str or NULL (absent) */
    const char *sp[SLF_SPANS];         /* the ASCII texts of the other fields (NULL: absent or not ASCII) */
    Py_ssize_t sl[SLF_SPANS];
    int present[SLF_SPANS];
    long long opaque, version;
} sl_req;

static PyObject *sl_serve(sl_req *r, PyObject *body, PyObject *born_host, PyObject *ctx, PyObject *hold,
                          PyObject **res_out, long long *qid_out, PyObject **txid_out);
static int hl_check(PyObject *ctx, PyObject *props, long long sys_flag, int found, PyObject *cfg, PyObject **half_topic,
                    PyObject **txid);
static PyObject *hl_props(PyObject *decorated, PyObject *topic, long long queue_id);

/* what the lane looks for in a properties string: the markers it declines (DELAY, TIMER_, TRAN_MSG) and
 * the two it adds when absent; one pass over a one-byte string, str.__contains__ otherwise. -1: error */
enum { SLP_DECLINE = 1, SLP_UNIQ = 2, SLP_CLUSTER = 4, SLP_TRAN = 8 };
static int sl_props_scan(PyObject *props, PyObject *uniq_marker, PyObject *cluster_marker) {
    int found = 0;
    if (PyUnicode_KIND(props) == PyUnicode_1BYTE_KIND) {
        const char *p = (const char *)PyUnicode_1BYTE_DATA(props);
        Py_ssize_t n = PyUnicode_GET_LENGTH(props);
        const char *um = (const char *)PyUnicode_1BYTE_DATA(uniq_marker), *cm = (const char *)PyUnicode_1BYTE_DATA(cluster_marker);
        Py_ssize_t ul = PyUnicode_GET_LENGTH(uniq_marker), cl = PyUnicode_GET_LENGTH(cluster_marker);
#define SL_AT(lit) (n - i >= (Py_ssize_t)sizeof(lit) - 1 && memcmp(p + i, lit, sizeof(lit) - 1) == 0)
        for (Py_ssize_t i = 0; i < n; i++) {
            char c = p[i];
            if (c == 'D') { if (SL_AT("DELAY")) return SLP_DECLINE; }
            else if (c == 'T') { if (SL_AT("TIMER_")) return SLP_DECLINE; if (SL_AT("TRAN_MSG\x01")) found |= SLP_TRAN; }
            if (ul > 0 && c == um[0] && n - i >= ul && memcmp(p + i, um, ul) == 0) found |= SLP_UNIQ;
            if (cl > 0 && c == cm[0] && n - i >= cl && memcmp(p + i, cm, cl) == 0) found |= SLP_CLUSTER;
        }
#undef SL_AT
        return found;
    }
    for (int i = SL_DELAY; i <= SL_TRAN; i++) {
        int c = PyUnicode_Contains(props, sl_names[i]);
        if (c < 0) return -1;
        if (c) return SLP_DECLINE;
    }
    int u = PyUnicode_Contains(props, uniq_marker), c = u < 0 ? -1 : PyUnicode_Contains(props, cluster_marker);
    if (u < 0 || c < 0) return -1;
    return (u ? SLP_UNIQ : 0) | (c ? SLP_CLUSTER : 0);
}

/* the lane's checks in its order (None before anything changed when one fails), then hold() (unless None:
 * the server's dispatch hold, which must precede the put), the decoration, the Message, store.put_message and
 * the response frame. Returns the frame, None (declined), or NULL (error); *res_out: the put's result when
 * the frame could not be written (a refusal, an unusual result) */
static PyObject *sl_serve(sl_req *r, PyObject *body, PyObject *born_host, PyObject *ctx, PyObject *hold,
                          PyObject **res_out, long long *qid_out, PyObject **txid_out) {
    *res_out = NULL;
    *txid_out = NULL;
    if (!PyTuple_CheckExact(ctx) || PyTuple_GET_SIZE(ctx) < 8 || PyTuple_GET_SIZE(ctx) > 9) {
        PyErr_SetString(PyExc_TypeError, "the lane context must be an 8- or 9-tuple");
        return NULL;
    }
    if (sl_init() < 0) return NULL;
    if (message_type == NULL || pmr_type == NULL) Py_RETURN_NONE;
    PyObject *proc = PyTuple_GET_ITEM(ctx, 0), *dv = PyTuple_GET_ITEM(ctx, 1), *store = PyTuple_GET_ITEM(ctx, 2),
             *gen = PyTuple_GET_ITEM(ctx, 3), *uniq_marker = PyTuple_GET_ITEM(ctx, 4),
             *cluster_marker = PyTuple_GET_ITEM(ctx, 5), *cluster = PyTuple_GET_ITEM(ctx, 6),
             *cfg = PyTuple_GET_ITEM(ctx, 7);
    if (!PyUnicode_CheckExact(uniq_marker) || !PyUnicode_CheckExact(cluster_marker) ||
        !PyUnicode_IS_ASCII(uniq_marker) || !PyUnicode_IS_ASCII(cluster_marker))
        Py_RETURN_NONE;
    PyObject *topic = r->topic;
    if (topic == NULL || !PyUnicode_CheckExact(topic)) Py_RETURN_NONE;
    /* the routes are those of the topics' current version (else the Python lane makes them again) */
    /* sf_get_any (SLOT FIELDS): at the slot's offset when the class declares it (the processor's _lane_* do) */
    PyObject *st[5] = {PyObject_GetAttr(dv, sl_names[SL_COUNTER]), sf_get_any(proc, sl_names[SL_LCOUNTER]),
                       PyObject_GetAttr(dv, sl_names[SL_TIMESTAMP]), sf_get_any(proc, sl_names[SL_LTIMESTAMP]),
                       sf_get_any(proc, sl_names[SL_ROUTES])};
    PyObject *result = NULL, *route = NULL, *props = NULL, *uniq = NULL, *decorated = NULL, *msg = NULL, *res = NULL;
    PyObject *ints[5] = {NULL, NULL, NULL, NULL, NULL};
    PyObject *half_topic = NULL, *htx = NULL;  /* a half message's (THE HALF LANE): its topic (borrowed), its id */
    for (int i = 0; i < 5; i++) if (st[i] == NULL) goto done;
    int same = sl_eq(st[0], st[1]);
    if (same == 1) same = sl_eq(st[2], st[3]);
    if (same < 0) goto done;
    if (same == 0 || !PyDict_CheckExact(st[4])) goto decline;
    route = PyDict_GetItemWithError(st[4], topic);
    if (route == NULL) { if (PyErr_Occurred()) goto done; goto decline; }
    Py_INCREF(route);
    int64_t nqueues;
    if (!PyTuple_CheckExact(route) || PyTuple_GET_SIZE(route) != 2 ||
        !as_i64(PyTuple_GET_ITEM(route, 1), INT64_MIN, INT64_MAX, &nqueues))
        goto decline;
    /* props = x.get("i") or "" */
    props = r->props;
    if (props == NULL) props = PyUnicode_New(0, 0);
    else if (!PyUnicode_CheckExact(props)) { props = NULL; goto decline; }
    else Py_INCREF(props);
    if (props == NULL) goto done;
    if (r->present[SLF_M] && !(r->sp[SLF_M] != NULL && r->sl[SLF_M] == 5 && memcmp(r->sp[SLF_M], "false", 5) == 0))
        goto decline;  /* a batch, or a text only Boolean.parseBoolean reads: the Python lane's */
    int found = sl_props_scan(props, uniq_marker, cluster_marker);
    if (found < 0) goto done;
    if (found & SLP_DECLINE) goto decline;
    long long v[5];  /* e f h j g: queue id, sys flag, flag, reconsume times, born timestamp */
    for (int i = 0; i < 5; i++)
        if (!sl_int_span(r->sp[i], r->sl[i], &v[i])) goto decline;
    for (int i = SLF_L; i <= SLF_D; i++) {  /* unused here, but int() must read them when not empty */
        long long ignored;
        if (r->present[i] && !(r->sp[i] != NULL && r->sl[i] == 0) && !sl_int_span(r->sp[i], r->sl[i], &ignored))
            goto decline;
    }
    long long queue_id = v[0], sys_flag = v[1];
    if (found & SLP_TRAN) {  /* TRAN_MSG: a half message, served by THE HALF LANE when it is the usual kind */
        int hc = hl_check(ctx, props, sys_flag, found, cfg, &half_topic, &htx);
        if (hc < 0) goto done;
        if (hc == 0) goto decline;
    } else if (sys_flag & 0xC) goto decline;  /* a transaction bit */
    if (queue_id < 0 || queue_id >= nqueues) goto decline;  /* a random queue, or the full path's refusal */
    if (hold != Py_None) {  /* served here from now on */
        PyObject *h = PyObject_CallNoArgs(hold);
        if (h == NULL) goto done;
        Py_DECREF(h);
    }
    /* the decoration: UNIQ_KEY when missing (and the store makes them), CLUSTER when missing */
    PyObject *auto_obj = PyObject_GetAttr(cfg, sl_names[SL_AUTO_UNIQ]);
    if (auto_obj == NULL) goto done;
    int auto_uniq = PyObject_IsTrue(auto_obj);
    Py_DECREF(auto_obj);
    if (auto_uniq < 0) goto done;
    if (auto_uniq && !(found & SLP_UNIQ)) {
        uniq = uniq_create(NULL, gen);
        if (uniq == Py_None) { Py_DECREF(uniq); uniq = PyObject_CallMethodNoArgs(gen, sl_names[SL_CREATE]); }
        if (uniq == NULL) goto done;
    }
    decorated = sl_decorate(props, uniq_marker, uniq, cluster_marker, (found & SLP_CLUSTER) ? NULL : cluster);
    if (decorated == NULL) goto done;
    if (half_topic != NULL) {  /* TransactionalMessageService.prepare: REAL_TOPIC, REAL_QID; half topic, queue 0 */
        if (htx == NULL) {
            if (uniq == NULL) goto decline;  /* no UNIQ_KEY made after all: the full path's (nothing stored yet) */
            htx = Py_NewRef(uniq);
        }
        Py_SETREF(decorated, hl_props(decorated, topic, queue_id));
        if (decorated == NULL) goto done;
        v[0] = 0;
        v[1] = sys_flag & ~0xCLL;
    }
    /* Message(topic, body, None, None, queue_id, flag, None, sys_flag, born_ts, born_host, reconsume, 0, props) */
    for (int i = 0; i < 5; i++) if ((ints[i] = PyLong_FromLongLong(v[i])) == NULL) goto done;
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL) goto done;
    msg = message_type->tp_alloc(message_type, 0);
    if (msg == NULL) { Py_DECREF(zero); goto done; }
    PyObject *fv[F_COUNT];
    fv[F_TOPIC] = Py_NewRef(half_topic != NULL ? half_topic : topic);
    fv[F_BODY] = Py_NewRef(body);
    fv[F_TAGS] = Py_NewRef(Py_None);
    fv[F_KEYS] = Py_NewRef(Py_None);
    fv[F_QUEUE_ID] = Py_NewRef(ints[0]);
    fv[F_FLAG] = Py_NewRef(ints[2]);
    fv[F_PROPERTIES] = Py_NewRef(Py_None);
    fv[F_SYS_FLAG] = Py_NewRef(ints[1]);
    fv[F_BORN_TIMESTAMP] = Py_NewRef(ints[4]);
    fv[F_BORN_HOST] = Py_NewRef(PyUnicode_Check(born_host) && PyUnicode_GET_LENGTH(born_host) == 0 ? Py_None : born_host);
    fv[F_RECONSUME_TIMES] = Py_NewRef(ints[3]);
    fv[F_PREPARED_TX] = zero;
    fv[F_PROPERTIES_STRING] = Py_NewRef(decorated);
    fv[F_UNIQ_KEY] = Py_NewRef(Py_None);
    fv[F_FORCE_V2] = Py_NewRef(Py_False);
    for (int f = 0; f < F_COUNT; f++) *(PyObject **)((char *)msg + field_offsets[f]) = fv[f];
    /* store.put_message(msg): its native path is put_one */
    PyObject *call[2] = {store, msg};
    res = PyObject_VectorcallMethod(sl_names[SL_PUT], call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (res == NULL) goto done;
    result = sl_frame(r->opaque, r->version, res, queue_id, htx);
    if (result == Py_None) { *res_out = Py_NewRef(res); *qid_out = queue_id; *txid_out = Py_XNewRef(htx); }
    goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < 5; i++) { Py_XDECREF(st[i]); Py_XDECREF(ints[i]); }
    Py_XDECREF(route); Py_XDECREF(props); Py_XDECREF(uniq); Py_XDECREF(decorated); Py_XDECREF(msg); Py_XDECREF(res);
    Py_XDECREF(htx);
    return result;
}

/* the ASCII text of a header value (NULL when it is not an ASCII str: the int checks then decline) */
static inline void sl_span_of(sl_req *r, int i, PyObject *v) {
    r->present[i] = 1;
    if (PyUnicode_CheckExact(v) && PyUnicode_IS_ASCII(v)) {
        r->sp[i] = (const char *)PyUnicode_1BYTE_DATA(v);
        r->sl[i] = PyUnicode_GET_LENGTH(v);
    }
}

static PyObject *sl_result(PyObject *frame, PyObject *first, PyObject *res, long long qid, PyObject *txid) {
    /* frame, or (first, res, queue_id[, transaction id]) when the put's result is answered in Python, or None */
    if (frame == NULL || res == NULL) { Py_XDECREF(res); Py_XDECREF(txid); return frame; }
    Py_DECREF(frame);  /* None */
    PyObject *t = txid != NULL ? Py_BuildValue("(OOLO)", first, res, qid, txid) : Py_BuildValue("(OOL)", first, res, qid);
    Py_DECREF(res);
    Py_XDECREF(txid);
    return t;
}

/* send_lane(cmd, born_host, ctx): None, the response frame, or (cmd, PutMessageResult, queue_id) */
static PyObject *send_lane(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "send_lane(cmd, born_host, ctx)");
        return NULL;
    }
    if (sl_init() < 0) return NULL;
    PyObject *cmd = args[0];
    if (rc_type == NULL || Py_TYPE(cmd) != rc_type) Py_RETURN_NONE;
    PyObject *x = rc_get(cmd, RC_EXT), *body = rc_get(cmd, RC_BODY), *op = rc_get(cmd, RC_OPAQUE),
             *ver = rc_get(cmd, RC_VERSION);
    sl_req r;
    memset(&r, 0, sizeof r);
    int64_t o64, v64;
    if (x == NULL || !PyDict_CheckExact(x) || body == NULL || !PyBytes_CheckExact(body) || op == NULL ||
        ver == NULL || !as_i64(op, INT64_MIN, INT64_MAX, &o64) || !as_i64(ver, INT64_MIN, INT64_MAX, &v64))
        Py_RETURN_NONE;
    r.opaque = o64; r.version = v64;
    /* one pass over the header: the one-letter fields by letter; a V1 name or an extension of ours the lane
     * leaves to the full path (_LANE_EXTENSIONS) declines. Borrowed: nothing changes the dict meanwhile. */
    Py_ssize_t it = 0;
    PyObject *k, *val;
    while (PyDict_Next(x, &it, &k, &val)) {
        if (!PyUnicode_CheckExact(k)) Py_RETURN_NONE;
        Py_ssize_t kl = PyUnicode_GET_LENGTH(k);
        if (kl == 1) {
            switch (PyUnicode_READ_CHAR(k, 0)) {
            case 'b': r.topic = val; break;
            case 'i': r.props = val; break;
            case 'e': sl_span_of(&r, SLF_E, val); break;
            case 'f': sl_span_of(&r, SLF_F, val); break;
            case 'h': sl_span_of(&r, SLF_H, val); break;
            case 'j': sl_span_of(&r, SLF_J, val); break;
            case 'g': sl_span_of(&r, SLF_G, val); break;
            case 'l': sl_span_of(&r, SLF_L, val); break;
            case 'd': sl_span_of(&r, SLF_D, val); break;
            case 'm': sl_span_of(&r, SLF_M, val); break;
            default: break;
            }
            continue;
        }
        if (kl < 5 || kl > 21 || !PyUnicode_IS_ASCII(k)) continue;
        for (int i = SL_X0; i <= SL_X6; i++)
            if (PyUnicode_GET_LENGTH(sl_names[i]) == kl &&
                memcmp(PyUnicode_1BYTE_DATA(sl_names[i]), PyUnicode_1BYTE_DATA(k), kl) == 0)
                Py_RETURN_NONE;
    }
    PyObject *res, *txid;
    long long qid;
    PyObject *frame = sl_serve(&r, body, args[1], args[2], Py_None, &res, &qid, &txid);
    return sl_result(frame, cmd, res, qid, txid);
}

/* send_frame(data, born_host, (ctx, hold, max_frame, max_header, buffered)): the same for a read that is exactly one
 * SEND_MESSAGE_V2 frame, read straight from its bytes (no RemotingCommand, no extFields dict, no strings but
 * the topic and the properties). Takes a subset of what the C frame decoder takes (a JSON header of the plain
 * shape whose extFields are strings with plain ASCII keys, the integer fields without escapes), a request
 * (not a response, not one-way), while the connection's decoder holds nothing (`buffered`, its bytearray,
 * is empty); anything else is None before anything changed, and the caller decodes the read as before. hold() is called once the send is the lane's, before its put. Returns None, the
 * response frame, or (command, PutMessageResult, queue_id) (the command decoded as the decoder would). */
static PyObject *send_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_CheckExact(args[2]) || PyTuple_GET_SIZE(args[2]) != 5 ||
        !PyByteArray_Check(PyTuple_GET_ITEM(args[2], 4))) {
        PyErr_SetString(PyExc_TypeError, "send_frame(data, born_host, (ctx, hold, max_frame, max_header, buffered))");
        return NULL;
    }
    if (sl_init() < 0) return NULL;
    PyObject *data = args[0], *fctx = args[2];
    if (!PyBytes_CheckExact(data) || rc_type == NULL || PyByteArray_GET_SIZE(PyTuple_GET_ITEM(fctx, 4)) != 0)
        Py_RETURN_NONE;  /* the decoder holds part of a frame: its read */
    Py_ssize_t max_frame = PyLong_AsSsize_t(PyTuple_GET_ITEM(fctx, 2)), max_header = PyLong_AsSsize_t(PyTuple_GET_ITEM(fctx, 3));
    if ((max_frame == -1 || max_header == -1) && PyErr_Occurred()) return NULL;
    const unsigned char *base = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (n < 8) Py_RETURN_NONE;
    int32_t length = get_i32(base), word = get_i32(base + 4);
    Py_ssize_t hlen = word & 0xFFFFFF;
    if (length < 4 || length > max_frame || hlen > max_header || hlen > length - 4 || hlen <= 0 ||
        ((word >> 24) & 0xFF) != 0 || n != 4 + (Py_ssize_t)length)
        Py_RETURN_NONE;  /* not exactly one JSON frame: the decoder's */
    const unsigned char *h = base + 8;
    jcur c = {h, h + hlen};
    sl_req r;
    memset(&r, 0, sizeof r);
    long long code = 0, flag = 0, opaque = 0, version = 0;
    int have_code = 0, rc;
    PyObject *topic = NULL, *props = NULL, *result = NULL;
    /* the header object: as j_header, keeping only what the lane reads */
    if (hlen < 2 || *c.p != '{') Py_RETURN_NONE;
    c.p++;
    j_ws(&c);
    if (c.p < c.end && *c.p == '}') Py_RETURN_NONE;
    for (;;) {
        const unsigned char *k;
        Py_ssize_t kn;
        if ((rc = j_member(&c, &k, &kn)) != J_OK) goto fail_rc;
        long long *iv = j_header_int(k, kn, &code, &opaque, &flag, &version);
        if (iv != NULL) {
            have_code |= iv == &code;
            if ((rc = j_int32(&c, iv)) != J_OK) goto fail_rc;
            if (iv == &code && code != 310) goto decline;  /* another request (code comes first): at once */
        } else if (key_is(k, kn, "language", 8) || key_is(k, kn, "remark", 6)) {
            if (*c.p != '"') goto decline;
            if ((rc = j_string(&c, NULL, 0)) != J_OK) goto fail_rc;
        } else if (key_is(k, kn, "extFields", 9)) {
            if (*c.p != '{') goto decline;
            /* a new extFields object replaces an earlier one (json keeps the last) */
            Py_CLEAR(topic); Py_CLEAR(props);
            memset(r.sp, 0, sizeof r.sp); memset(r.sl, 0, sizeof r.sl); memset(r.present, 0, sizeof r.present);
            c.p++;
            j_ws(&c);
            if (c.p < c.end && *c.p == '}') c.p++;
            else for (;;) {
                j_ws(&c);
                if (c.p >= c.end || *c.p != '"') goto decline;
                const unsigned char *ek = c.p + 1, *q = ek;
                while (q < c.end && !j_scan[*q]) q++;  /* a plain ASCII key, else the decoder's */
                if (q >= c.end || *q != '"') goto decline;
                Py_ssize_t ekn = q - ek;
                c.p = q + 1;
                j_ws(&c);
                if (c.p >= c.end || *c.p != ':') goto decline;
                c.p++;
                j_ws(&c);
                if (c.p >= c.end || *c.p != '"') goto decline;  /* a value not a string: the decoder's */
                int slot = -1;
                if (ekn == 1) {
                    switch (ek[0]) {
                    case 'e': slot = SLF_E; break;
                    case 'f': slot = SLF_F; break;
                    case 'h': slot = SLF_H; break;
                    case 'j': slot = SLF_J; break;
                    case 'g': slot = SLF_G; break;
                    case 'l': slot = SLF_L; break;
                    case 'd': slot = SLF_D; break;
                    case 'm': slot = SLF_M; break;
                    default: break;
                    }
                } else if (ekn >= 5 && ekn <= 21) {
                    for (int i = SL_X0; i <= SL_X6; i++)
                        if (PyUnicode_GET_LENGTH(sl_names[i]) == ekn && memcmp(PyUnicode_1BYTE_DATA(sl_names[i]), ek, ekn) == 0)
                            goto decline;
                }
                if (ekn == 1 && (ek[0] == 'b' || ek[0] == 'i')) {
                    PyObject *v = NULL;
                    if ((rc = j_string(&c, &v, 1)) != J_OK) goto fail_rc;
                    Py_XSETREF(*(ek[0] == 'b' ? &topic : &props), v);
                } else {
                    const unsigned char *vs = c.p + 1;
                    if ((rc = j_string(&c, NULL, 0)) != J_OK) goto fail_rc;
                    if (slot >= 0) {
                        Py_ssize_t vn = c.p - 1 - vs;
                        r.present[slot] = 1;
                        r.sp[slot] = NULL; r.sl[slot] = 0;
                        const unsigned char *z = vs;
                        while (z < vs + vn && !j_scan[*z]) z++;  /* plain ASCII, no escapes: its text as it is */
                        if (z == vs + vn) { r.sp[slot] = (const char *)vs; r.sl[slot] = vn; }
                    }
                }
                int more = j_next(&c);
                if (more > 0) continue;
                if (more == 0) break;
                goto decline;
            }
        } else {  /* another field: checked, not kept (as j_header) */
            if ((rc = j_skip_value(&c)) != J_OK) goto fail_rc;
        }
        int more = j_next(&c);
        if (more > 0) continue;
        if (more == 0) break;
        goto decline;
    }
    j_ws(&c);
    if (c.p != c.end || !have_code || code != 310 || (flag & 3) != 0) goto decline;  /* SEND_MESSAGE_V2 requests */
    r.topic = topic; r.props = props; r.opaque = opaque; r.version = version;
    {
        PyObject *body = PyBytes_FromStringAndSize((const char *)h + hlen, n - 8 - hlen);
        if (body == NULL) goto done;
        PyObject *res, *txid;
        long long qid;
        PyObject *frame = sl_serve(&r, body, args[1], PyTuple_GET_ITEM(fctx, 0), PyTuple_GET_ITEM(fctx, 1), &res, &qid,
                                   &txid);
        Py_DECREF(body);
        if (frame != NULL && res != NULL) {  /* answered in Python: the command, as the decoder makes it */
            PyObject *dargs = Py_BuildValue("(Onnn)", data, (Py_ssize_t)0, max_frame, max_header);
            PyObject *got = dargs != NULL ? remoting_decode(NULL, dargs) : NULL, *cmd = NULL;
            Py_XDECREF(dargs);
            if (got != NULL && PyTuple_Check(got) && PyList_Check(PyTuple_GET_ITEM(got, 0)) &&
                PyList_GET_SIZE(PyTuple_GET_ITEM(got, 0)) == 1)
                cmd = PyList_GET_ITEM(PyTuple_GET_ITEM(got, 0), 0);
            if (cmd == NULL) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "send_frame: the served frame does not decode");
                Py_XDECREF(got); Py_DECREF(frame); Py_DECREF(res); Py_XDECREF(txid);
                goto done;
            }
            result = sl_result(frame, cmd, res, qid, txid);
            Py_DECREF(got);
            goto done;
        }
        result = frame;
        goto done;
    }
fail_rc:
    if (rc == J_ERROR) goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(topic); Py_XDECREF(props);
    return result;
}
/* ============================ end of THE SEND LANE ================================================== */

/* ============================================================================================== */
/* THE CLIENT SEND (issue 16, branch client-send): a producer's single send without a             */
/* RemotingCommand on either side of the wire (client/producer.py's fast path).                    */
/*   client_send_frame  the SEND_MESSAGE_V2 request frame of one Message, straight from its fields: */
/*                      what Producer._properties + the ext dict + RemotingCommand.encode make      */
/*                      (tests/test_client_send_native.py compares them byte for byte)              */
/*   client_send_take   a lone caller's read holding exactly its own SUCCESS response: the three    */
/*                      values SendResult needs, without decoding a RemotingCommand                 */
/* Both decline (None, nothing done) for anything but the plain shapes; Python then decides.       */
/* ============================================================================================== */

/* int(time.time() * 1000), with the same clock and the same double arithmetic as CPython 3.11's
 * time.time() (_PyTime_GetSystemClock, _PyTime_AsSecondsDouble), so the same value */
static long long cs_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    double d;
    if (ns % 1000000000LL == 0) d = (double)(ns / 1000000000LL);
    else { d = (double)ns; d /= 1e9; }
    return (long long)(d * 1000.0);
}

/* a decimal int64 */
static int cs_put_ll(rbuf *b, long long v) {
    char tmp[24], *e = tmp + sizeof tmp, *d = e;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do { *--d = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) *--d = '-';
    return rbuf_put(b, d, e - d);
}

/* an exact int as a quoted JSON string of its decimal text (str(v)); 0 when no exact int within 64 bits */
static int cs_put_qint(rbuf *b, PyObject *o) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
    return rbuf_put(b, "\"", 1) && cs_put_ll(b, v) && rbuf_put(b, "\"", 1);
}

/* name \x01 utf8(value) \x02; 0 (error cleared) when value does not encode (a lone surrogate) */
static int cs_prop(rbuf *b, const char *name, Py_ssize_t nl, PyObject *value) {
    Py_ssize_t vl;
    const char *v = PyUnicode_AsUTF8AndSize(value, &vl);
    if (v == NULL) { PyErr_Clear(); return 0; }
    if (!rbuf_grow(b, nl + vl + 2)) return 0;
    memcpy(b->p + b->len, name, nl); b->len += nl;
    b->p[b->len++] = 1;
    memcpy(b->p + b->len, v, vl); b->len += vl;
    b->p[b->len++] = 2;
    return 1;
}

/* UTF-8 bytes as the quoted JSON string rbuf_jstr writes of their str */
static int cs_jraw(rbuf *b, const unsigned char *s, Py_ssize_t n) {
    if (!rbuf_grow(b, n * 6 + 2)) return 0;
    unsigned char *d = b->p + b->len;
    *d++ = '"';
    static const char hex[] = "0123456789abcdef";
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t run = i;
        while (i < n && !jstr_esc[s[i]]) i++;
        if (i > run) { memcpy(d, s + run, i - run); d += i - run; }
        if (i == n) break;
        unsigned char c = s[i];
        *d++ = '\\';
        switch (c) {
        case '"': *d++ = '"'; break;
        case '\\': *d++ = '\\'; break;
        case '\b': *d++ = 'b'; break;
        case '\f': *d++ = 'f'; break;
        case '\n': *d++ = 'n'; break;
        case '\r': *d++ = 'r'; break;
        case '\t': *d++ = 't'; break;
        default: *d++ = 'u'; *d++ = '0'; *d++ = '0'; *d++ = hex[c >> 4]; *d++ = hex[c & 15];
        }
    }
    *d++ = '"';
    b->len = d - b->p;
    return 1;
}

/* The properties Producer._properties sends for a Message without a properties_string, delay level 0:
 * build_properties_string(msg, uniq) (TAGS, KEYS, UNIQ_KEY, then the properties dict but those three),
 * then WAIT=true unless "WAIT\x01" is in them. 0 (nothing to raise) when a field is not of the common
 * types (str tags, str or list/tuple of str keys, dict of str properties, None values skipped) or a text
 * does not encode; -1 on a memory error. */
static int cs_props(rbuf *b, PyObject *m, PyObject *uniq) {
    PyObject *tags = field(m, F_TAGS), *keys = field(m, F_KEYS), *props = field(m, F_PROPERTIES);
    if (tags == NULL || keys == NULL || props == NULL) return 0;
    if (tags != Py_None) {
        if (!PyUnicode_CheckExact(tags)) return 0;
        if (PyUnicode_GET_LENGTH(tags) && !cs_prop(b, "TAGS", 4, tags)) return PyErr_Occurred() ? -1 : 0;
    }
    if (keys != Py_None) {
        if (PyUnicode_CheckExact(keys)) {
            if (PyUnicode_GET_LENGTH(keys) && !cs_prop(b, "KEYS", 4, keys)) return PyErr_Occurred() ? -1 : 0;
        } else if (PyList_CheckExact(keys) || PyTuple_CheckExact(keys)) {
            Py_ssize_t nk = PySequence_Fast_GET_SIZE(keys);
            PyObject **ki = PySequence_Fast_ITEMS(keys);
            if (nk > 0) {  /* KEYS \x01 " ".join(keys) \x02, unless the join is empty */
                Py_ssize_t start = b->len;
                if (!rbuf_put(b, "KEYS\x01", 5)) return -1;
                Py_ssize_t vstart = b->len;
                for (Py_ssize_t j = 0; j < nk; j++) {
                    if (!PyUnicode_CheckExact(ki[j])) return 0;
                    Py_ssize_t kl;
                    const char *kv = PyUnicode_AsUTF8AndSize(ki[j], &kl);
                    if (kv == NULL) { PyErr_Clear(); return 0; }
                    if ((j > 0 && !rbuf_put(b, " ", 1)) || !rbuf_put(b, kv, kl)) return -1;
                }
                if (b->len == vstart) b->len = start;
                else if (!rbuf_put(b, "\x02", 1)) return -1;
            }
        } else {
            return 0;
        }
    }
    if (!PyUnicode_CheckExact(uniq)) return 0;
    if (PyUnicode_GET_LENGTH(uniq) && !cs_prop(b, "UNIQ_KEY", 8, uniq)) return PyErr_Occurred() ? -1 : 0;
    if (props != Py_None) {
        if (!PyDict_CheckExact(props)) return 0;
        Py_ssize_t dp = 0;
        PyObject *dk, *dv;
        while (PyDict_Next(props, &dp, &dk, &dv)) {
            if (dv == Py_None) continue;
            if (!PyUnicode_CheckExact(dk) || !PyUnicode_CheckExact(dv)) return 0;
            if (PyUnicode_CompareWithASCIIString(dk, "TAGS") == 0 || PyUnicode_CompareWithASCIIString(dk, "KEYS") == 0
                || PyUnicode_CompareWithASCIIString(dk, "UNIQ_KEY") == 0)
                continue;
            Py_ssize_t kl;
            const char *kn = PyUnicode_AsUTF8AndSize(dk, &kl);
            if (kn == NULL) { PyErr_Clear(); return 0; }
            if (!cs_prop(b, kn, kl, dv)) return PyErr_Occurred() ? -1 : 0;
        }
    }
    for (Py_ssize_t i = 0; i + 5 <= b->len; i++)
        if (b->p[i] == 'W' && memcmp(b->p + i, "WAIT\x01", 5) == 0) return 1;
    return rbuf_put(b, "WAIT\x01true\x02", 10) ? 1 : -1;
}

/* client_send_frame(msg, uniq, group, queue_id, opaque, born_ms or None[, extra, sys_flag]) -> frame or None.
 * The SEND_MESSAGE_V2 request Producer.send writes for a Message `msg` without a properties_string (delay
 * level 0, no stream, no timer): RemotingCommand(310, {"a": group, "b": msg.topic, "c": "TBW102", "d": "4",
 * "e": str(queue_id), "f": str(msg.sys_flag), "g": str(born_ms), "h": str(msg.flag), "i": properties, "j":
 * str(msg.reconsume_times), "k": "false"}, msg.body, opaque).encode(), `uniq` the UNIQ_KEY (the caller's
 * msg.uniq_key or a new id); born_ms None: int(time.time() * 1000) now. None for anything else: another
 * type, a body that is not bytes, an int field that is not an exact int within 64 bits, a text that does
 * not encode, a frame over 2 GiB.
 * `extra` (a str, or None) is appended to the properties as they are (after WAIT), and `sys_flag` (an int, or
 * None) is sent instead of msg.sys_flag: a TransactionProducer.prepare's half message, whose properties end
 * with set_property's TRAN_MSG and PGROUP (the caller checks that msg.properties has neither) and whose flag
 * says prepared. */
static PyObject *client_send_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "client_send_frame takes 6 or 8 arguments");
        return NULL;
    }
    PyObject *m = args[0], *uniq = args[1], *group = args[2], *q = args[3], *opaque = args[4], *born = args[5];
    PyObject *extra = nargs == 8 ? args[6] : Py_None, *flag_for = nargs == 8 ? args[7] : Py_None;
    if (message_type == NULL || Py_TYPE(m) != message_type) Py_RETURN_NONE;
    PyObject *topic = field(m, F_TOPIC), *body = field(m, F_BODY), *ps = field(m, F_PROPERTIES_STRING),
             *flag = field(m, F_FLAG), *sys_flag = field(m, F_SYS_FLAG), *reconsume = field(m, F_RECONSUME_TIMES);
    if (topic == NULL || body == NULL || ps != Py_None || flag == NULL || sys_flag == NULL || reconsume == NULL
        || !PyBytes_CheckExact(body) || !PyLong_CheckExact(opaque) || (extra != Py_None && !PyUnicode_CheckExact(extra)))
        Py_RETURN_NONE;
    if (flag_for != Py_None) sys_flag = flag_for;  /* checked as msg.sys_flag is: an exact int within 64 bits */
    const char *extra_p = NULL;
    Py_ssize_t extra_n = 0;
    if (extra != Py_None) {
        extra_p = PyUnicode_AsUTF8AndSize(extra, &extra_n);
        if (extra_p == NULL) { PyErr_Clear(); Py_RETURN_NONE; }
    }
    long long born_ms;
    if (born == Py_None) born_ms = cs_now_ms();
    else {
        int overflow;
        if (!PyLong_CheckExact(born)) Py_RETURN_NONE;
        born_ms = PyLong_AsLongLongAndOverflow(born, &overflow);
        if (overflow || (born_ms == -1 && PyErr_Occurred())) { PyErr_Clear(); Py_RETURN_NONE; }
    }
    rbuf pb, b;
    pb.p = pb.small; pb.len = 0; pb.cap = sizeof pb.small;
    b.p = b.small; b.len = 8; b.cap = sizeof b.small;  /* the two length words first */
    PyObject *res = NULL;
    int r = cs_props(&pb, m, uniq);
    if (r <= 0) goto done;
    if (extra_n && !rbuf_put(&pb, extra_p, extra_n)) { r = 0; goto done; }
#define CPUT(lit) rbuf_put(&b, lit, sizeof(lit) - 1)
    r = CPUT("{\"code\":310,\"language\":\"PYTHON\",\"version\":435,\"opaque\":") && rbuf_int(&b, opaque)
        && CPUT(",\"flag\":0,\"extFields\":{\"a\":") && rbuf_jstr(&b, group)
        && CPUT(",\"b\":") && rbuf_jstr(&b, topic) && CPUT(",\"c\":\"TBW102\",\"d\":\"4\",\"e\":") && cs_put_qint(&b, q)
        && CPUT(",\"f\":") && cs_put_qint(&b, sys_flag) && CPUT(",\"g\":\"") && cs_put_ll(&b, born_ms)
        && CPUT("\",\"h\":") && cs_put_qint(&b, flag) && CPUT(",\"i\":") && cs_jraw(&b, pb.p, pb.len)
        && CPUT(",\"j\":") && cs_put_qint(&b, reconsume) && CPUT(",\"k\":\"false\"},\"serializeTypeCurrentRPC\":\"JSON\"}");
#undef CPUT
    if (!r) goto done;
    res = rbuf_frame(&b, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body));
done:
    rbuf_free(&pb);
    rbuf_free(&b);
    return res != NULL ? res : rbuf_declined();
}

/* a JSON string value at c->p that is plain digits, "-?[0-9]{1,18}", as int() reads it; 0 for any other
 * (int() may still take it, with spaces, '+', '_' or other digits: the caller declines, Python decides) */
static int cs_digits(jcur *c, long long *out) {
    const unsigned char *p = c->p + 1, *e = c->end;
    int neg = 0;
    if (p < e && *p == '-') { neg = 1; p++; }
    const unsigned char *d = p;
    long long v = 0;
    while (p < e && *p >= '0' && *p <= '9' && p - d < 18) { v = v * 10 + (*p - '0'); p++; }
    if (p == d || p >= e || *p != '"') return 0;
    c->p = p + 1;
    *out = neg ? -v : v;
    return 1;
}

/* client_send_take(buf, n, opaque) -> (msgId, queue id or None, queue offset) or None.
 * buf[:n] (a bytearray: what a lone caller's recv just read, nothing buffered before it) is exactly one
 * JSON frame in the plain shape FrameDecoder decodes in C (remoting_decode's j_header: the same grammar, read
 * without building the command), a response (flag bit 0) to `opaque` with code SUCCESS (0) and no
 * streamVersion among its extFields: then the values Producer._send makes of it, x.get("msgId", ""),
 * int(x["queueId"]) (None when absent) and int(x.get("queueOffset", -1)), for plain-digit texts. None,
 * nothing consumed, for anything else (another shape or code, escapes in a key, other digit texts): the
 * caller feeds the bytes to the FrameDecoder as before. Duplicate keys: the last one counts, as in the dict. */
/* j_string(c, NULL, 0) with the common case inline: a string of plain ASCII up to its closing quote */
static inline int cs_skip(jcur *c) {
    const unsigned char *q = c->p + 1;
    while (q < c->end && !j_scan[*q]) q++;
    if (q < c->end && *q == '"') { c->p = q + 1; return J_OK; }
    return j_string(c, NULL, 0);
}

static PyObject *client_send_take(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (rc_type == NULL || nargs != 3 || !PyByteArray_CheckExact(args[0]) || !PyLong_CheckExact(args[1])
        || !PyLong_CheckExact(args[2]))
        Py_RETURN_NONE;  /* rc_type: remoting_init not called (RMQ_EVENTSTORE_PURE=1), so the codec is Python's */
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    long long want = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) { PyErr_Clear(); Py_RETURN_NONE; }
    if (n < 8 || n > PyByteArray_GET_SIZE(args[0])) Py_RETURN_NONE;
    const unsigned char *base = (const unsigned char *)PyByteArray_AS_STRING(args[0]);
    int32_t length = get_i32(base), word = get_i32(base + 4);
    Py_ssize_t hlen = word & 0xFFFFFF;
    if ((Py_ssize_t)length + 4 != n || ((word >> 24) & 0xFF) != 0 || hlen <= 0 || hlen > length - 4
        || hlen > 1024 * 1024)
        Py_RETURN_NONE;
    jcur c = {base + 8, base + 8 + hlen};
    long long code = 0, opaque = 0, flag = 0, qid = 0, qoff = -1, ignored;
    int have_code = 0, have_qid = 0;
    const unsigned char *mid = NULL, *mid_end = NULL;  /* msgId's string, quotes included */
    if (hlen < 2 || *c.p != '{') Py_RETURN_NONE;
    c.p++;
    j_ws(&c);
    if (c.p < c.end && *c.p == '}') Py_RETURN_NONE;
    for (;;) {
        const unsigned char *k;
        Py_ssize_t kn;
        if (j_member(&c, &k, &kn) != J_OK) goto give_way;
        long long *iv = j_header_int(k, kn, &code, &opaque, &flag, &ignored);
        if (iv != NULL) {
            have_code |= iv == &code;
            if (j_int32(&c, iv) != J_OK) Py_RETURN_NONE;
        } else if (key_is(k, kn, "language", 8) || key_is(k, kn, "remark", 6)) {
            if (*c.p != '"' || cs_skip(&c) != J_OK) goto give_way;
        } else if (key_is(k, kn, "extFields", 9)) {
            if (*c.p != '{') Py_RETURN_NONE;
            c.p++;
            mid = NULL; have_qid = 0; qoff = -1;  /* a later extFields replaces an earlier one */
            j_ws(&c);
            if (c.p < c.end && *c.p == '}') c.p++;
            else for (;;) {
                const unsigned char *ek;
                Py_ssize_t ekn;
                if (j_member(&c, &ek, &ekn) != J_OK) goto give_way;  /* an escaped key: the dict decides */
                if (*c.p != '"') Py_RETURN_NONE;
                if (key_is(ek, ekn, "queueId", 7)) {
                    if (!cs_digits(&c, &qid)) Py_RETURN_NONE;
                    have_qid = 1;
                } else if (key_is(ek, ekn, "queueOffset", 11)) {
                    if (!cs_digits(&c, &qoff)) Py_RETURN_NONE;
                } else if (key_is(ek, ekn, "streamVersion", 13)) {
                    Py_RETURN_NONE;
                } else {
                    const unsigned char *v = c.p;
                    if (cs_skip(&c) != J_OK) goto give_way;
                    if (key_is(ek, ekn, "msgId", 5)) { mid = v; mid_end = c.p; }
                }
                int more = j_next(&c);
                if (more > 0) continue;
                if (more == 0) break;
                Py_RETURN_NONE;
            }
        } else {  /* another field: checked, not kept (as j_header) */
            if (j_skip_value(&c) != J_OK) goto give_way;
        }
        int more = j_next(&c);
        if (more > 0) continue;
        if (more == 0) break;
        Py_RETURN_NONE;
    }
    j_ws(&c);
    if (c.p != c.end || !have_code || code != 0 || opaque != want || !(flag & 1)) Py_RETURN_NONE;
    PyObject *ms;
    if (mid != NULL) {
        jcur mc = {mid, mid_end};
        if (j_string(&mc, &ms, 1) != J_OK) goto give_way;
    } else {
        ms = PyUnicode_New(0, 127);
        if (ms == NULL) return NULL;
    }
    PyObject *qv = have_qid ? PyLong_FromLongLong(qid) : Py_NewRef(Py_None), *ov = PyLong_FromLongLong(qoff);
    PyObject *res = qv != NULL && ov != NULL ? PyTuple_New(3) : NULL;
    if (res == NULL) { Py_DECREF(ms); Py_XDECREF(qv); Py_XDECREF(ov); return NULL; }
    PyTuple_SET_ITEM(res, 0, ms);
    PyTuple_SET_ITEM(res, 1, qv);
    PyTuple_SET_ITEM(res, 2, ov);
    return res;
give_way:
    return rbuf_declined();
}
/* client_take_response(buf, n, opaque) -> RemotingCommand or None: a lone caller's read buf[:n] (a bytearray,
 * nothing buffered before it) that is exactly one JSON frame remoting_decode takes, a response (flag bit 0)
 * to `opaque`: the command remoting_decode would make of it (the same j_header, body and serialize type).
 * None, nothing consumed, for anything else: the caller dispatches the bytes through the FrameDecoder. */
static PyObject *client_take_response(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (rc_type == NULL || nargs != 3 || !PyByteArray_CheckExact(args[0]) || !PyLong_CheckExact(args[1])
        || !PyLong_CheckExact(args[2]))
        Py_RETURN_NONE;
    Py_ssize_t n = PyLong_AsSsize_t(args[1]);
    long long want = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) { PyErr_Clear(); Py_RETURN_NONE; }
    if (n < 8 || n > PyByteArray_GET_SIZE(args[0])) Py_RETURN_NONE;
    const unsigned char *base = (const unsigned char *)PyByteArray_AS_STRING(args[0]);
    int32_t length = get_i32(base), word = get_i32(base + 4);
    Py_ssize_t hlen = word & 0xFFFFFF;
    if ((Py_ssize_t)length + 4 != n || ((word >> 24) & 0xFF) != 0 || hlen <= 0 || hlen > length - 4
        || hlen > 1024 * 1024)
        Py_RETURN_NONE;
    PyObject *cmd = NULL;
    int rc = j_header(base + 8, hlen, &cmd);
    if (rc == J_ERROR) return NULL;
    if (rc != J_OK) Py_RETURN_NONE;
    if (PyLong_AsLongLong(rc_get(cmd, RC_OPAQUE)) != want || !(PyLong_AsLong(rc_get(cmd, RC_FLAG)) & 1)) {
        Py_DECREF(cmd);
        Py_RETURN_NONE;
    }
    PyObject *body = PyBytes_FromStringAndSize((const char *)base + 8 + hlen, n - 8 - hlen);
    if (body == NULL) { Py_DECREF(cmd); return NULL; }
    rc_set(cmd, RC_BODY, body);
    rc_set(cmd, RC_STYPE, Py_NewRef(rc_stype_json));
    return cmd;
}

/* client_new_request(code, ext_fields, body, opaque, flag) -> RemotingCommand: RemotingCommand(code, ext, body,
 * opaque, flag) with language "PYTHON", version 435, remark None and serialize type JSON, its slots filled
 * directly (no __init__ frame); `ext_fields` (a dict, or None: {}) as _ext_strings makes it: str values kept,
 * exact ints as str(), None values left out, in order. None (nothing made) for any other value: the caller
 * runs the Python constructor, which converts or raises as it always did. */
static PyObject *cs_lang_python, *cs_version_435;
static PyObject *client_new_request(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "client_new_request takes 5 arguments");
        return NULL;
    }
    PyObject *code = args[0], *ext = args[1], *body = args[2], *opaque = args[3], *flag = args[4];
    if (rc_type == NULL || (ext != Py_None && !PyDict_CheckExact(ext))) Py_RETURN_NONE;
    if (cs_lang_python == NULL) {
        cs_lang_python = PyUnicode_InternFromString("PYTHON");
        cs_version_435 = PyLong_FromLong(435);
        if (cs_lang_python == NULL || cs_version_435 == NULL) return NULL;
    }
    PyObject *out = PyDict_New();
    if (out == NULL) return NULL;
    if (ext != Py_None) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        while (PyDict_Next(ext, &pos, &k, &v)) {
            int r;
            if (PyUnicode_CheckExact(v)) r = PyDict_SetItem(out, k, v);
            else if (PyLong_CheckExact(v)) {
                PyObject *t = PyObject_Str(v);
                if (t == NULL) { Py_DECREF(out); return NULL; }
                r = PyDict_SetItem(out, k, t);
                Py_DECREF(t);
            } else if (v == Py_None) continue;
            else { Py_DECREF(out); Py_RETURN_NONE; }
            if (r < 0) { Py_DECREF(out); return NULL; }
        }
    }
    PyObject *o = rc_type->tp_alloc(rc_type, 0);
    if (o == NULL) { Py_DECREF(out); return NULL; }
    rc_set(o, RC_CODE, Py_NewRef(code));
    rc_set(o, RC_EXT, out);
    rc_set(o, RC_BODY, Py_NewRef(body));
    rc_set(o, RC_OPAQUE, Py_NewRef(opaque));
    rc_set(o, RC_FLAG, Py_NewRef(flag));
    rc_set(o, RC_REMARK, Py_NewRef(Py_None));
    rc_set(o, RC_LANGUAGE, Py_NewRef(cs_lang_python));
    rc_set(o, RC_VERSION, Py_NewRef(cs_version_435));
    rc_set(o, RC_STYPE, Py_NewRef(rc_stype_json));
    return o;
}
/* ============================ end of THE CLIENT SEND ================================================= */

/* ============================================================================================== */
/* THE POP LANE (branch pop-lane): a POP_MESSAGE served from its frame's bytes.                      */
/*  pop_frame(data, max_frame, max_header, buffered): the fields PopMessageProcessor.process reads,  */
/*  straight from a read that is exactly one POP_MESSAGE request frame (JSON header, extFields of     */
/*  strings with plain ASCII keys, not one-way), while the connection's decoder holds nothing          */
/*  (`buffered`, its bytearray, is empty): (opaque, version, consumerGroup, topic, queueId, maxMsgNums,*/
/*  invisibleTime, pollTime, exp, expType), each extField None when absent, the integer ones ints      */
/*  (plain -?digits only: any other text, even one int() reads, is None for the whole frame). None:    */
/*  not such a frame (the caller decodes the read as before). Nothing is changed either way.          */
/*  pop_response(code, opaque, version, remark, popTime, invisibleTime, reviveQid, restNum,          */
/*  startOffsetInfo, msgOffsetInfo, body): the frame RemotingCommand(code, {popTime, invisibleTime,   */
/*  reviveQid, restNum, startOffsetInfo, msgOffsetInfo} as strings, body, opaque, FLAG_RESPONSE,       */
/*  remark, "JAVA", version).encode() gives; None when an argument is not of the plain kind.          */
/*  Reference: PopMessageProcessor.process + RemotingCommand.encode (tests/test_pop_lane.py).          */
/* ============================================================================================== */
enum { PF_GROUP, PF_TOPIC, PF_EXP, PF_EXPTYPE, PF_STRS };
enum { PF_QID, PF_MAX, PF_INV, PF_POLL, PF_INTS };

/* a plain decimal integer text (-?digits, at most 18 digits), as int() reads it; 0 when it is not that */
static int pf_int(const unsigned char *s, Py_ssize_t n, long long *out) {
    Py_ssize_t i = 0;
    int neg = 0;
    if (n > 0 && s[0] == '-') { neg = 1; i = 1; }
    if (i >= n || n - i > 18) return 0;
    long long v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    *out = neg ? -v : v;
    return 1;
}

static PyObject *pop_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyByteArray_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "pop_frame(data, max_frame, max_header, buffered)");
        return NULL;
    }
    PyObject *data = args[0];
    if (!PyBytes_CheckExact(data) || PyByteArray_GET_SIZE(args[3]) != 0) Py_RETURN_NONE;
    Py_ssize_t max_frame = PyLong_AsSsize_t(args[1]), max_header = PyLong_AsSsize_t(args[2]);
    if ((max_frame == -1 || max_header == -1) && PyErr_Occurred()) return NULL;
    const unsigned char *base = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (n < 8) Py_RETURN_NONE;
    int32_t length = get_i32(base), word = get_i32(base + 4);
    Py_ssize_t hlen = word & 0xFFFFFF;
    if (length < 4 || length > max_frame || hlen > max_header || hlen > length - 4 || hlen < 2 ||
        ((word >> 24) & 0xFF) != 0 || n != 4 + (Py_ssize_t)length)
        Py_RETURN_NONE;  /* not exactly one JSON frame: the decoder's */
    const unsigned char *h = base + 8;
    jcur c = {h, h + hlen};
    long long code = 0, flag = 0, opaque = 0, version = 0, ints[PF_INTS];
    int have_code = 0, have_int[PF_INTS] = {0}, rc;
    PyObject *strs[PF_STRS] = {NULL}, *result = NULL;
    if (*c.p != '{') Py_RETURN_NONE;
    c.p++;
    j_ws(&c);
    if (c.p < c.end && *c.p == '}') Py_RETURN_NONE;
    for (;;) {
        const unsigned char *k;
        Py_ssize_t kn;
        if ((rc = al_member(&c, &k, &kn)) != J_OK) goto fail_rc;
        long long *iv = j_header_int(k, kn, &code, &opaque, &flag, &version);
        if (iv != NULL) {
            have_code |= iv == &code;
            if ((rc = j_int32(&c, iv)) != J_OK) goto fail_rc;
            if (iv == &code && code != 200050) goto decline;  /* another request: at once */
        } else if (key_is(k, kn, "language", 8) || key_is(k, kn, "remark", 6)) {
            if (*c.p != '"') goto decline;
            if ((rc = j_string(&c, NULL, 0)) != J_OK) goto fail_rc;
        } else if (key_is(k, kn, "extFields", 9)) {
            if (*c.p != '{') goto decline;
            for (int i = 0; i < PF_STRS; i++) Py_CLEAR(strs[i]);  /* a later extFields replaces an earlier one */
            memset(have_int, 0, sizeof have_int);
            c.p++;
            j_ws(&c);
            if (c.p < c.end && *c.p == '}') c.p++;
            else for (;;) {
                j_ws(&c);
                if (c.p >= c.end || *c.p != '"') goto decline;
                const unsigned char *ek = c.p + 1, *q = ek;
                while (q < c.end && !j_scan[*q]) q++;  /* a plain ASCII key, else the decoder's */
                if (q >= c.end || *q != '"') goto decline;
                Py_ssize_t ekn = q - ek;
                c.p = q + 1;
                j_ws(&c);
                if (c.p >= c.end || *c.p != ':') goto decline;
                c.p++;
                j_ws(&c);
                if (c.p >= c.end || *c.p != '"') goto decline;  /* a value not a string: the decoder's */
                int s = key_is(ek, ekn, "consumerGroup", 13) ? PF_GROUP : key_is(ek, ekn, "topic", 5) ? PF_TOPIC
                        : key_is(ek, ekn, "exp", 3) ? PF_EXP : key_is(ek, ekn, "expType", 7) ? PF_EXPTYPE : -1;
                int iv2 = s >= 0 ? -1 : key_is(ek, ekn, "queueId", 7) ? PF_QID : key_is(ek, ekn, "maxMsgNums", 10) ? PF_MAX
                          : key_is(ek, ekn, "invisibleTime", 13) ? PF_INV : key_is(ek, ekn, "pollTime", 8) ? PF_POLL : -1;
                if (s >= 0) {
                    PyObject *v = NULL;
                    if ((rc = j_string(&c, &v, 1)) != J_OK) goto fail_rc;
                    Py_XSETREF(strs[s], v);
                } else {
                    const unsigned char *vs = c.p + 1;
                    if ((rc = j_string(&c, NULL, 0)) != J_OK) goto fail_rc;
                    if (iv2 >= 0) {
                        if (!pf_int(vs, c.p - 1 - vs, &ints[iv2])) goto decline;  /* an escape, a space, "": int()'s */
                        have_int[iv2] = 1;
                    }
                }
                int more = j_next(&c);
                if (more > 0) continue;
                if (more == 0) break;
                goto decline;
            }
        } else {  /* another field: checked, not kept (as j_header) */
            if ((rc = j_skip_value(&c)) != J_OK) goto fail_rc;
        }
        int more = j_next(&c);
        if (more > 0) continue;
        if (more == 0) break;
        goto decline;
    }
    j_ws(&c);
    if (c.p != c.end || !have_code || code != 200050 || (flag & 3) != 0) goto decline;  /* POP requests */
    result = PyTuple_New(10);
    if (result == NULL) goto done;
    PyObject *items[10];
    items[0] = PyLong_FromLongLong(opaque);
    items[1] = PyLong_FromLongLong(version);
    for (int i = 0; i < PF_STRS; i++) items[i < 2 ? 2 + i : 6 + i] = strs[i] != NULL ? Py_NewRef(strs[i]) : Py_NewRef(Py_None);
    for (int i = 0; i < PF_INTS; i++) items[4 + i] = have_int[i] ? PyLong_FromLongLong(ints[i]) : Py_NewRef(Py_None);
    for (int i = 0; i < 10; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 10; j++) if (j != i && items[j] != NULL && j > i) Py_DECREF(items[j]);
            Py_CLEAR(result);
            goto done;
        }
        PyTuple_SET_ITEM(result, i, items[i]);
    }
    goto done;
fail_rc:
    if (rc == J_ERROR) goto done;
decline:
    result = Py_NewRef(Py_None);
done:
    for (int i = 0; i < PF_STRS; i++) Py_XDECREF(strs[i]);
    return result;
}

/* a 64-bit int as a JSON string of its digits ("123"); 0 when it is no exact int in 64 bits */
static int pf_qint(rbuf *b, PyObject *o) {
    if (!PyLong_CheckExact(o)) return 0;
    return rbuf_put(b, "\"", 1) && rbuf_int(b, o) && rbuf_put(b, "\"", 1);
}

static PyObject *pop_response(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "pop_response(code, opaque, version, remark, popTime, invisibleTime, "
                        "reviveQid, restNum, startOffsetInfo, msgOffsetInfo, body)");
        return NULL;
    }
    PyObject *remark = args[3], *body = args[10];
    if (!PyBytes_CheckExact(body) || (remark != Py_None && !PyUnicode_CheckExact(remark))) Py_RETURN_NONE;
    for (int i = 0; i < 8; i++)
        if (i != 3 && !PyLong_CheckExact(args[i])) Py_RETURN_NONE;
    Py_ssize_t blen = PyBytes_GET_SIZE(body);
    rbuf b;
    b.p = b.small; b.len = 8; b.cap = sizeof b.small;
#define PPUT(lit) rbuf_put(&b, lit, sizeof(lit) - 1)
    int ok = PPUT("{\"code\":") && rbuf_int(&b, args[0]) && PPUT(",\"language\":\"JAVA\",\"version\":") &&
             rbuf_int(&b, args[2]) && PPUT(",\"opaque\":") && rbuf_int(&b, args[1]) && PPUT(",\"flag\":1");
    if (ok && remark != Py_None) ok = PPUT(",\"remark\":") && rbuf_jstr(&b, remark);
    ok = ok && PPUT(",\"extFields\":{\"popTime\":") && pf_qint(&b, args[4]) && PPUT(",\"invisibleTime\":") &&
         pf_qint(&b, args[5]) && PPUT(",\"reviveQid\":") && pf_qint(&b, args[6]) && PPUT(",\"restNum\":") &&
         pf_qint(&b, args[7]) && PPUT(",\"startOffsetInfo\":") && rbuf_jstr(&b, args[8]) &&
         PPUT(",\"msgOffsetInfo\":") && rbuf_jstr(&b, args[9]) && PPUT("},\"serializeTypeCurrentRPC\":\"JSON\"}");
#undef PPUT
    PyObject *res = ok ? rbuf_frame(&b, blen ? PyBytes_AS_STRING(body) : NULL, blen) : rbuf_declined();
    rbuf_free(&b);
    return res;
}
/* ============================ end of THE POP LANE ==================================================== */

/* ============================================================================================== */
/* THE ACK LANE (branch ack-lane): ACK_MESSAGE and BATCH_ACK_MESSAGE read straight from their bytes */
/*   ack_body   a BATCH_ACK_MESSAGE body {"acks":[BatchAck, ...]} of the plain shape -> entry tuples */
/*   ack_frame  a read that is exactly one ACK_MESSAGE / BATCH_ACK_MESSAGE request frame -> its     */
/*              fields and the SUCCESS response frame                                               */
/* Both return None for anything else, having made nothing: AckMessageProcessor.lane (processor/    */
/* pop.py) does the checks and the buffer's ack on what they give, and what they do not take goes  */
/* through the RemotingCommand and AckMessageProcessor.process, the reference.                      */
/* ============================================================================================== */

/* a plain ASCII string (no escape, no control or non-ASCII byte) at c->p, its quote: its bytes */
static int al_plain(jcur *c, const unsigned char **s, Py_ssize_t *n) {
    if (c->p >= c->end || *c->p != '"') return J_GIVE_WAY;
    const unsigned char *b = c->p + 1, *q = b;
    while (q < c->end && !j_scan[*q]) q++;
    if (q >= c->end || *q != '"') return J_GIVE_WAY;
    *s = b;
    *n = q - b;
    c->p = q + 1;
    return J_OK;
}

/* the canonical decimal text of an integer (what str(int) writes, at most 18 digits) */
static int al_dec(const unsigned char *s, Py_ssize_t n, long long *out) {
    int neg = n > 0 && s[0] == '-';
    const unsigned char *p = s + neg, *e = s + n;
    if (p >= e || e - p > 18 || (*p == '0' && e - p > 1) || (neg && *p == '0')) return 0;
    long long v = 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9') return 0;
        v = v * 10 + (*p - '0');
    }
    *out = neg ? -v : v;
    return 1;
}

enum { AL_C, AL_T, AL_R, AL_SO, AL_Q, AL_RQ, AL_PT, AL_IT, AL_B, AL_FIELDS };

/* one BatchAck object at c->p -> a new tuple (c, t, retry, so, q, rq, pt, it, first bit, bit count): what
 * BatchAck.from_dict reads when c and t are plain strings, r a string or absent, so/q/rq/pt/it integers (it
 * may be absent) and b a non-empty list of consecutive ascending integers (bitset_indexes' own order) */
static int al_entry(jcur *c, PyObject **out) {
    const unsigned char *cs = NULL, *ts = NULL;
    Py_ssize_t cn = 0, tn = 0;
    int retry = 0, have[AL_FIELDS] = {0}, rc;
    long long v[AL_FIELDS] = {0}, first = 0, count = 0;
    if (c->p >= c->end || *c->p != '{') return J_GIVE_WAY;
    c->p++;
    j_ws(c);
    if (c->p < c->end && *c->p == '}') return J_GIVE_WAY;  /* no "c": the reference's KeyError */
    for (;;) {
        const unsigned char *k;
        Py_ssize_t kn;
        if ((rc = al_member(c, &k, &kn)) != J_OK) return rc;
        int f = -1;
        if (kn == 1) {
            switch (k[0]) {
            case 'c': f = AL_C; break;
            case 't': f = AL_T; break;
            case 'r': f = AL_R; break;
            case 'q': f = AL_Q; break;
            case 'b': f = AL_B; break;
            default: break;
            }
        } else if (kn == 2) {
            if (k[0] == 's' && k[1] == 'o') f = AL_SO;
            else if (k[0] == 'r' && k[1] == 'q') f = AL_RQ;
            else if (k[0] == 'p' && k[1] == 't') f = AL_PT;
            else if (k[0] == 'i' && k[1] == 't') f = AL_IT;
        }
        if (f == AL_C || f == AL_T) {
            if ((rc = al_plain(c, f == AL_C ? &cs : &ts, f == AL_C ? &cn : &tn)) != J_OK) return rc;
        } else if (f == AL_R) {
            const unsigned char *rs;
            Py_ssize_t rn;
            if ((rc = al_plain(c, &rs, &rn)) != J_OK) return rc;
            retry = rn == 1 && rs[0] == '1';
        } else if (f == AL_B) {  /* a list of consecutive ascending integers */
            if (*c->p != '[') return J_GIVE_WAY;
            c->p++;
            first = count = 0;
            if (al_bits_plain(c, &first, &count)) goto b_done;
            j_ws(c);
            if (c->p < c->end && *c->p == ']') c->p++;  /* empty: refused below */
            else for (;;) {
                long long x;
                j_ws(c);
                if ((rc = j_int(c, &x)) != J_OK) return rc;
                if (count == 0) first = x;
                else if (x != first + count) return J_GIVE_WAY;  /* a gap, a repeat, out of order */
                count++;
                j_ws(c);
                if (c->p < c->end && *c->p == ',') { c->p++; continue; }
                if (c->p < c->end && *c->p == ']') { c->p++; break; }
                return J_GIVE_WAY;
            }
          b_done:;
        } else if (f >= 0) {
            if ((rc = j_int(c, &v[f])) != J_OK) return rc;
        } else {  /* a member from_dict does not read: a scalar, checked and skipped */
            if ((rc = j_skip_value(c)) != J_OK) return rc;
        }
        if (f >= 0) have[f] = 1;
        int more = j_next(c);
        if (more > 0) continue;
        if (more == 0) break;
        return J_GIVE_WAY;
    }
    if (!have[AL_C] || !have[AL_T] || !have[AL_SO] || !have[AL_Q] || !have[AL_RQ] || !have[AL_PT] || !have[AL_B] ||
        count == 0)
        return J_GIVE_WAY;
    PyObject *g = PyUnicode_DecodeASCII((const char *)cs, cn, NULL);
    PyObject *t = g != NULL ? PyUnicode_DecodeASCII((const char *)ts, tn, NULL) : NULL;
    if (t == NULL) { Py_XDECREF(g); return J_ERROR; }
    /* the tuple filled in place (Py_BuildValue's format parse was a sixth of the body's read) */
    PyObject *tu = PyTuple_New(10);
    if (tu == NULL) { Py_DECREF(g); Py_DECREF(t); return J_ERROR; }
    PyTuple_SET_ITEM(tu, 0, g);
    PyTuple_SET_ITEM(tu, 1, t);
    PyTuple_SET_ITEM(tu, 2, Py_NewRef(retry ? Py_True : Py_False));
    long long nums[7] = {v[AL_SO], v[AL_Q], v[AL_RQ], v[AL_PT], v[AL_IT], first, count};
    for (int i = 0; i < 7; i++) {
        PyObject *x = PyLong_FromLongLong(nums[i]);
        if (x == NULL) { Py_DECREF(tu); return J_ERROR; }  /* the slots not set yet are NULL: tupledealloc skips them */
        PyTuple_SET_ITEM(tu, 3 + i, x);
    }
    *out = tu;
    return J_OK;
}

/* the body {"acks": [entry, ...]} -> a new non-empty list of al_entry tuples */
static int al_body(const unsigned char *p, Py_ssize_t n, PyObject **out) {
    jcur c = {p, p + n};
    PyObject *acks = NULL;
    int rc = J_GIVE_WAY;
    j_ws(&c);
    if (c.p >= c.end || *c.p != '{') return J_GIVE_WAY;
    c.p++;
    j_ws(&c);
    if (c.p < c.end && *c.p == '}') return J_GIVE_WAY;  /* no acks: NO_MESSAGE, the reference's */
    for (;;) {
        const unsigned char *k;
        Py_ssize_t kn;
        if ((rc = j_member(&c, &k, &kn)) != J_OK) goto fail;
        if (key_is(k, kn, "acks", 4)) {
            if (*c.p != '[') { rc = J_GIVE_WAY; goto fail; }
            c.p++;
            Py_XSETREF(acks, PyList_New(0));  /* json keeps the last of a repeated key */
            if (acks == NULL) { rc = J_ERROR; goto fail; }
            j_ws(&c);
            if (c.p < c.end && *c.p == ']') c.p++;
            else for (;;) {
                PyObject *e = NULL;
                j_ws(&c);
                if ((rc = al_entry(&c, &e)) != J_OK) goto fail;
                int bad = PyList_Append(acks, e);
                Py_DECREF(e);
                if (bad < 0) { rc = J_ERROR; goto fail; }
                j_ws(&c);
                if (c.p < c.end && *c.p == ',') { c.p++; continue; }
                if (c.p < c.end && *c.p == ']') { c.p++; break; }
                rc = J_GIVE_WAY;
                goto fail;
            }
        } else if ((rc = j_skip_value(&c)) != J_OK) goto fail;
        int more = j_next(&c);
        if (more > 0) continue;
        if (more == 0) break;
        rc = J_GIVE_WAY;
        goto fail;
    }
    j_ws(&c);
    if (c.p != c.end || acks == NULL || PyList_GET_SIZE(acks) == 0) { rc = J_GIVE_WAY; goto fail; }
    *out = acks;
    return J_OK;
fail:
    Py_XDECREF(acks);
    return rc;
}

/* ack_body(body) -> [(c, t, retry, so, q, rq, pt, it, first bit, bit count), ...] or None */
static PyObject *ack_body(PyObject *self, PyObject *body) {
    if (!PyBytes_CheckExact(body)) Py_RETURN_NONE;
    PyObject *out = NULL;
    int rc = al_body((const unsigned char *)PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body), &out);
    if (rc == J_OK) return out;
    if (rc == J_ERROR) return NULL;
    Py_RETURN_NONE;
}

/* the frame of RemotingCommand(SUCCESS, {}, b"", opaque, FLAG_RESPONSE, None, "JAVA", version).encode() */
static PyObject *al_success(long long opaque, long long version) {
    static const char p1[] = "{\"code\":0,\"language\":\"JAVA\",\"version\":", p2[] = ",\"opaque\":",
                      p3[] = ",\"flag\":1,\"serializeTypeCurrentRPC\":\"JSON\"}";
    char buf[8 + sizeof p1 + sizeof p2 + sizeof p3 + 48], t[24], *w = buf + 8, *d;
    memcpy(w, p1, sizeof p1 - 1); w += sizeof p1 - 1;
    d = sl_digits(t + sizeof t, version); memcpy(w, d, t + sizeof t - d); w += t + sizeof t - d;
    memcpy(w, p2, sizeof p2 - 1); w += sizeof p2 - 1;
    d = sl_digits(t + sizeof t, opaque); memcpy(w, d, t + sizeof t - d); w += t + sizeof t - d;
    memcpy(w, p3, sizeof p3 - 1); w += sizeof p3 - 1;
    Py_ssize_t len = w - buf;
    put_i32((unsigned char *)buf, (int32_t)(len - 4));
    put_i32((unsigned char *)buf + 4, (int32_t)(len - 8));
    return PyBytes_FromStringAndSize(buf, len);
}

enum { ALX_GROUP, ALX_TOPIC, ALX_QID, ALX_OFFSET, ALX_EXTRA, ALX_FIELDS };

/* ack_frame(data, max_frame, max_header, buffered): for a read that is exactly one JSON frame of an ACK_MESSAGE
 * or BATCH_ACK_MESSAGE request (not a response, not one-way) while the connection's decoder holds nothing
 * (`buffered`, its bytearray, is empty), of the plain shape (send_frame's subset of what the frame decoder takes):
 *   BATCH_ACK_MESSAGE: (success frame, [al_entry tuples]) when the body is ack_body's;
 *   ACK_MESSAGE: (success frame, None, group, topic, queueId, offset, ck offset, pop time, invisible time,
 *   revive qid, retry, broker name, queue id, queue offset), the header fields and ExtraInfo.split's eight
 *   fields, when they are plain ASCII strings and the integers canonical decimal text;
 * None for anything else. */
static PyObject *ack_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyByteArray_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "ack_frame(data, max_frame, max_header, buffered)");
        return NULL;
    }
    PyObject *data = args[0];
    if (!PyBytes_CheckExact(data) || PyByteArray_GET_SIZE(args[3]) != 0) Py_RETURN_NONE;
    const unsigned char *base = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    /* the code is the header's first member in every peer's frames: others are not read further */
    if (n < 24 || memcmp(base + 8, "{\"code\":200", 11) != 0) Py_RETURN_NONE;
    Py_ssize_t max_frame = PyLong_AsSsize_t(args[1]), max_header = PyLong_AsSsize_t(args[2]);
    if ((max_frame == -1 || max_header == -1) && PyErr_Occurred()) return NULL;
    int32_t length = get_i32(base), word = get_i32(base + 4);
    Py_ssize_t hlen = word & 0xFFFFFF;
    if (length < 4 || length > max_frame || hlen > max_header || hlen > length - 4 || hlen <= 0 ||
        ((word >> 24) & 0xFF) != 0 || n != 4 + (Py_ssize_t)length)
        Py_RETURN_NONE;  /* not exactly one JSON frame: the decoder's */
    const unsigned char *h = base + 8;
    jcur c = {h, h + hlen};
    long long code = 0, flag = 0, opaque = 0, version = 0;
    int have_code = 0, rc;
    const unsigned char *xs[ALX_FIELDS] = {0};
    Py_ssize_t xn[ALX_FIELDS] = {0};
    int xplain[ALX_FIELDS] = {0};
    c.p++;  /* '{' (checked above) */
    for (;;) {
        const unsigned char *k;
        Py_ssize_t kn;
        if ((rc = al_member(&c, &k, &kn)) != J_OK) goto fail_rc;
        long long *iv = j_header_int(k, kn, &code, &opaque, &flag, &version);
        if (iv != NULL) {
            have_code |= iv == &code;
            if ((rc = j_int32(&c, iv)) != J_OK) goto fail_rc;
            if (iv == &code && code != 200051 && code != 200151) goto decline;
        } else if (key_is(k, kn, "language", 8) || key_is(k, kn, "remark", 6)) {
            if (*c.p != '"') goto decline;
            if ((rc = j_string(&c, NULL, 0)) != J_OK) goto fail_rc;
        } else if (key_is(k, kn, "extFields", 9)) {
            if (*c.p != '{') goto decline;
            memset(xs, 0, sizeof xs); memset(xn, 0, sizeof xn); memset(xplain, 0, sizeof xplain);  /* json keeps the last */
            c.p++;
            j_ws(&c);
            if (c.p < c.end && *c.p == '}') c.p++;
            else for (;;) {
                const unsigned char *ek;
                Py_ssize_t ekn;
                j_ws(&c);
                if ((rc = al_plain(&c, &ek, &ekn)) != J_OK) goto fail_rc;  /* a plain ASCII key, else the decoder's */
                j_ws(&c);
                if (c.p >= c.end || *c.p != ':') goto decline;
                c.p++;
                j_ws(&c);
                if (c.p >= c.end || *c.p != '"') goto decline;  /* a value not a string: the decoder's */
                int slot = key_is(ek, ekn, "consumerGroup", 13) ? ALX_GROUP : key_is(ek, ekn, "topic", 5) ? ALX_TOPIC
                         : key_is(ek, ekn, "queueId", 7) ? ALX_QID : key_is(ek, ekn, "offset", 6) ? ALX_OFFSET
                         : key_is(ek, ekn, "extraInfo", 9) ? ALX_EXTRA : -1;
                const unsigned char *vs = c.p + 1;
                if ((rc = j_string(&c, NULL, 0)) != J_OK) goto fail_rc;
                if (slot >= 0) {
                    Py_ssize_t vn = c.p - 1 - vs;
                    const unsigned char *z = vs;
                    while (z < vs + vn && !j_scan[*z]) z++;
                    xs[slot] = vs; xn[slot] = vn; xplain[slot] = z == vs + vn;
                }
                int more = j_next(&c);
                if (more > 0) continue;
                if (more == 0) break;
                goto decline;
            }
        } else if ((rc = j_skip_value(&c)) != J_OK) goto fail_rc;  /* another field: checked, not kept */
        int more = j_next(&c);
        if (more > 0) continue;
        if (more == 0) break;
        goto decline;
    }
    j_ws(&c);
    if (c.p != c.end || !have_code || (flag & 3) != 0) goto decline;  /* requests answered */
    if (code == 200151) {
        PyObject *acks = NULL;
        rc = al_body(h + hlen, n - 8 - hlen, &acks);
        if (rc != J_OK) goto fail_rc;
        PyObject *frame = al_success(opaque, version);
        if (frame == NULL) { Py_DECREF(acks); return NULL; }
        return Py_BuildValue("(NN)", frame, acks);
    }
    /* ACK_MESSAGE: every field present, plain, its integers canonical; extraInfo exactly eight fields */
    long long qid, offset, e[8];
    for (int i = 0; i < ALX_FIELDS; i++)
        if (xs[i] == NULL || !xplain[i]) goto decline;
    if (!al_dec(xs[ALX_QID], xn[ALX_QID], &qid) || !al_dec(xs[ALX_OFFSET], xn[ALX_OFFSET], &offset)) goto decline;
    const unsigned char *parts[8], *p = xs[ALX_EXTRA], *pe = p + xn[ALX_EXTRA];
    Py_ssize_t plen[8];
    for (int i = 0; i < 8; i++) {
        const unsigned char *sp = memchr(p, ' ', pe - p);
        if (i < 7 && sp == NULL) goto decline;
        if (i == 7 && sp != NULL) goto decline;  /* more than eight fields: the reference's */
        parts[i] = p;
        plen[i] = (sp != NULL ? sp : pe) - p;
        p = sp != NULL ? sp + 1 : pe;
    }
    for (int i = 0; i < 8; i++)
        if (i != 4 && i != 5 && !al_dec(parts[i], plen[i], &e[i])) goto decline;
    int retry = !(plen[4] == 0 || (plen[4] == 1 && parts[4][0] == '0'));
    PyObject *frame = al_success(opaque, version);
    if (frame == NULL) return NULL;
    /* Py_BuildValue("(NOs#s#LLLLLLOs#LL)", ...)'s tuple, built in place (its format parsing was a third of this) */
    PyObject *res = PyTuple_New(14);
    if (res == NULL) { Py_DECREF(frame); return NULL; }
    PyTuple_SET_ITEM(res, 0, frame);
    PyTuple_SET_ITEM(res, 1, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(res, 2, PyUnicode_FromStringAndSize((const char *)xs[ALX_GROUP], xn[ALX_GROUP]));
    PyTuple_SET_ITEM(res, 3, PyUnicode_FromStringAndSize((const char *)xs[ALX_TOPIC], xn[ALX_TOPIC]));
    PyTuple_SET_ITEM(res, 4, PyLong_FromLongLong(qid));
    PyTuple_SET_ITEM(res, 5, PyLong_FromLongLong(offset));
    for (int i = 0; i < 4; i++)
        PyTuple_SET_ITEM(res, 6 + i, PyLong_FromLongLong(e[i]));
    PyTuple_SET_ITEM(res, 10, Py_NewRef(retry ? Py_True : Py_False));
    PyTuple_SET_ITEM(res, 11, PyUnicode_FromStringAndSize((const char *)parts[5], plen[5]));
    PyTuple_SET_ITEM(res, 12, PyLong_FromLongLong(e[6]));
    PyTuple_SET_ITEM(res, 13, PyLong_FromLongLong(e[7]));
    for (int i = 2; i < 14; i++)
        if (PyTuple_GET_ITEM(res, i) == NULL) { Py_DECREF(res); return NULL; }
    return res;
fail_rc:
    if (rc == J_ERROR) return NULL;
decline:
    Py_RETURN_NONE;
}
/* ============================ end of THE ACK LANE ==================================================== */

/* ============================================================================================== */
/* THE POP CLIENT (branch pop-client): a lone caller's PopConsumer.pop + ack_batch without a        */
/* RemotingCommand on the client's side (client/pop_consumer.py's fast path).                       */
/*   pop_request_frame  the POP_MESSAGE request frame pop() sends (RemotingCommand(...).encode())   */
/*   pop_take           a lone caller's read holding exactly its SUCCESS POP response: the decoded  */
/*                      messages with their POP_CK handles appended, as pop() makes them            */
/*   pop_ack_frame      the BATCH_ACK_MESSAGE frame ack_batch() sends for popped messages of one    */
/*                      topic (_ack_requests' body, RemotingCommand(...).encode())                  */
/* Each declines (None, nothing done) for anything but the plain shapes; Python then decides, and   */
/* stays the definition of the bytes (tests/test_pop_client_native.py compares them).              */
/* ============================================================================================== */

/* the frame of a request without a body whose JSON header is b->p[8:b->len]: the two length words set */
static PyObject *pc_frame(rbuf *b) { return rbuf_frame(b, NULL, 0); }

/* pop_request_frame(group, topic, queue_id, max_nums, invisible_time, poll_time, tags, opaque) -> bytes or None:
 * RemotingCommand(200050, {"consumerGroup": group, "topic": topic, "queueId": str(queue_id), "maxMsgNums":
 * str(max_nums), "invisibleTime": str(invisible_time), "pollTime": str(poll_time), "bornTime": "0", "initMode":
 * "1", "expType": "TAG", "exp": tags, "order": "false"}, b"", opaque).encode(). None for another type (the ints
 * exact ints within 64 bits, the texts exact str that encode) */
static PyObject *prf_key[7], *prf_tail;  /* the arguments of the last frame made, and its text after the opaque */
static PyObject *pop_request_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "pop_request_frame takes 8 arguments");
        return NULL;
    }
    if (!PyLong_CheckExact(args[7])) Py_RETURN_NONE;
    rbuf b;
    b.p = b.small; b.len = 8; b.cap = sizeof b.small;
#define PPUT(lit) rbuf_put(&b, lit, sizeof(lit) - 1)
    int ok = PPUT("{\"code\":200050,\"language\":\"PYTHON\",\"version\":435,\"opaque\":") && rbuf_int(&b, args[7]);
    Py_ssize_t mark = b.len;  /* what follows the opaque depends on the other arguments only */
    int same = prf_tail != NULL;
    for (int i = 0; same && i < 7; i++) same = args[i] == prf_key[i];
    if (ok && same) {  /* the same objects as the last frame's (exact str and int: immutable): its text again */
        ok = rbuf_put(&b, PyBytes_AS_STRING(prf_tail), PyBytes_GET_SIZE(prf_tail));
        PyObject *res = ok ? pc_frame(&b) : NULL;
        rbuf_free(&b);
        return res;
    }
    ok = ok && PPUT(",\"flag\":0,\"extFields\":{\"consumerGroup\":") && rbuf_jstr(&b, args[0])
             && PPUT(",\"topic\":") && rbuf_jstr(&b, args[1]) && PPUT(",\"queueId\":") && cs_put_qint(&b, args[2])
             && PPUT(",\"maxMsgNums\":") && cs_put_qint(&b, args[3]) && PPUT(",\"invisibleTime\":")
             && cs_put_qint(&b, args[4]) && PPUT(",\"pollTime\":") && cs_put_qint(&b, args[5])
             && PPUT(",\"bornTime\":\"0\",\"initMode\":\"1\",\"expType\":\"TAG\",\"exp\":") && rbuf_jstr(&b, args[6])
             && PPUT(",\"order\":\"false\"},\"serializeTypeCurrentRPC\":\"JSON\"}");
#undef PPUT
    PyObject *res;
    if (ok) {
        int exact = PyUnicode_CheckExact(args[0]) && PyUnicode_CheckExact(args[1]) && PyUnicode_CheckExact(args[6]);
        for (int i = 2; exact && i < 6; i++) exact = PyLong_CheckExact(args[i]);
        if (exact) {  /* kept for the next call with the same objects */
            PyObject *tail = PyBytes_FromStringAndSize((const char *)b.p + mark, b.len - mark);
            if (tail == NULL) { rbuf_free(&b); return NULL; }
            Py_XSETREF(prf_tail, tail);
            for (int i = 0; i < 7; i++) Py_XSETREF(prf_key[i], Py_NewRef(args[i]));
        }
        res = pc_frame(&b);
    }
    else if (PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_MemoryError)) res = NULL;
    else { PyErr_Clear(); res = Py_NewRef(Py_None); }
    rbuf_free(&b);
    return res;
}

/* a canonical non-negative decimal (what str(int(t)) gives back unchanged: "0" or no leading zero), 1 to 18
 * ASCII digits, from p[0:n]; -1 for anything else */
static long long pc_canon(const char *p, Py_ssize_t n) {
    if (n <= 0 || n > 18 || (n > 1 && p[0] == '0')) return -1;
    long long v = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return -1;
        v = v * 10 + (p[i] - '0');
    }
    return v;
}

/* int(text) of p[0:e - p] when it is 1 to 18 plain ASCII digits (leading zeros allowed, as int() reads them);
 * -1 for anything else (int() may still take it, or refuse it: Python decides) */
static long long pc_digits_span(const char *p, const char *e) {
    if (e - p <= 0 || e - p > 18) return -1;
    long long r = 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9') return -1;
        r = r * 10 + (*p - '0');
    }
    return r;
}

static char *pc_put_ll(char *d, long long v) {
    char tmp[24], *e = tmp + sizeof tmp, *s = e;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do { *--s = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) *--s = '-';
    memcpy(d, s, e - s);
    return d + (e - s);
}

/* ph_handle_string (s + [SEP] + lead + str(off) + SEP) with the common case in place: s and lead ASCII */
static PyObject *pc_handle_string(PyObject *s, PyObject *lead, long long off) {
    if (!PyUnicode_IS_ASCII(s) || !PyUnicode_IS_ASCII(lead)) return ph_handle_string(s, lead, off);
    char digits[24], *de = pc_put_ll(digits, off);
    Py_ssize_t ns = PyUnicode_GET_LENGTH(s), nl = PyUnicode_GET_LENGTH(lead), nd = de - digits;
    const char *sp = (const char *)PyUnicode_DATA(s);
    int glue = ns > 0 && sp[ns - 1] != 2;
    PyObject *r = PyUnicode_New(ns + glue + nl + nd + 1, 127);
    if (r == NULL) return NULL;
    char *d = (char *)PyUnicode_DATA(r);
    memcpy(d, sp, ns); d += ns;
    if (glue) *d++ = 2;
    memcpy(d, PyUnicode_DATA(lead), nl); d += nl;
    memcpy(d, digits, nd); d += nd;
    *d = 2;
    return r;
}

/* the first byte at or after q that j_scan stops at ('"', '\\', a control character, non-ASCII), or end:
 * sixteen bytes a step while that many are left */
static inline const unsigned char *pc_plain_end(const unsigned char *q, const unsigned char *end) {
#ifdef __SSE2__
    const __m128i quote = _mm_set1_epi8('"'), bs = _mm_set1_epi8('\\'), sp = _mm_set1_epi8(0x20);
    while (end - q >= 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)q);
        /* signed: bytes >= 0x80 are negative, so "< 0x20" takes them with the control characters */
        __m128i m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bs)), _mm_cmplt_epi8(v, sp));
        int mask = _mm_movemask_epi8(m);
        if (mask) return q + __builtin_ctz((unsigned)mask);
        q += 16;
    }
#endif
    while (q < end && !j_scan[*q]) q++;
    return q;
}

/* cs_skip (j_string(c, NULL, 0) with the plain case inline), scanning with pc_plain_end */
static inline int pc_skip(jcur *c) {
    const unsigned char *q = pc_plain_end(c->p + 1, c->end);
    if (q < c->end && *q == '"') { c->p = q + 1; return J_OK; }
    return j_string(c, NULL, 0);
}

/* j_member with the compact case inline: at c->p a key of plain printable ASCII (no escape: j_scan passes every
 * byte), its closing quote, ':' at once and a value that does not start with white space: the same key and
 * position j_member gives; anything else is j_member's */
static inline int pc_member(jcur *c, const unsigned char **k, Py_ssize_t *kn) {
    const unsigned char *p = c->p, *q = p + 1;
    if (p < c->end && *p == '"') {
        q = pc_plain_end(q, c->end);
        if (q + 2 < c->end && q[0] == '"' && q[1] == ':' && q[2] != ' ' && q[2] != '\t' && q[2] != '\n'
            && q[2] != '\r') {
            *k = p + 1;
            *kn = q - p - 1;
            c->p = q + 2;
            return J_OK;
        }
    }
    return j_member(c, k, kn);
}

/* j_next with the compact case inline */
static inline int pc_next(jcur *c) {
    if (c->p < c->end) {
        if (*c->p == ',') { c->p++; return 1; }
        if (*c->p == '}') { c->p++; return 0; }
    }
    return j_next(c);
}

/* A response header read in place, as client_send_take reads it (j_header's grammar; no command, no dict):
 * 1 when it is a response (flag bit 0) to `want` with code 0 whose extFields' values are plain strings; then
 * vs[i]..ve[i] is the text of the last extFields' member names[i] (vs[i] NULL when it has none), which holds
 * no escape. 0 for anything else (another code or shape, an escape in a wanted value): the caller declines. */
static int pc_scan(const unsigned char *h, Py_ssize_t hlen, long long want, const char *const *names, int nn,
                   const unsigned char **vs, const unsigned char **ve) {
    jcur c = {h, h + hlen};
    long long code = 0, opaque = 0, flag = 0, ignored;
    int have_code = 0;
    Py_ssize_t nl[8];
    if (nn > 8) return 0;
    for (int i = 0; i < nn; i++) { vs[i] = ve[i] = NULL; nl[i] = (Py_ssize_t)strlen(names[i]); }
    if (hlen < 2 || *c.p != '{') return 0;
    c.p++;
    j_ws(&c);
    if (c.p < c.end && *c.p == '}') return 0;
    for (;;) {
        const unsigned char *k;
        Py_ssize_t kn;
        if (pc_member(&c, &k, &kn) != J_OK) return 0;
        long long *iv = j_header_int(k, kn, &code, &opaque, &flag, &ignored);
        if (iv != NULL) {
            have_code |= iv == &code;
            if (j_int32(&c, iv) != J_OK) return 0;
        } else if (key_is(k, kn, "language", 8) || key_is(k, kn, "remark", 6)) {
            if (*c.p != '"' || pc_skip(&c) != J_OK) return 0;
        } else if (key_is(k, kn, "extFields", 9)) {
            if (*c.p != '{') return 0;
            c.p++;
            for (int i = 0; i < nn; i++) vs[i] = ve[i] = NULL;  /* a later extFields replaces an earlier one */
            j_ws(&c);
            if (c.p < c.end && *c.p == '}') c.p++;
            else for (;;) {
                const unsigned char *ek;
                Py_ssize_t ekn;
                if (pc_member(&c, &ek, &ekn) != J_OK || *c.p != '"') return 0;
                const unsigned char *v = c.p;
                if (pc_skip(&c) != J_OK) return 0;
                for (int i = 0; i < nn; i++)
                    if (ekn == nl[i] && memcmp(ek, names[i], ekn) == 0) {
                        if (memchr(v + 1, '\\', c.p - 2 - v) != NULL) return 0;
                        vs[i] = v + 1; ve[i] = c.p - 1;  /* the last of a key counts, as in the dict */
                    }
                int more = pc_next(&c);
                if (more > 0) continue;
                if (more == 0) break;
                return 0;
            }
        } else if (*c.p == '"' ? pc_skip(&c) != J_OK : j_skip_value(&c) != J_OK) {  /* checked, not kept (j_header) */
            return 0;
        }
        int more = pc_next(&c);
        if (more > 0) continue;
        if (more == 0) break;
        return 0;
    }
    j_ws(&c);
    return c.p == c.end && have_code && code == 0 && opaque == want && (flag & 1);
}

/* the frame checks of client_take_response: buf[:n] is one whole frame with a JSON header; its header length */
static Py_ssize_t pc_frame_header(PyObject *bufo, PyObject *no, Py_ssize_t *n) {
    if (!PyByteArray_CheckExact(bufo) || !PyLong_CheckExact(no)) return -1;
    *n = PyLong_AsSsize_t(no);
    if (*n == -1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
    if (*n < 8 || *n > PyByteArray_GET_SIZE(bufo)) return -1;
    const unsigned char *base = (const unsigned char *)PyByteArray_AS_STRING(bufo);
    int32_t length = get_i32(base), word = get_i32(base + 4);
    Py_ssize_t hlen = word & 0xFFFFFF;
    if ((Py_ssize_t)length + 4 != *n || ((word >> 24) & 0xFF) != 0 || hlen <= 0 || hlen > length - 4
        || hlen > 1024 * 1024)
        return -1;
    return hlen;
}

/* pop_ack_take(buf, n, opaque) -> True or None: True when buf[:n] (a lone caller's read, nothing buffered
 * before it) is exactly one JSON frame that client_take_response takes, the SUCCESS response to `opaque`
 * (what ack_batch checks of it); None, nothing consumed, for anything else (the connection decodes it). */
static PyObject *pop_ack_take(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    Py_ssize_t n;
    if (nargs != 3 || !PyLong_CheckExact(args[2])) Py_RETURN_NONE;
    Py_ssize_t hlen = pc_frame_header(args[0], args[1], &n);
    long long want = PyLong_AsLongLong(args[2]);
    if (want == -1 && PyErr_Occurred()) { PyErr_Clear(); Py_RETURN_NONE; }
    if (hlen < 0) Py_RETURN_NONE;
    const unsigned char *base = (const unsigned char *)PyByteArray_AS_STRING(args[0]);
    if (!pc_scan(base + 8, hlen, want, NULL, 0, NULL, NULL)) return rbuf_declined();
    Py_RETURN_TRUE;
}

#define PC_MAX_STARTS 64
#define PC_MAX_LEAD (7 + 4 * 24 + 4 + 256 + 24 + 2)
/* pop_take's state while the records are decoded (pc_props, decode_records_core's hook) */
typedef struct {
    PyObject *topic;    /* the topic popped for */
    PyObject *checked;  /* (strong) the last record topic object found equal to it */
    long long pt, it, rq, lead_q;
    const char *bn;
    Py_ssize_t bn_len, lead_len;
    int ns, bn_ascii;
    long long sq[PC_MAX_STARTS], ss[PC_MAX_STARTS];
    char lead[PC_MAX_LEAD];  /* "POP_CK\x01<start> <popTime> <invisibleTime> <reviveQid> 0 <broker> <queueId> " */
    PyObject *lead_obj;      /* its str, made when a record's properties are not ASCII */
} pc_take;

/* whether p[0:n] is ASCII (so its UTF-8 decode is these bytes as an ASCII str) */
static inline int pc_is_ascii(const unsigned char *p, Py_ssize_t n) {
    uint64_t acc = 0;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        acc |= w;
    }
    for (; i < n; i++) acc |= p[i];
    return (acc & 0x8080808080808080ULL) == 0;
}

/* decode_records_core's hook for pop_take: a record's properties string with its handle appended, what
 * pc_handle_string(decode(p[0:pl]), lead, qoff) gives (built in one go when both are ASCII); NULL without an
 * error (declined) for a record of another topic (the retry topic's: pop() sets its handle and topic) or of a
 * queue without a start offset (pop() makes the message its own checkpoint start) */
static PyObject *pc_props(void *vctx, PyObject *t, const unsigned char *p, Py_ssize_t pl, int32_t qid, int64_t qoff) {
    pc_take *x = vctx;
    if (t != x->checked) {
        if (t != x->topic) {
            int same = PyUnicode_Compare(t, x->topic);
            if (same != 0) return NULL;  /* another topic, or an error (set) */
        }
        Py_XSETREF(x->checked, Py_NewRef(t));
    }
    if (qid < 0) return NULL;
    if (x->lead_len == 0 || qid != x->lead_q) {
        int k;
        for (k = 0; k < x->ns && x->sq[k] != qid; k++) {}
        if (k == x->ns) return NULL;  /* no start offset: the message is its own checkpoint start (pop()) */
        char *d = x->lead;
        memcpy(d, "POP_CK\x01", 7); d += 7;
        d = pc_put_ll(d, x->ss[k]); *d++ = ' ';
        d = pc_put_ll(d, x->pt); *d++ = ' ';
        d = pc_put_ll(d, x->it); *d++ = ' ';
        d = pc_put_ll(d, x->rq); *d++ = ' '; *d++ = '0'; *d++ = ' ';
        memcpy(d, x->bn, x->bn_len); d += x->bn_len; *d++ = ' ';
        d = pc_put_ll(d, qid); *d++ = ' ';
        x->lead_len = d - x->lead;
        x->lead_q = qid;
        Py_CLEAR(x->lead_obj);
    }
    if (x->bn_ascii && pc_is_ascii(p, pl)) {
        char digits[24], *de = pc_put_ll(digits, qoff);
        Py_ssize_t nd = de - digits;
        int glue = pl > 0 && p[pl - 1] != 2;
        PyObject *r = PyUnicode_New(pl + glue + x->lead_len + nd + 1, 127);
        if (r == NULL) return NULL;
        char *d = (char *)PyUnicode_DATA(r);
        memcpy(d, p, pl); d += pl;
        if (glue) *d++ = 2;
        memcpy(d, x->lead, x->lead_len); d += x->lead_len;
        memcpy(d, digits, nd); d += nd;
        *d = 2;
        return r;
    }
    if (x->lead_obj == NULL && (x->lead_obj = PyUnicode_DecodeUTF8(x->lead, x->lead_len, NULL)) == NULL) return NULL;
    PyObject *s = pl ? PyUnicode_DecodeUTF8((const char *)p, pl, "replace") : PyUnicode_New(0, 0);
    if (s == NULL) return NULL;
    PyObject *r = pc_handle_string(s, x->lead_obj, qoff);
    Py_DECREF(s);
    return r;
}

/* pop_take(topic, broker_name, buf, n, opaque) -> list of MessageExt or None.
 * buf[:n] (a bytearray: a lone caller's read, nothing buffered before it) is exactly one JSON frame that
 * client_take_response takes, the SUCCESS response to `opaque` with a body: the messages PopConsumer.pop
 * returns for it, each with "POP_CK\x01<start> <popTime> <invisibleTime> <reviveQid> 0 <broker_name>
 * <queueId> <queueOffset>\x02" appended to its properties string (pop's _set_handle on an unparsed message),
 * decoded from the buffer in place with their handles (decode_records' loop, pc_props making each properties
 * string once). None, nothing consumed, for anything else: another code or shape, extFields int() may read
 * otherwise (signs, spaces, ...) or _parse_starts would refuse, a record codec.decode_records leaves to Python,
 * a message of another topic (the retry topic's) or of a queue without its start offset; Python decides. */
static PyObject *pc_take_core(PyObject *topic, PyObject *bname, const unsigned char *base, Py_ssize_t n,
                              Py_ssize_t hlen, long long want) {
    if (ph_init_names() < 0) return NULL;
    if (!ph_bind((PyObject *)ext_type)) Py_RETURN_NONE;
    static const char *const names[4] = {"popTime", "invisibleTime", "reviveQid", "startOffsetInfo"};
    const unsigned char *vs[4], *ve[4];
    if (!pc_scan(base + 8, hlen, want, names, 4, vs, ve)) return rbuf_declined();
    for (int i = 0; i < 4; i++)
        if (vs[i] == NULL) Py_RETURN_NONE;  /* int(x["popTime"]) raises; no startOffsetInfo: no handle here */
    pc_take x;
    x.pt = pc_digits_span((const char *)vs[0], (const char *)ve[0]);
    x.it = pc_digits_span((const char *)vs[1], (const char *)ve[1]);
    x.rq = pc_digits_span((const char *)vs[2], (const char *)ve[2]);
    if (x.pt < 0 || x.it < 0 || x.rq < 0) Py_RETURN_NONE;
    /* _parse_starts: "retry qid start" items between ';' (the last of a key counts); only retry "0" kept */
    x.ns = 0;
    {
        const char *p = (const char *)vs[3], *e = (const char *)ve[3];
        while (p < e) {
            const char *ie = memchr(p, ';', e - p);
            if (ie == NULL) ie = e;
            if (ie > p) {
                const char *f[3];
                int nf = 0;
                f[nf++] = p;
                for (const char *q = p; q < ie; q++)
                    if (*q == ' ') { if (nf == 3) Py_RETURN_NONE; f[nf++] = q + 1; }
                if (nf != 3) Py_RETURN_NONE;  /* item.split(" ") into three, or _parse_starts raises */
                long long qid = pc_digits_span(f[1], f[2] - 1), st = pc_digits_span(f[2], ie);
                if (qid < 0 || st < 0) Py_RETURN_NONE;
                if (f[1] - 1 - f[0] == 1 && f[0][0] == '0') {  /* retry != "0": a retry queue's, not used here */
                    int k;
                    for (k = 0; k < x.ns && x.sq[k] != qid; k++) {}
                    if (k == x.ns) { if (x.ns == PC_MAX_STARTS) Py_RETURN_NONE; x.sq[x.ns++] = qid; }
                    x.ss[k] = st;
                }
            }
            p = ie + 1;
        }
    }
    x.bn = PyUnicode_AsUTF8AndSize(bname, &x.bn_len);
    if (x.bn == NULL) return rbuf_declined();
    if (x.bn_len > 256) Py_RETURN_NONE;
    x.bn_ascii = PyUnicode_IS_ASCII(bname);
    x.topic = topic;
    x.checked = NULL;
    x.lead_obj = NULL;
    x.lead_len = 0;
    x.lead_q = -1;
    PyObject *out = PyList_New(0), *res = NULL;
    if (out == NULL) return NULL;
    Py_ssize_t blen = n - 8 - hlen;
    Py_ssize_t got = decode_records_core(base + 8 + hlen, blen, 0, out, 1, pc_props, &x);
    if (got == blen) res = Py_NewRef(out);
    else if (got == -1) res = NULL;
    else res = Py_NewRef(Py_None);  /* a record decode_records leaves to Python, or one pc_props declined */
    Py_XDECREF(x.checked);
    Py_XDECREF(x.lead_obj);
    Py_DECREF(out);
    return res;
}

static PyObject *pop_take(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "pop_take takes 5 arguments");
        return NULL;
    }
    PyObject *topic = args[0], *bname = args[1];
    if (rc_type == NULL || ext_type == NULL || !PyUnicode_CheckExact(topic) || !PyUnicode_CheckExact(bname)
        || !PyLong_CheckExact(args[4]))
        Py_RETURN_NONE;
    Py_ssize_t n;
    Py_ssize_t hlen = pc_frame_header(args[2], args[3], &n);
    long long want = PyLong_AsLongLong(args[4]);
    if (want == -1 && PyErr_Occurred()) { PyErr_Clear(); Py_RETURN_NONE; }
    if (hlen < 0 || n - 8 - hlen <= 0) Py_RETURN_NONE;  /* no body: _popped answers [] */
    return pc_take_core(topic, bname, (const unsigned char *)PyByteArray_AS_STRING(args[2]), n, hlen, want);
}

static PyObject *pc_s_popck;  /* "POP_CK" */

/* one BatchAck entry of pop_ack_frame: a distinct handle prefix (its first 7 fields) */
typedef struct { Py_ssize_t at, len; long long ck, qid, rq, pt, it; } pc_entry;
#define PC_MAX_ENTRIES 64
#define PC_MAX_HANDLE 512

/* the text json.JSONEncoder() (ensure_ascii) writes for a str that needs no escape: printable ASCII but '"'
 * and '\\'; 0 for anything else */
static int pc_plain_ascii(PyObject *o) {
    if (!PyUnicode_CheckExact(o) || !PyUnicode_IS_ASCII(o)) return 0;
    const unsigned char *p = PyUnicode_DATA(o);
    for (Py_ssize_t i = 0, n = PyUnicode_GET_LENGTH(o); i < n; i++)
        if (p[i] < 0x20 || p[i] > 0x7e || p[i] == '"' || p[i] == '\\') return 0;
    return 1;
}

/* pop_ack_frame(msgs, cls, topic, group, opaque) -> bytes or None: the BATCH_ACK_MESSAGE frame
 * PopConsumer.ack_batch(msgs) sends when every message is a `cls` (MessageExt) of `topic` whose POP_CK handle
 * (_get_handle's: the last one of its unparsed properties string, or its parsed properties' entry) has exactly
 * 8 fields, the ints canonical decimals (what ExtraInfo.split + build give back unchanged) and retry "0":
 * RemotingCommand(200151, {}, body,
 * opaque).encode(), body '{"acks":[' + the entries of _ack_requests (one per distinct handle prefix, in order
 * of first appearance: BatchAck.json_head + the offsets minus the start offset, comma-joined, + "]}") + "]}".
 * None for anything else (retry handles, other types, texts JSON would escape, ...): Python decides. */
static PyObject *pop_ack_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "pop_ack_frame takes 5 arguments");
        return NULL;
    }
    PyObject *msgs = args[0], *cls = args[1], *topic = args[2], *group = args[3], *opaque = args[4];
    if (!PyList_CheckExact(msgs) || PyList_GET_SIZE(msgs) == 0 || !PyLong_CheckExact(opaque)
        || !pc_plain_ascii(topic) || !pc_plain_ascii(group))
        Py_RETURN_NONE;
    if (ph_init_names() < 0) return NULL;
    if (!ph_bind(cls)) Py_RETURN_NONE;
    Py_ssize_t nm = PyList_GET_SIZE(msgs);
    pc_entry ents[PC_MAX_ENTRIES];
    int ne = 0;
    rbuf pre, bits, b;  /* the entries' prefixes; per message: entry index and bit, as text "e:bit" pairs */
    pre.p = pre.small; pre.len = 0; pre.cap = sizeof pre.small;
    b.p = b.small; b.len = 8; b.cap = sizeof b.small;
    bits.p = bits.small; bits.len = 0; bits.cap = sizeof bits.small;
    PyObject *res = NULL;
    int decline = 1, last = -1;  /* the entry of the message before */
    if (!rbuf_grow(&bits, nm * (Py_ssize_t)(sizeof(int) + sizeof(long long)))) goto out;
    for (Py_ssize_t i = 0; i < nm; i++) {
        PyObject *m = PyList_GET_ITEM(msgs, i);
        if ((PyObject *)Py_TYPE(m) != cls) goto out;
        PyObject *t = *(PyObject **)((char *)m + ph_slot_off[PH_TOPIC]), *s = *(PyObject **)((char *)m + ph_slot_off[PH_PROPS]),
                 *parsed = *(PyObject **)((char *)m + ph_slot_off[PH_PARSED]);
        if (t == NULL || s == NULL || parsed == NULL || !PyUnicode_CheckExact(t) || !PyUnicode_CheckExact(s)) goto out;
        if (t != topic) {
            int same = PyUnicode_Compare(t, topic);
            if (same == -1 && PyErr_Occurred()) goto out;
            if (same != 0) goto out;
        }
        /* _get_handle: after the last "POP_CK\x01" (at 0 or after a \x02), up to the next \x02 or the end */
        Py_ssize_t sl = PyUnicode_GET_LENGTH(s), j = -1;
        int kind = PyUnicode_KIND(s);
        const void *data = PyUnicode_DATA(s);
        char hbuf[PC_MAX_HANDLE];
        const char *h;
        Py_ssize_t hl = 0;
        if (parsed != Py_None) {  /* parsed properties (the caller read tags, keys...): _properties["POP_CK"] */
            if (!PyDict_CheckExact(parsed)) goto out;
            if (pc_s_popck == NULL && (pc_s_popck = PyUnicode_InternFromString("POP_CK")) == NULL) goto out;
            PyObject *hv = PyDict_GetItemWithError(parsed, pc_s_popck);  /* borrowed; str keys run no code */
            if (hv == NULL || !PyUnicode_CheckExact(hv) || !PyUnicode_IS_ASCII(hv)) goto out;
            hl = PyUnicode_GET_LENGTH(hv);
            if (hl > PC_MAX_HANDLE) goto out;
            h = (const char *)PyUnicode_DATA(hv);  /* (checked as it is split below; the dict holds it) */
        } else if (kind == PyUnicode_1BYTE_KIND) {  /* the common case, read in place (memrchr, memchr) */
            const unsigned char *d = data, *x = d + sl;
            while ((x = memrchr(d, 1, x - d)) != NULL && !(x - d >= 6 && memcmp(x - 6, "POP_CK", 6) == 0)) {}
            if (x == NULL) goto out;
            j = x - 6 - d;
            if (j > 0 && d[j - 1] != 2) goto out;
            const unsigned char *stop = memchr(x + 1, 2, d + sl - (x + 1));
            hl = (stop != NULL ? stop : d + sl) - (x + 1);
            if (hl > PC_MAX_HANDLE) goto out;
            h = (const char *)x + 1;  /* (its characters are checked as it is split below) */
        } else {
            for (Py_ssize_t k = sl - 7; k >= 0; k--) {
                if (PyUnicode_READ(kind, data, k) == 'P' && PyUnicode_READ(kind, data, k + 1) == 'O'
                    && PyUnicode_READ(kind, data, k + 2) == 'P' && PyUnicode_READ(kind, data, k + 3) == '_'
                    && PyUnicode_READ(kind, data, k + 4) == 'C' && PyUnicode_READ(kind, data, k + 5) == 'K'
                    && PyUnicode_READ(kind, data, k + 6) == 1) { j = k; break; }
            }
            if (j < 0 || (j > 0 && PyUnicode_READ(kind, data, j - 1) != 2)) goto out;
            for (Py_ssize_t k = j + 7; k < sl; k++) {
                Py_UCS4 c = PyUnicode_READ(kind, data, k);
                if (c == 2) break;
                if (c < 0x20 || c > 0x7e || hl == PC_MAX_HANDLE) goto out;  /* the broker name: plain ASCII only */
                hbuf[hl++] = (char)c;
            }
            h = hbuf;
        }
        if (last >= 0 && hl > ents[last].len + 1 && h[ents[last].len] == ' '
            && memcmp(h, pre.p + ents[last].at, ents[last].len) == 0) {
            /* the prefix of the last message's entry (its 7 fields checked then): only the offset to read */
            long long off = pc_canon(h + ents[last].len + 1, hl - ents[last].len - 1);
            if (off < 0) goto out;  /* a ninth field, not a canonical decimal: as the split below declines */
            long long bit = off - ents[last].ck;
            memcpy(bits.p + bits.len, &last, sizeof last); bits.len += sizeof last;
            memcpy(bits.p + bits.len, &bit, sizeof bit); bits.len += sizeof bit;
            continue;
        }
        const char *f[9];
        int nf = 0;
        f[nf++] = h;
        for (Py_ssize_t k = 0; k < hl; k++) {
            unsigned char c = (unsigned char)h[k];
            if (c <= ' ' || c > 0x7e) {  /* the broker name: plain ASCII only */
                if (c != ' ' || nf == 8) goto out;
                f[nf++] = h + k + 1;
            }
        }
        if (nf != 8) goto out;
        f[8] = h + hl + 1;  /* (one past the end: only subtracted from) */
        long long v[8];
        for (int k = 0; k < 8; k++) {
            if (k == 4 || k == 5) continue;
            v[k] = pc_canon(f[k], f[k + 1] - 1 - f[k]);
            if (v[k] < 0) goto out;
        }
        if (!(f[5] - 1 - f[4] == 1 && f[4][0] == '0')) goto out;  /* a retry topic's handle */
        Py_ssize_t plen = f[7] - 1 - h;  /* the prefix: all but " <queueOffset>" */
        int e;
        for (e = ne - 1; e >= 0; e--)
            if (ents[e].len == plen && memcmp(pre.p + ents[e].at, h, plen) == 0) break;
        if (e < 0) {
            if (ne == PC_MAX_ENTRIES) goto out;
            e = ne++;
            ents[e].at = pre.len; ents[e].len = plen; ents[e].ck = v[0]; ents[e].pt = v[1]; ents[e].it = v[2];
            ents[e].rq = v[3]; ents[e].qid = v[6];
            if (!rbuf_put(&pre, h, plen)) goto out;
        }
        int ei = e;
        last = e;
        long long bit = v[7] - ents[e].ck;
        memcpy(bits.p + bits.len, &ei, sizeof ei); bits.len += sizeof ei;
        memcpy(bits.p + bits.len, &bit, sizeof bit); bits.len += sizeof bit;
    }
#define APUT(lit) rbuf_put(&b, lit, sizeof(lit) - 1)
    {
        Py_ssize_t tl = PyUnicode_GET_LENGTH(topic), gl = PyUnicode_GET_LENGTH(group);
        const char *tp = (const char *)PyUnicode_DATA(topic), *gp = (const char *)PyUnicode_DATA(group);
        int ok = APUT("{\"code\":200151,\"language\":\"PYTHON\",\"version\":435,\"opaque\":") && rbuf_int(&b, opaque)
                 && APUT(",\"flag\":0,\"serializeTypeCurrentRPC\":\"JSON\"}");
        Py_ssize_t hend = b.len;
        ok = ok && APUT("{\"acks\":[");
        for (int e = 0; ok && e < ne; e++) {
            char num[24 * 5 + 40], *d = num;
            ok = (e == 0 || APUT(",")) && APUT("{\"c\":\"") && rbuf_put(&b, gp, gl) && APUT("\",\"t\":\"")
                 && rbuf_put(&b, tp, tl) && APUT("\",\"r\":\"0\",\"so\":");
            d = pc_put_ll(d, ents[e].ck); memcpy(d, ",\"q\":", 5); d += 5;
            d = pc_put_ll(d, ents[e].qid); memcpy(d, ",\"rq\":", 6); d += 6;
            d = pc_put_ll(d, ents[e].rq); memcpy(d, ",\"pt\":", 6); d += 6;
            d = pc_put_ll(d, ents[e].pt); memcpy(d, ",\"it\":", 6); d += 6;
            d = pc_put_ll(d, ents[e].it); memcpy(d, ",\"b\":[", 6); d += 6;
            ok = ok && rbuf_put(&b, num, d - num);
            int first = 1;
            for (Py_ssize_t k = 0; ok && k < nm; k++) {
                int ei;
                long long bit;
                memcpy(&ei, bits.p + k * (sizeof ei + sizeof bit), sizeof ei);
                if (ei != e) continue;
                memcpy(&bit, bits.p + k * (sizeof ei + sizeof bit) + sizeof ei, sizeof bit);
                d = num;
                if (!first) *d++ = ',';
                first = 0;
                d = pc_put_ll(d, bit);
                ok = rbuf_put(&b, num, d - num);
            }
            ok = ok && APUT("]}");
        }
        ok = ok && APUT("]}");
        if (!ok) goto out;
        Py_ssize_t hlen = hend - 8, blen = b.len - hend;
        if (b.len > 0x7FFFFFF0) goto out;
        put_i32(b.p, (int32_t)(4 + hlen + blen));
        put_i32(b.p + 4, (int32_t)hlen);
        res = PyBytes_FromStringAndSize((const char *)b.p, b.len);
        decline = 0;
    }
#undef APUT
out:
    rbuf_free(&pre); rbuf_free(&bits); rbuf_free(&b);
    return decline ? rbuf_declined() : res;
}
/* ============================ end of THE POP CLIENT ================================================== */

/* ============================================================================================== */
/* THE HALF LANE (issue "speed", branch half-lane): the send lane (sl_serve) serves half messages.     */
/*  A SEND_MESSAGE_V2 whose properties hold TRAN_MSG (found by sl_props_scan in a one-byte string) is  */
/*  served when it is the usual half message of a transaction producer (ours, RocketMQ's clients):      */
/*  its first TRAN_MSG property is exactly "true", the sysFlag's transaction bits are none or PREPARED, */
/*  the properties name no REAL_TOPIC / REAL_QID, its transaction id (the first UNIQ_KEY property, or   */
/*  the one the lane makes) needs no JSON escape, and the broker takes transaction messages            */
/*  (config.reject_transaction_message false, read at each send). It is stored as the full path stores  */
/*  it (SendMessageProcessor._store, then TransactionalMessageService.prepare): decorated as a plain    */
/*  send, then REAL_TOPIC and REAL_QID set (appended: neither is there), the transaction bits cleared,  */
/*  topic RMQ_SYS_TRANS_HALF_TOPIC, queue 0; answered with the plain send's frame plus "transactionId"  */
/*  (sl_frame's txid). Anything else declines before anything changed: the full path decides.          */
/*  ctx[8] = SendMessageProcessor.lane_context()'s half context: (broker config, the half topic), or    */
/*  None (no half lane: an 8-tuple context is the same).                                               */
/*  Edits elsewhere: THE SEND LANE's sl_frame (txid), sl_props_scan (SLP_TRAN), sl_serve (hl_check,     */
/*  hl_props, the half topic and sysFlag), sl_result and its two callers (the txid of a put answered    */
/*  in Python: SendMessageProcessor.lane_answer's).                                                    */
/*  Reference: SendMessageProcessor.process (tests/test_half_lane.py compares them).                   */
/* ============================================================================================== */

/* a transaction id the frame writes verbatim: printable ASCII, no '"' or '\\' (what the JSON encoder leaves as
 * it is), 1..64 characters */
static int hl_txid_ok(PyObject *txid) {
    if (!PyUnicode_CheckExact(txid) || !PyUnicode_IS_ASCII(txid)) return 0;
    Py_ssize_t n = PyUnicode_GET_LENGTH(txid);
    if (n < 1 || n > 64) return 0;
    const unsigned char *p = PyUnicode_1BYTE_DATA(txid);
    for (Py_ssize_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] > 0x7E || p[i] == '"' || p[i] == '\\') return 0;
    return 1;
}

/* properties.get_property over a one-byte text: the value of the first `name\x01` that starts the text or
 * follows a \x02 (its start in *vs, its length in *vn); 0 when there is none */
static int hl_prop(const char *p, Py_ssize_t n, const char *name, Py_ssize_t nl, Py_ssize_t *vs, Py_ssize_t *vn) {
    for (Py_ssize_t i = 0; i + nl + 1 <= n; i++) {
        if ((i == 0 || p[i - 1] == 2) && p[i + nl] == 1 && memcmp(p + i, name, nl) == 0) {
            Py_ssize_t s = i + nl + 1, e = s;
            while (e < n && p[e] != 2) e++;
            *vs = s; *vn = e - s;
            return 1;
        }
    }
    return 0;
}


/* whether sl_serve serves this half message (1; *half_topic borrowed, *txid a new reference to its id, or NULL:
 * the UNIQ_KEY the lane makes), declines it (0) or failed (-1). `found`: sl_props_scan's; `props` one-byte. */
static int hl_check(PyObject *ctx, PyObject *props, long long sys_flag, int found, PyObject *cfg, PyObject **half_topic,
                    PyObject **txid) {
    static PyObject *reject_name = NULL, *auto_name = NULL;
    *half_topic = NULL; *txid = NULL;
    if (PyTuple_GET_SIZE(ctx) < 9) return 0;
    PyObject *h = PyTuple_GET_ITEM(ctx, 8);
    if (!PyTuple_CheckExact(h) || PyTuple_GET_SIZE(h) != 2 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(h, 1))) return 0;
    long long tx = sys_flag & 0xC;
    if (tx != 0 && tx != 0x4) return 0;  /* COMMIT or ROLLBACK bits: the full path's answer */
    if (!PyUnicode_CheckExact(props) || PyUnicode_KIND(props) != PyUnicode_1BYTE_KIND) return 0;
    const char *p = (const char *)PyUnicode_1BYTE_DATA(props);
    Py_ssize_t n = PyUnicode_GET_LENGTH(props), vs, vn;
    if (!hl_prop(p, n, "TRAN_MSG", 8, &vs, &vn) || vn != 4 || memcmp(p + vs, "true", 4) != 0) return 0;
    if (memmem(p, (size_t)n, "REAL_TOPIC", 10) != NULL || memmem(p, (size_t)n, "REAL_QID", 8) != NULL) return 0;
    if (reject_name == NULL && (reject_name = PyUnicode_InternFromString("reject_transaction_message")) == NULL) return -1;
    if (auto_name == NULL && (auto_name = PyUnicode_InternFromString("auto_create_uniq_key")) == NULL) return -1;
    PyObject *rej = PyObject_GetAttr(PyTuple_GET_ITEM(h, 0), reject_name);
    if (rej == NULL) return -1;
    int refuse = PyObject_IsTrue(rej);
    Py_DECREF(rej);
    if (refuse != 0) return refuse < 0 ? -1 : 0;  /* the full path's NO_PERMISSION */
    if (found & SLP_UNIQ) {  /* the client's UNIQ_KEY is the transaction id: the first one, plain text */
        if (!hl_prop(p, n, "UNIQ_KEY", 8, &vs, &vn)) return 0;  /* only inside a value: the full path's msgId */
        PyObject *t = PyUnicode_Substring(props, vs, vs + vn);
        if (t == NULL) return -1;
        if (!hl_txid_ok(t)) { Py_DECREF(t); return 0; }
        *txid = t;
    } else {  /* the lane makes one (sl_serve): only when the store makes them */
        PyObject *a = PyObject_GetAttr(cfg, auto_name);
        if (a == NULL) return -1;
        int on = PyObject_IsTrue(a);
        Py_DECREF(a);
        if (on <= 0) return on;
    }
    *half_topic = PyTuple_GET_ITEM(h, 1);
    return 1;
}

/* set_property(set_property(decorated, REAL_TOPIC, topic), REAL_QID, str(queue_id)) for a text that holds neither
 * (hl_check): a separator when it does not end with one, then both appended. New reference. */
static PyObject *hl_props(PyObject *decorated, PyObject *topic, long long queue_id) {
    char t[25], *d = sl_digits(t + 24, queue_id);
    t[24] = 0;  /* %s below */
    Py_ssize_t dn = t + 24 - d, n = PyUnicode_GET_LENGTH(decorated), tn = PyUnicode_GET_LENGTH(topic);
    int sep = n > 0 && PyUnicode_READ_CHAR(decorated, n - 1) != 2;
    if (PyUnicode_KIND(decorated) != PyUnicode_1BYTE_KIND || !PyUnicode_IS_ASCII(topic))
        return PyUnicode_FromFormat("%U%sREAL_TOPIC\x01%U\x02REAL_QID\x01%s\x02", decorated, sep ? "\x02" : "",
                                    topic, d);  /* wide characters (from the broker's CLUSTER text): as str does */
    Py_ssize_t total = n + sep + 11 + tn + 10 + dn + 1;
    PyObject *s = PyUnicode_New(total, PyUnicode_IS_ASCII(decorated) ? 127 : 255);
    if (s == NULL) return NULL;
    char *w = (char *)PyUnicode_1BYTE_DATA(s);
    memcpy(w, PyUnicode_1BYTE_DATA(decorated), n); w += n;
    if (sep) *w++ = 2;
    memcpy(w, "REAL_TOPIC\x01", 11); w += 11;
    memcpy(w, PyUnicode_1BYTE_DATA(topic), tn); w += tn;
    memcpy(w, "\x02REAL_QID\x01", 10); w += 10;
    memcpy(w, d, dn); w += dn;
    *w = 2;
    return s;
}
/* ============================ end of THE HALF LANE ================================================== */

/* ============================ THE POP CORE (branch pop-core) ========================================== */
/* PopService.pop_now's registration of a contiguous pop in the checkpoint buffer (the PopCheckPoint, its   */
/* _Entry, the journal's C line, the _by_key entry, the queue's deque, and the POP response's               */
/* startOffsetInfo / msgOffsetInfo items) and PopBufferMergeService.ack_one's settling of a contiguous      */
/* entry (its acked bits, the journal's A line, the _by_key entry of a settled one). Python references: the */
/* inline block of pop_now / PopBufferMergeService.add_ck, and _ack_run (broker/pop_service.py,             */
/* broker/pop_buffer.py). Both run with the buffer's lock held by the caller; both return None before any  */
/* change for anything they do not handle, and the caller then runs the reference.                          */
static PyObject *pcore_n_start_offset, *pcore_n_pop_time, *pcore_n_invisible_time, *pcore_n_num, *pcore_n_queue_id,
    *pcore_n_topic, *pcore_n_group, *pcore_n_broker_name, *pcore_n_queue_offset_diff, *pcore_n_bit_map,
    *pcore_n_revive_offset, *pcore_n_re_put_times, *pcore_n_ck, *pcore_n_revive_qid, *pcore_n_next_offset,
    *pcore_n_acked, *pcore_n_full, *pcore_n_contiguous, *pcore_n_stored, *pcore_n_flush_at, *pcore_n_append,
    *pcore_empty;

static int pcore_init_names(void) {
    if (pcore_empty != NULL)
        return 0;
#define PCORE_NAME(v, s) if ((v = PyUnicode_InternFromString(s)) == NULL) return -1
    PCORE_NAME(pcore_n_start_offset, "start_offset"); PCORE_NAME(pcore_n_pop_time, "pop_time");
    PCORE_NAME(pcore_n_invisible_time, "invisible_time"); PCORE_NAME(pcore_n_num, "num");
    PCORE_NAME(pcore_n_queue_id, "queue_id"); PCORE_NAME(pcore_n_topic, "topic"); PCORE_NAME(pcore_n_group, "group");
    PCORE_NAME(pcore_n_broker_name, "broker_name"); PCORE_NAME(pcore_n_queue_offset_diff, "queue_offset_diff");
    PCORE_NAME(pcore_n_bit_map, "bit_map"); PCORE_NAME(pcore_n_revive_offset, "revive_offset");
    PCORE_NAME(pcore_n_re_put_times, "re_put_times"); PCORE_NAME(pcore_n_ck, "ck");
    PCORE_NAME(pcore_n_revive_qid, "revive_qid"); PCORE_NAME(pcore_n_next_offset, "next_offset");
    PCORE_NAME(pcore_n_acked, "acked"); PCORE_NAME(pcore_n_full, "full"); PCORE_NAME(pcore_n_contiguous, "contiguous");
    PCORE_NAME(pcore_n_stored, "stored"); PCORE_NAME(pcore_n_flush_at, "flush_at"); PCORE_NAME(pcore_n_append, "append");
#undef PCORE_NAME
    pcore_empty = PyTuple_New(0);
    return pcore_empty == NULL ? -1 : 0;
}

/* an exact int within +-2**53 into *out: 1; 0 when it is not one (no error set) */
static int pcore_int(PyObject *o, long long *out) {
    if (!PyLong_CheckExact(o))
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v > (1LL << 53) || v < -(1LL << 53))
        return 0;
    *out = v;
    return 1;
}

static char *pcore_ll(char *d, long long v) {
    char digits[24];
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    int k = 0;
    do {
        digits[k++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        *d++ = '-';
    while (k)
        *d++ = digits[--k];
    return d;
}

/* ",".join(map(str, range(start, stop))), start < stop; from a start >= 0 each next number is the previous one's
 * digits counted up by one (branch pop-broker: a division per digit per number was most of a pop's text) */
static char *pcore_run(char *d, long long start, long long stop) {
    if (start < 0) {
        for (long long v = start; v < stop; v++) {
            if (v != start)
                *d++ = ',';
            d = pcore_ll(d, v);
        }
        return d;
    }
    char dig[48];  /* the digits at dig + 24, growing leftwards by a carry out of the top digit (20 at most) */
    char *p = dig + 24;
    int len = (int)(pcore_ll(p, start) - p);
    memcpy(d, p, (size_t)len);
    d += len;
    for (long long v = start + 1; v < stop; v++) {
        int i = len - 1;
        while (i >= 0 && p[i] == '9')
            p[i--] = '0';
        if (i < 0) {  /* 99..9 + 1: one digit more */
            *--p = '1';
            len++;
        } else {
            p[i]++;
        }
        *d++ = ',';
        memcpy(d, p, (size_t)len);
        d += len;
    }
    return d;
}

/* one write() of the line, as os.write (EINTR retried); -1 with OSError set */
static int pcore_write(int fd, const char *p, Py_ssize_t len) {
    for (;;) {
        ssize_t w = write(fd, p, (size_t)len);
        if (w >= 0)
            return 0;
        if (errno != EINTR) {
            PyErr_SetFromErrno(PyExc_OSError);
            return -1;
        }
        if (PyErr_CheckSignals() < 0)
            return -1;
    }
}

static int pcore_set(PyObject *o, PyObject *name, PyObject *v) {
    if (v == NULL)
        return -1;
    int r = sf_set_any(o, name, v);  /* a slot (_Entry's) by its offset, else setattr */
    Py_DECREF(v);
    return r;
}

static PyTypeObject PopEntry_Type;  /* THE POP ENTRY (branch pop-ck), above the method table */
static PyObject *pe_make(PyTypeObject *et, PyObject *ck_cls, PyObject *group, PyObject *topic, PyObject *q_obj,
                         PyObject *offset_obj, PyObject *pop_time_obj, PyObject *invisible, PyObject *broker_name,
                         long long offset, long long n, PyObject *revive_qid, PyObject *next_offset, PyObject *full,
                         PyObject *flush_at);
static int pe_settle_fields(PyObject *o, long long *so, long long *n, long long *acked, long long *full);

/* pop_register(PopCheckPoint, _Entry, deque, by_key, queues, qkey, fd, group, topic, q, offset, end, pop_time,
 *              invisible, broker_name, revive_qid, stay_ms, margin_ms, retry)
 * -> (journal bytes written, scan needed, startOffsetInfo item, msgOffsetInfo item), or None (nothing changed) */
static PyObject *pop_register(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 19 || pcore_init_names() < 0)
        return na != 19 ? (PyErr_SetString(PyExc_TypeError, "pop_register takes 19 arguments"), NULL) : NULL;
    PyObject *ck_cls = a[0], *entry_cls = a[1], *deque_cls = a[2], *by_key = a[3], *queues = a[4], *qkey = a[5];
    PyObject *group = a[7], *topic = a[8], *q_obj = a[9], *offset_obj = a[10], *pop_time_obj = a[12];
    PyObject *broker_name = a[14], *retry = a[18];
    long long fd, q, offset, end, pop_time, invisible, revive_qid, stay_ms, margin_ms;
    if (!PyType_Check(ck_cls) || !PyType_Check(entry_cls) || !PyDict_CheckExact(by_key) || !PyDict_CheckExact(queues)
        || !PyTuple_CheckExact(qkey) || !PyUnicode_CheckExact(group) || !PyUnicode_CheckExact(topic)
        || !PyUnicode_CheckExact(broker_name) || (retry != Py_True && retry != Py_False)
        || !pcore_int(a[6], &fd) || !pcore_int(q_obj, &q) || !pcore_int(offset_obj, &offset) || !pcore_int(a[11], &end)
        || !pcore_int(pop_time_obj, &pop_time) || !pcore_int(a[13], &invisible) || !pcore_int(a[15], &revive_qid)
        || !pcore_int(a[16], &stay_ms) || !pcore_int(a[17], &margin_ms) || fd < 0 || fd > INT_MAX)
        Py_RETURN_NONE;
    long long n = end - offset;
    if (n < 1 || n > 1024)
        Py_RETURN_NONE;
    Py_ssize_t glen, tlen;
    const char *g = PyUnicode_AsUTF8AndSize(group, &glen);
    const char *t = g != NULL ? PyUnicode_AsUTF8AndSize(topic, &tlen) : NULL;
    if (t == NULL) {  /* a lone surrogate: the reference's encode decides */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    long long stay = invisible - margin_ms < stay_ms ? invisible - margin_ms : stay_ms;
    long long flush_at = pop_time + (stay > 0 ? stay : 0);
    PyObject *ck = NULL, *entry = NULL, *diffs = NULL, *key = NULL, *full = NULL, *res = NULL, *starts = NULL,
             *infos = NULL, *first = NULL;
    char *buf = NULL;
    size_t cap = (size_t)glen + (size_t)tlen + 256 + (size_t)n * 21;
    /* every object first: an allocation failure changes nothing */
    PyTypeObject *ct = (PyTypeObject *)ck_cls, *et = (PyTypeObject *)entry_cls;
    if (PyType_IsSubtype(et, &PopEntry_Type)) {  /* THE POP ENTRY: the checkpoint kept as its fields (pe_make) */
        PyObject *fl = PyLong_FromLongLong(flush_at);
        full = fl != NULL ? PyLong_FromLongLong((1LL << (n < 63 ? n : 0)) - 1) : NULL;
        if (full == NULL || n >= 63) {  /* n >= 63: `full` as below */
            Py_CLEAR(full);
            if (fl != NULL && n >= 63) {
                PyObject *one = PyLong_FromLong(1), *sh = PyLong_FromLongLong(n), *big = NULL;
                if (one != NULL && sh != NULL && (big = PyNumber_Lshift(one, sh)) != NULL)
                    full = PyNumber_Subtract(big, one);
                Py_XDECREF(one); Py_XDECREF(sh); Py_XDECREF(big);
            }
            if (full == NULL) {
                Py_XDECREF(fl);
                goto out;
            }
        }
        entry = pe_make(et, ck_cls, group, topic, q_obj, offset_obj, pop_time_obj, a[13], broker_name, offset, n, a[15],
                        a[11], full, fl);  /* takes full and fl */
        full = NULL;
        if (entry == NULL)
            goto out;
        goto made;
    }
    if ((diffs = PyList_New((Py_ssize_t)n)) == NULL)
        goto out;
    for (long long i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLongLong(i);
        if (v == NULL)
            goto out;
        PyList_SET_ITEM(diffs, (Py_ssize_t)i, v);
    }
    if ((ck = ct->tp_new(ct, pcore_empty, NULL)) == NULL)
        goto out;
    Py_INCREF(offset_obj); Py_INCREF(pop_time_obj); Py_INCREF(a[13]); Py_INCREF(q_obj); Py_INCREF(topic);
    Py_INCREF(group); Py_INCREF(broker_name); Py_INCREF(diffs);
    if (pcore_set(ck, pcore_n_start_offset, offset_obj) < 0 || pcore_set(ck, pcore_n_pop_time, pop_time_obj) < 0
        || pcore_set(ck, pcore_n_invisible_time, a[13]) < 0 || pcore_set(ck, pcore_n_num, PyLong_FromLongLong(n)) < 0
        || pcore_set(ck, pcore_n_queue_id, q_obj) < 0 || pcore_set(ck, pcore_n_topic, topic) < 0
        || pcore_set(ck, pcore_n_group, group) < 0 || pcore_set(ck, pcore_n_broker_name, broker_name) < 0
        || pcore_set(ck, pcore_n_queue_offset_diff, diffs) < 0 || pcore_set(ck, pcore_n_bit_map, PyLong_FromLong(0)) < 0
        || pcore_set(ck, pcore_n_revive_offset, PyLong_FromLong(0)) < 0
        || pcore_set(ck, pcore_n_re_put_times, PyLong_FromLong(0)) < 0)
        goto out;
    if (n < 63) {
        full = PyLong_FromLongLong((1LL << n) - 1);
    } else {
        PyObject *one = PyLong_FromLong(1), *sh = PyLong_FromLongLong(n), *big = NULL;
        if (one != NULL && sh != NULL && (big = PyNumber_Lshift(one, sh)) != NULL)
            full = PyNumber_Subtract(big, one);
        Py_XDECREF(one); Py_XDECREF(sh); Py_XDECREF(big);
    }
    if (full == NULL || (entry = et->tp_new(et, pcore_empty, NULL)) == NULL)
        goto out;
    Py_INCREF(ck); Py_INCREF(a[15]); Py_INCREF(a[11]); Py_INCREF(full); Py_INCREF(Py_True); Py_INCREF(Py_False);
    if (pcore_set(entry, pcore_n_ck, ck) < 0 || pcore_set(entry, pcore_n_revive_qid, a[15]) < 0
        || pcore_set(entry, pcore_n_next_offset, a[11]) < 0 || pcore_set(entry, pcore_n_acked, PyLong_FromLong(0)) < 0
        || pcore_set(entry, pcore_n_full, full) < 0 || pcore_set(entry, pcore_n_contiguous, Py_True) < 0
        || pcore_set(entry, pcore_n_stored, Py_False) < 0
        || pcore_set(entry, pcore_n_flush_at, PyLong_FromLongLong(flush_at)) < 0)
        goto out;
made:
    if ((key = PyTuple_Pack(5, group, topic, q_obj, offset_obj, pop_time_obj)) == NULL)
        goto out;
    if ((buf = PyMem_Malloc(cap)) == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    char flag = retry == Py_True ? '1' : '0';
    char *d = buf;
    *d++ = flag; *d++ = ' '; d = pcore_ll(d, q); *d++ = ' '; d = pcore_ll(d, offset);
    if ((starts = PyUnicode_DecodeASCII(buf, d - buf, NULL)) == NULL)
        goto out;
    d = buf;
    *d++ = flag; *d++ = ' '; d = pcore_ll(d, q); *d++ = ' '; d = pcore_run(d, offset, end);
    if ((infos = PyUnicode_DecodeASCII(buf, d - buf, NULL)) == NULL)
        goto out;
    /* the journal's C line (PopJournal.ck with contiguous diffs) */
    d = buf;
    *d++ = 'C'; *d++ = ' ';
    memcpy(d, g, (size_t)glen); d += glen; *d++ = ' ';
    memcpy(d, t, (size_t)tlen); d += tlen; *d++ = ' ';
    d = pcore_ll(d, q); *d++ = ' '; d = pcore_ll(d, offset); *d++ = ' '; d = pcore_ll(d, pop_time); *d++ = ' ';
    d = pcore_ll(d, invisible); *d++ = ' '; d = pcore_ll(d, revive_qid); *d++ = ' '; d = pcore_ll(d, end); *d++ = ' ';
    d = pcore_run(d, 0, n); *d++ = '\n';
    Py_ssize_t line = d - buf;
    if (pcore_write((int)fd, buf, line) < 0)
        goto out;
    /* the state, in the reference's order: _by_key, then the queue */
    if (PyDict_SetItem(by_key, key, entry) < 0)
        goto out;
    PyObject *bq = PyDict_GetItemWithError(queues, qkey);
    int scan = 0;
    if (bq == NULL) {
        if (PyErr_Occurred() || (bq = PyObject_CallNoArgs(deque_cls)) == NULL)
            goto out;
        int r = PyDict_SetItem(queues, qkey, bq);
        Py_DECREF(bq);  /* the dict holds it */
        if (r < 0)
            goto out;
    }
    PyObject *app[2] = {bq, entry};
    PyObject *ok = PyObject_VectorcallMethod(pcore_n_append, app, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (ok == NULL)
        goto out;
    Py_DECREF(ok);
    if ((first = PySequence_GetItem(bq, 0)) == NULL)
        goto out;
    if (first != entry) {  /* first.stored or first.acked == first.full: the caller scans */
        PyObject *st = sf_get_any(first, pcore_n_stored);
        if (st == NULL)
            goto out;
        scan = PyObject_IsTrue(st);
        Py_DECREF(st);
        if (scan < 0)
            goto out;
        if (!scan) {
            PyObject *ac = sf_get_any(first, pcore_n_acked), *fu = ac ? sf_get_any(first, pcore_n_full) : NULL;
            scan = fu != NULL ? PyObject_RichCompareBool(ac, fu, Py_EQ) : -1;
            Py_XDECREF(ac); Py_XDECREF(fu);
            if (scan < 0)
                goto out;
        }
    }
    PyObject *ln = PyLong_FromSsize_t(line);  /* Py_BuildValue("(nOOO)", ...) without its format's parse */
    res = ln != NULL ? PyTuple_Pack(4, ln, scan ? Py_True : Py_False, starts, infos) : NULL;
    Py_XDECREF(ln);
out:
    PyMem_Free(buf);
    Py_XDECREF(ck); Py_XDECREF(entry); Py_XDECREF(diffs); Py_XDECREF(key); Py_XDECREF(full); Py_XDECREF(starts);
    Py_XDECREF(infos); Py_XDECREF(first);
    return res;
}

/* ack_settle(by_key, key, start, stop, fd): PopBufferMergeService.ack_one for a buffered, unstored, contiguous entry
 * of at most 62 messages -> (journal bytes written, settled: its _by_key entry deleted), or None (nothing changed) */
static PyObject *ack_settle(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 5) {
        PyErr_SetString(PyExc_TypeError, "ack_settle takes 5 arguments");
        return NULL;
    }
    if (pcore_init_names() < 0)
        return NULL;
    PyObject *by_key = a[0], *key = a[1];
    long long start, stop, fd, kq, kso, kpt;
    if (!PyDict_CheckExact(by_key) || !PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) != 5
        || !PyUnicode_CheckExact(PyTuple_GET_ITEM(key, 0)) || !PyUnicode_CheckExact(PyTuple_GET_ITEM(key, 1))
        || !pcore_int(PyTuple_GET_ITEM(key, 2), &kq) || !pcore_int(PyTuple_GET_ITEM(key, 3), &kso)
        || !pcore_int(PyTuple_GET_ITEM(key, 4), &kpt) || !pcore_int(a[2], &start) || !pcore_int(a[3], &stop)
        || !pcore_int(a[4], &fd) || fd < 0 || fd > INT_MAX || start >= stop || stop - start > 1024)
        Py_RETURN_NONE;
    PyObject *entry = PyDict_GetItemWithError(by_key, key);
    if (entry == NULL) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(entry);
    PyObject *res = NULL, *stored = NULL, *contiguous = NULL, *ck = NULL, *so_obj = NULL, *diffs = NULL, *acked_obj = NULL,
             *full_obj = NULL, *new_acked = NULL;
    char *buf = NULL;
    int decline = 1;
    long long so, acked, full, pn;
    Py_ssize_t n;
    if (pe_settle_fields(entry, &so, &pn, &acked, &full)) {  /* an entry pop_register made (THE POP ENTRY) */
        n = (Py_ssize_t)pn;
    } else {
        if ((stored = sf_get_any(entry, pcore_n_stored)) == NULL
            || (contiguous = sf_get_any(entry, pcore_n_contiguous)) == NULL)
            goto out;
        if (stored != Py_False || contiguous != Py_True)
            goto out;
        if ((ck = sf_get_any(entry, pcore_n_ck)) == NULL || (acked_obj = sf_get_any(entry, pcore_n_acked)) == NULL
            || (full_obj = sf_get_any(entry, pcore_n_full)) == NULL)
            goto out;
        if ((so_obj = sf_get_any(ck, pcore_n_start_offset)) == NULL
            || (diffs = sf_get_any(ck, pcore_n_queue_offset_diff)) == NULL)
            goto out;
        if (!pcore_int(so_obj, &so) || !PyList_CheckExact(diffs) || !pcore_int(acked_obj, &acked)
            || !pcore_int(full_obj, &full))
            goto out;
        n = PyList_GET_SIZE(diffs);
    }
    if (n > 62 || acked < 0 || full < 0)
        goto out;
    Py_ssize_t glen, tlen;
    const char *g = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(key, 0), &glen);
    const char *t = g != NULL ? PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(key, 1), &tlen) : NULL;
    if (t == NULL) {
        PyErr_Clear();
        goto out;
    }
    decline = 0;
    /* _ack_run: the bits of [first, first + stop - start) the checkpoint holds */
    long long firstd = start - so, lo = firstd > 0 ? firstd : 0, hi = firstd + (stop - start);
    if (hi > n)
        hi = n;
    if (lo < hi)
        acked |= (long long)((((unsigned long long)1 << (hi - lo)) - 1) << lo);
    if ((new_acked = PyLong_FromLongLong(acked)) == NULL || sf_set_any(entry, pcore_n_acked, new_acked) < 0)
        goto out;
    size_t cap = (size_t)glen + (size_t)tlen + 128 + (size_t)(stop - start) * 21;
    if ((buf = PyMem_Malloc(cap)) == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    char *d = buf;
    *d++ = 'A'; *d++ = ' ';
    memcpy(d, g, (size_t)glen); d += glen; *d++ = ' ';
    memcpy(d, t, (size_t)tlen); d += tlen; *d++ = ' ';
    d = pcore_ll(d, kq); *d++ = ' '; d = pcore_ll(d, kso); *d++ = ' '; d = pcore_ll(d, kpt); *d++ = ' ';
    d = pcore_run(d, start, stop); *d++ = '\n';
    Py_ssize_t line = d - buf;
    if (pcore_write((int)fd, buf, line) < 0)
        goto out;
    int settled = acked == full;
    if (settled && PyDict_DelItem(by_key, key) < 0)
        goto out;
    PyObject *ln = PyLong_FromSsize_t(line);  /* Py_BuildValue("(nO)", ...) without its format's parse */
    res = ln != NULL ? PyTuple_Pack(2, ln, settled ? Py_True : Py_False) : NULL;
    Py_XDECREF(ln);
out:
    PyMem_Free(buf);
    Py_XDECREF(stored); Py_XDECREF(contiguous); Py_XDECREF(ck); Py_XDECREF(so_obj); Py_XDECREF(diffs);
    Py_XDECREF(acked_obj); Py_XDECREF(full_obj); Py_XDECREF(new_acked); Py_DECREF(entry);
    if (decline) {
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;
    }
    return res;
}
/* ============================ end of THE POP CORE ===================================================== */

/* ============================================================================================== */
/* SLOT FIELDS (issue speed, branch send-core): a field of a Python object read and written at its     */
/*  slot's offset instead of through PyObject_GetAttr / PyObject_SetAttr (~200 and ~300 instructions,  */
/*  most of it the name's look-up in the instance). The dispatch pass (dispatch_singles) reads and     */
/*  writes ~45 fields of its objects per pass; the fields are slots of their classes (MappedFile,       */
/*  MappedFileQueue, ConsumeQueue, IndexFile, IndexService, ReputMessageService: `__slots__`, which     */
/*  keep a `__dict__` for everything else). sf_get / sf_set take the slot only when the generic        */
/*  protocol would do exactly that: the type's tp_getattro / tp_setattro are the generic ones and the  */
/*  name's look-up on the type (_PyType_Lookup, the MRO) finds a writable object member descriptor     */
/*  (T_OBJECT_EX) of a base of the type. The offset is cached per field for the last four types, keyed */
/*  by the type's version tag, which CPython renews whenever the type or a base changes (a property     */
/*  put in place of the slot, say); any other object, an unset slot (its AttributeError) and a type    */
/*  without a valid tag take the generic calls. The prototypes and the cache type are declared above   */
/*  THE DISPATCH PASS. sf_get_any / sf_set_any do the same with one (name, type) table for callers     */
/*  with names of their own: single_attr_i64 / single_set_i64 and the single put's hand-off, locate    */
/*  and publish (CommitLog, MappedFile, ReputMessageService fields; prototypes above single_attr_i64). */
/*  Reference: the generic protocol (tests/test_slot_fields_native.py) and the Python paths            */
/*  (tests/test_dispatch_native.py, tests/test_single_put*.py).                                        */
/* ============================================================================================== */
/* the slot offset of field `name` of objects of type `tp`, or -1: use the generic protocol */
static Py_ssize_t sf_offset(PyTypeObject *tp, PyObject *name, sf_cache *c) {
    int valid = (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) != 0;
    for (int i = 0; i < 4; i++)
        if (valid && c->e[i].tp == tp && c->e[i].tag == tp->tp_version_tag) return c->e[i].off;
    Py_ssize_t off = -1;
    if (tp->tp_getattro == PyObject_GenericGetAttr && tp->tp_setattro == PyObject_GenericSetAttr &&
        PyUnicode_CheckExact(name)) {
        PyObject *d = _PyType_Lookup(tp, name);  /* borrowed; gives the type a version tag when it can */
        if (d != NULL && Py_TYPE(d) == &PyMemberDescr_Type) {
            PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
            if (m->type == T_OBJECT_EX && !(m->flags & READONLY) && PyType_IsSubtype(tp, PyDescr_TYPE(d)))
                off = m->offset;
        }
    }
    if ((tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) && tp->tp_version_tag != 0) {
        memmove(&c->e[1], &c->e[0], 3 * sizeof c->e[0]);  /* the type pointer is only compared: a tag is never reused */
        c->e[0].tp = tp;
        c->e[0].tag = tp->tp_version_tag;
        c->e[0].off = off;
    }
    return off;
}

/* getattr(o, name): a new reference, or NULL with an error set */
static PyObject *sf_get(PyObject *o, PyObject *name, sf_cache *c) {
    Py_ssize_t off = sf_offset(Py_TYPE(o), name, c);
    if (off >= 0) {
        PyObject *v = *(PyObject **)((char *)o + off);
        if (v != NULL) return Py_NewRef(v);
    }
    return PyObject_GetAttr(o, name);  /* also an unset slot's AttributeError */
}

/* setattr(o, name, v): 0, or -1 with an error set (as PyMember_SetOne does for a T_OBJECT_EX slot) */
static int sf_set(PyObject *o, PyObject *name, sf_cache *c, PyObject *v) {
    Py_ssize_t off = sf_offset(Py_TYPE(o), name, c);
    if (off >= 0 && v != NULL) {
        Py_XSETREF(*(PyObject **)((char *)o + off), Py_NewRef(v));
        return 0;
    }
    return PyObject_SetAttr(o, name, v);
}

/* the dispatch pass's single_attr_i64 / single_set_i64 for its field `i` (d_names / d_cache) */
static int ds_i64(PyObject *o, int i, int64_t lo, int64_t hi, int64_t *out) {
    PyObject *v = sf_get(o, d_names[i], &d_cache[i]);
    if (v == NULL) return -1;
    int ok = PyLong_CheckExact(v) && as_i64(v, lo, hi, out);
    Py_DECREF(v);
    return ok;
}

static int ds_set_i64(PyObject *o, int i, int64_t v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (x == NULL) return -1;
    int r = sf_set(o, d_names[i], &d_cache[i], x);
    Py_DECREF(x);
    return r;
}

/* For callers with names of their own (single_attr_i64 / single_set_i64, the single put's hand-off): one
 * table of offsets keyed by (name, type), direct-mapped; an entry holds its name (so the name's address is
 * not reused while cached) and is overwritten on a collision. */
typedef struct { PyObject *name; PyTypeObject *tp; unsigned int tag; Py_ssize_t off; } sf_any_entry;
static sf_any_entry sf_any_table[128];

static Py_ssize_t sf_offset_any(PyTypeObject *tp, PyObject *name) {
    sf_any_entry *e = &sf_any_table[(((uintptr_t)name >> 4) ^ ((uintptr_t)tp >> 4)) & 127];
    if (e->name == name && e->tp == tp && (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG) &&
        e->tag == tp->tp_version_tag)
        return e->off;
    sf_cache one;
    memset(&one, 0, sizeof one);
    Py_ssize_t off = sf_offset(tp, name, &one);
    if (one.e[0].tp == tp) {  /* cacheable (the type has a valid version tag) */
        PyObject *old = e->name;
        e->name = Py_NewRef(name);
        e->tp = tp;
        e->tag = one.e[0].tag;
        e->off = off;
        Py_XDECREF(old);
    }
    return off;
}

static PyObject *sf_get_any(PyObject *o, PyObject *name) {
    Py_ssize_t off = sf_offset_any(Py_TYPE(o), name);
    if (off >= 0) {
        PyObject *v = *(PyObject **)((char *)o + off);
        if (v != NULL) return Py_NewRef(v);
    }
    return PyObject_GetAttr(o, name);
}

static int sf_set_any(PyObject *o, PyObject *name, PyObject *v) {
    Py_ssize_t off = sf_offset_any(Py_TYPE(o), name);
    if (off >= 0 && v != NULL) {
        Py_XSETREF(*(PyObject **)((char *)o + off), Py_NewRef(v));
        return 0;
    }
    return PyObject_SetAttr(o, name, v);
}

/* slot_getattr(o, name) / slot_setattr(o, name, value): sf_get / sf_set from Python, for the tests that
 * compare them with getattr / setattr. As in the dispatch pass, each field name has a cache of its own
 * (the first 32 names seen, kept alive in sf_test_names; later ones an error). */
static PyObject *sf_test_names = NULL;  /* {name: index into sf_test_caches} */
static sf_cache sf_test_caches[32];

static sf_cache *sf_test_cache(PyObject *name) {
    if (sf_test_names == NULL && (sf_test_names = PyDict_New()) == NULL) return NULL;
    PyObject *i = PyDict_GetItemWithError(sf_test_names, name);
    if (i == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_ssize_t n = PyDict_GET_SIZE(sf_test_names);
        if (n == 32) { PyErr_SetString(PyExc_RuntimeError, "slot_getattr / slot_setattr: 32 names at most"); return NULL; }
        i = PyLong_FromSsize_t(n);
        int bad = i == NULL || PyDict_SetItem(sf_test_names, name, i) < 0;
        Py_XDECREF(i);
        if (bad) return NULL;
        return &sf_test_caches[n];
    }
    return &sf_test_caches[PyLong_AsSsize_t(i)];
}

static PyObject *slot_getattr(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "slot_getattr(o, name)");
        return NULL;
    }
    sf_cache *c = sf_test_cache(args[1]);
    return c != NULL ? sf_get(args[0], args[1], c) : NULL;
}

static PyObject *slot_setattr(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyUnicode_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "slot_setattr(o, name, value)");
        return NULL;
    }
    sf_cache *c = sf_test_cache(args[1]);
    if (c == NULL || sf_set(args[0], args[1], c, args[2]) < 0) return NULL;
    Py_RETURN_NONE;
}

/* slot_getattr_any(o, name) / slot_setattr_any(o, name, value): sf_get_any / sf_set_any, for the tests */
static PyObject *slot_getattr_any(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "slot_getattr_any(o, name)");
        return NULL;
    }
    return sf_get_any(args[0], args[1]);
}

static PyObject *slot_setattr_any(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyUnicode_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "slot_setattr_any(o, name, value)");
        return NULL;
    }
    if (sf_set_any(args[0], args[1], args[2]) < 0) return NULL;
    Py_RETURN_NONE;
}
/* ============================ end of SLOT FIELDS ==================================================== */

/* ============================ THE END LANE (branch end-lane) ========================================
 * The properties of an END_TRANSACTION COMMIT's record and of the half message it ends, in one pass over
 * the half's properties string (TransactionalMessageService._commit_message / half_message are the
 * reference). ASCII strings only: anything else declines (None) to the Python path. */

/* end_commit_props(props, queue_offset, drop_crc) -> (commit_props, real_topic, real_qid) | None:
 *   real_topic = get_property(props, "REAL_TOPIC") or ""
 *   real_qid   = int(get_property(props, "REAL_QID") or 0)       (plain digits only, else None)
 *   commit_props = set_property(delete_properties(props, dropped), "TRAN_PREPARED_QUEUE_OFFSET", str(qo))
 * dropped: REAL_TOPIC, REAL_QID, TRANSACTION_CHECK_TIMES (and __CRC32# with drop_crc). One pass: a segment
 * (split on 0x02) starting with any dropped name or TRAN_PREPARED_QUEUE_OFFSET + 0x01 goes; every kept
 * segment but the string's last keeps its 0x02; then 0x02 unless empty or ending in one, then the new entry
 * (delete_properties then set_property's delete_property give the same bytes: see the tests). */
static int el_starts(const char *s, Py_ssize_t n, const char *lead, Py_ssize_t ln) {
    return n >= ln && memcmp(s, lead, (size_t)ln) == 0;
}

static PyObject *end_commit_props(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *const drops[] = {
        "REAL_TOPIC\x01", "REAL_QID\x01", "TRANSACTION_CHECK_TIMES\x01", "TRAN_PREPARED_QUEUE_OFFSET\x01",
        "__CRC32#\x01",
    };
    static const Py_ssize_t drop_lens[] = {11, 9, 24, 27, 9};
    if (nargs != 3 || !PyUnicode_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) Py_RETURN_NONE;
    PyObject *ps = args[0];
    if (!PyUnicode_IS_ASCII(ps)) Py_RETURN_NONE;
    int overflow = 0;
    long long qo = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (overflow || (qo == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int drop_crc = PyObject_IsTrue(args[2]);
    if (drop_crc < 0) return NULL;
    int ndrops = drop_crc ? 5 : 4;
    const char *s = (const char *)PyUnicode_DATA(ps);
    Py_ssize_t n = PyUnicode_GET_LENGTH(ps);
    char qbuf[24];
    const char *qtext = sl_digits(qbuf + sizeof qbuf, qo);  /* str(qo) (THE SEND LANE's digits) */
    int qn = (int)(qbuf + sizeof qbuf - qtext);
    static const char entry[] = "TRAN_PREPARED_QUEUE_OFFSET\x01";
    Py_ssize_t cap = n + 1 + (Py_ssize_t)(sizeof entry - 1) + qn + 1;
    char small[512];
    char *o = cap <= (Py_ssize_t)sizeof small ? small : PyMem_Malloc((size_t)cap);
    if (o == NULL) return PyErr_NoMemory();
    Py_ssize_t w = 0;
    const char *rt = NULL, *rq = NULL;
    Py_ssize_t rtn = 0, rqn = 0;
    Py_ssize_t i = 0;
    for (;;) {
        const char *seg = s + i;
        const char *sep = memchr(seg, 0x02, (size_t)(n - i));
        Py_ssize_t sn = sep != NULL ? sep - seg : n - i;
        int last = sep == NULL;
        if (rt == NULL && el_starts(seg, sn, "REAL_TOPIC\x01", 11)) { rt = seg + 11; rtn = sn - 11; }
        if (rq == NULL && el_starts(seg, sn, "REAL_QID\x01", 9)) { rq = seg + 9; rqn = sn - 9; }
        int drop = 0;
        for (int k = 0; k < ndrops && !drop; k++) drop = el_starts(seg, sn, drops[k], drop_lens[k]);
        if (!drop) {
            memcpy(o + w, seg, (size_t)sn);
            w += sn;
            if (!last) o[w++] = 0x02;
        }
        if (last) break;
        i += sn + 1;
    }
    long qid = 0;
    if (rq != NULL && rqn > 0) {
        int bad = rqn > 9;
        for (Py_ssize_t k = 0; k < rqn && !bad; k++) {
            if (rq[k] < '0' || rq[k] > '9') bad = 1;
            else qid = qid * 10 + (rq[k] - '0');
        }
        if (bad) {
            if (o != small) PyMem_Free(o);
            Py_RETURN_NONE;
        }
    }
    if (w > 0 && o[w - 1] != 0x02) o[w++] = 0x02;
    memcpy(o + w, entry, sizeof entry - 1);
    w += (Py_ssize_t)(sizeof entry - 1);
    memcpy(o + w, qtext, (size_t)qn);
    w += qn;
    o[w++] = 0x02;
    PyObject *out = PyUnicode_FromStringAndSize(o, w);
    PyObject *topic = out != NULL ? PyUnicode_FromStringAndSize(rt != NULL ? rt : "", rt != NULL ? rtn : 0) : NULL;
    if (o != small) PyMem_Free(o);
    if (topic == NULL) {
        Py_XDECREF(out);
        return NULL;
    }
    return Py_BuildValue("(NNl)", out, topic, qid);
}

/* end_props_dict(props) -> dict | None: string_to_properties(props) (the half's `properties`, in C):
 * each 0x02-separated segment with a 0x01 at index i, 0 < i < len - 1, sets name -> value (a later one
 * wins). ASCII strings only. */
static PyObject *end_props_dict(PyObject *self, PyObject *arg) {
    if (!PyUnicode_CheckExact(arg) || !PyUnicode_IS_ASCII(arg)) Py_RETURN_NONE;
    const char *s = (const char *)PyUnicode_DATA(arg);
    Py_ssize_t n = PyUnicode_GET_LENGTH(arg);
    PyObject *d = PyDict_New();
    if (d == NULL || n == 0) return d;
    Py_ssize_t i = 0;
    for (;;) {
        const char *seg = s + i;
        const char *sep = memchr(seg, 0x02, (size_t)(n - i));
        Py_ssize_t sn = sep != NULL ? sep - seg : n - i;
        const char *eq = memchr(seg, 0x01, (size_t)sn);
        if (eq != NULL && eq > seg && eq - seg < sn - 1) {
            PyObject *k = PyUnicode_FromStringAndSize(seg, eq - seg);
            PyObject *v = k != NULL ? PyUnicode_FromStringAndSize(eq + 1, sn - (eq - seg) - 1) : NULL;
            if (v == NULL || PyDict_SetItem(d, k, v) < 0) {
                Py_XDECREF(k);
                Py_XDECREF(v);
                Py_DECREF(d);
                return NULL;
            }
            Py_DECREF(k);
            Py_DECREF(v);
        }
        if (sep == NULL) break;
        i += sn + 1;
    }
    return d;
}
/* end_index_have(mm, size, slot_num, count, begin_ts, entries_base, keys, found) -> left | None:
 * IndexService.have_candidates' walk of one index file: for each keys[i] (the indexed `topic#key` str) whose
 * found[i] is False, whether the file holds an entry with its key hash (IndexFile.select_by_hash with
 * max_num 1 and the time range [0, 2**62]); found[i] set True for those (written only at the end), and the
 * count of keys still not found returned. None (nothing changed) for what it does not take: a key with a
 * lone surrogate, a read past the buffer (the Python walk logs and stops there), odd sizes. */
static PyObject *end_index_have(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 || !PyList_CheckExact(args[6]) || !PyList_CheckExact(args[7])) Py_RETURN_NONE;
    long long size = PyLong_AsLongLong(args[1]), slot_num = PyLong_AsLongLong(args[2]);
    long long count = PyLong_AsLongLong(args[3]), begin_ts = PyLong_AsLongLong(args[4]);
    long long base = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *keys = args[6], *found = args[7];
    Py_ssize_t nk = PyList_GET_SIZE(keys);
    if (nk != PyList_GET_SIZE(found) || nk > 64 || slot_num <= 0 || size < 0 || base < 0 || count > INT32_MAX ||
        begin_ts < -(1LL << 60) || begin_ts > (1LL << 60))
        Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    const unsigned char *mm = (const unsigned char *)view.buf;
    long long mlen = (long long)view.len;
    int hit[64];
    Py_ssize_t left = 0;
    int declined = 0;
    for (Py_ssize_t i = 0; i < nk && !declined; i++) {
        hit[i] = 0;
        PyObject *f = PyList_GET_ITEM(found, i);
        if (f == Py_True) continue;
        if (f != Py_False) { declined = 1; break; }
        PyObject *k = PyList_GET_ITEM(keys, i);
        uint32_t h32 = 0;
        if (!PyUnicode_CheckExact(k) || java_hash_append(k, 0, PyUnicode_GET_LENGTH(k), &h32) < 0) {
            declined = 1;
            break;
        }
        long long key_hash = index_hash(h32);
        long long slot_pos = 40 + (key_hash % slot_num) * 4;  /* INDEX_HEADER_SIZE, HASH_SLOT_SIZE */
        if (slot_pos + 4 <= size) {
            if (slot_pos + 4 > mlen) { declined = 1; break; }
            long long slot_value = get_i32(mm + slot_pos);
            if (!(slot_value <= 0 || slot_value > count || count <= 1)) {
                long long nxt = slot_value;
                for (long long step = 0; step < count; step++) {
                    long long pos = base + nxt * 20;  /* INDEX_SIZE */
                    if (pos + 20 > size) break;
                    if (pos + 20 > mlen) { declined = 1; break; }
                    int32_t eh = get_i32(mm + pos);
                    int32_t time_diff = get_i32(mm + pos + 12);
                    long long prev = get_i32(mm + pos + 16);
                    if (time_diff < 0) break;
                    long long time_read = begin_ts + (long long)time_diff * 1000;
                    if (eh == key_hash && time_read >= 0 && time_read <= (1LL << 62)) {
                        hit[i] = 1;
                        break;
                    }
                    if (prev <= 0 || prev > count || prev == nxt || time_read < 0) break;
                    nxt = prev;
                }
            }
        }
        if (!hit[i]) left++;
    }
    PyBuffer_Release(&view);
    if (declined) Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < nk; i++)
        if (hit[i]) {
            Py_INCREF(Py_True);
            if (PyList_SetItem(found, i, Py_True) < 0) return NULL;
        }
    return PyLong_FromSsize_t(left);
}
/* ============================ end of THE END LANE ==================================================== */

/* ============================================================================================== */
/* THE SEND CORE (issue "speed", branch send-core2): append_one_net's record and request for its one   */
/*  message, without encode_network_run's batch scaffolding.                                           */
/*  sc_append_net(sp, msg, nc, netctx, &result): what append_one_net did with                          */
/*  encode_network_run((msg,), table, base, now, *netctx) and the (data, [request], [offset], [uniq],   */
/*  {key: q + 1}, q) it returned: the same checks in the same order (declining, 0, where it declined),  */
/*  the same request tuple, the same record bytes, but written straight into the file's write view (no */
/*  record bytes object, no lists, no dict, no queue-table look-up: single_locate found the queue      */
/*  offset). Then single_publish, as before. The message's checks, record and request are the network  */
/*  encoder's own per-message steps (net_read, net_write, net_request, shared with encode_network_run: */
/*  the born host through net_parse_host's one-entry cache, TAGS / KEYS / UNIQ_KEY in one pass,        */
/*  the CRCs by vf_crc32).                                                                             */
/*  Returns 1 (*result set), 0 (declined, nothing written), -1 (error).                                */
/*  Edits elsewhere: THE NETWORK SINGLE PUT's append_one_net calls it (its encode_network_run call).   */
/*  Reference: CommitLog._append_one_net_py (tests/test_single_put_net.py, tests/test_send_core_net.py). */
/* ============================================================================================== */

static int sc_append_net(single_put *sp, PyObject *m, const net_ctx *ctx, PyObject *netctx, PyObject **result) {
    *result = NULL;
    const int64_t now = sp->now, base = sp->base;
    if (ctx->addr_len != 4 && ctx->addr_len != 16) return 0;
    if (!PyType_IsSubtype((PyTypeObject *)ctx->request_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "request type must be a tuple");
        return -1;
    }
    net_rec rec, *r = &rec;
    memset(r, 0, sizeof rec);
    if (!net_read(m, ctx, now, r)) return 0;  /* encode_network_run's checks of one message, in its order */
    Py_ssize_t total = r->total;
    /* the queue offset: single_locate's table[f"{topic}-{qid}"] (the batch read the same entry, and took it only
     * below INT64_MAX - 1 - n) */
    if (sp->q > INT64_MAX - 2) return 0;
    r->q = sp->q;
    if (base < 0 || base > INT64_MAX - total) return 0;
    PyObject *req = net_request(r, ctx, sp->base_obj, sp->now_obj, NULL);
    if (req == NULL) return -1;
    /* append_one_net's fit: before the file's last 8 bytes, and in its write view */
    if (total > sp->file_size - sp->pos - 8) { Py_DECREF(req); return 0; }
    Py_buffer dst;
    int got = single_view(sp, total, &dst);
    if (got <= 0) { Py_DECREF(req); return got; }
    net_write((unsigned char *)dst.buf + sp->pos, r, base, now, ctx);  /* the record, at the write position */
    PyBuffer_Release(&dst);
    *result = single_publish(sp, req, total, PyTuple_GET_ITEM(netctx, 1), PyTuple_GET_ITEM(netctx, 2));
    Py_DECREF(req);
    return *result == NULL ? -1 : 1;
}
/* ============================ end of THE SEND CORE ================================================== */

/* ============================ THE END FRAME (branch end-lane2) ====================================== */
/* A one-way END_TRANSACTION COMMIT / ROLLBACK served from the bytes read, in one C call (issue "speed").  */
/*  end_frame(data, pos, (ctx, hold, max_frame, max_header, buffered)) -> int | None: the frame at `pos`  */
/*  of `data` read as send_frame reads a SEND_MESSAGE_V2 (a subset of what the C frame decoder takes: a   */
/*  JSON header of the plain shape, extFields of strings with plain ASCII keys; a header that does not   */
/*  begin with `{"code":37,` is not read further), then what EndTransactionProcessor.process(wait=False) */
/*  does for it, through                                                                                 */
/*  TransactionalMessageService.half_message, end, _decide, _outcome, _commit_message, _put_op and        */
/*  _remember: the half read from the commitlog's current file, its checks, the look for an earlier end  */
/*  (the recent ends, then each index file's walk, end_index_have), hold() (the server's dispatch hold,   */
/*  before the first put), the commit record (COMMIT) and the op record put by store.put_message as the  */
/*  Python builds them, the ends remembered. Returns the position after the frame when it served it;     */
/*  None, having changed nothing, for anything else: a two-way END or a response, another code, an odd   */
/*  header value (escapes in the fields it reads, numbers that are not plain decimal text, a missing      */
/*  field), commitOrRollback not 8 or 12, the decoder holding part of a frame, a half that is not in the  */
/*  current file or not a plain V1 record with IPv4 hosts and ASCII properties, a producer group or queue */
/*  offset that does not match (the refusals and their log lines stay Python's), UNIQ_KEY, PGROUP or      */
/*  REAL_TOPIC missing, empty or given twice, a STREAM_ID, the dispatcher behind the broker's start, the  */
/*  service's lock busy, an end already remembered, an index that may hold an earlier end (or a walk      */
/*  end_index_have declines), properties end_commit_props declines, a service that is not the stock one. */
/*  The caller then decodes the frame and `handle` serves it as before (process_now, or a thread).        */
/*  An op put that is not OK calls service._op_written (its warning); an error (NULL) leaves the service's */
/*  lock released and whatever the Python path would have left at the same step.                         */
/*  ctx = EndTransactionProcessor.frame_context(): (broker, TransactionalMessageService, half topic, op   */
/*  topic, check-max topic, COMMIT, ROLLBACK, REMOVE_TAG, the service module's globals, OrderedDict).     */
/*  Reference: EndTransactionProcessor.process (tests/test_end_lane.py: twin brokers, byte for byte).     */
/* ============================================================================================== */
enum { EFN_TX_SERVICE, EFN_STORE, EFN_SHUTDOWN, EFN_LOADED, EFN_COMMIT_LOG, EFN_MFQ, EFN_FILES, EFN_TRANSIENT,
       EFN_WROTE, EFN_FROM, EFN_VIEW, EFN_CONFIG, EFN_PROP_CRC, EFN_REPUT, EFN_DISPATCHED, EFN_BOOT, EFN_LOCK,
       EFN_RECENT, EFN_INDEX, EFN_IFILES, EFN_MM, EFN_MAPPED_SIZE, EFN_SLOT_NUM, EFN_COUNT, EFN_BEGIN_TS,
       EFN_ENTRIES_BASE, EFN_PUT, EFN_MOVE_TO_END, EFN_POPITEM, EFN_RECENT_ENDS, EFN_OP_WRITTEN, EFN_IS_OK,
       EFN_ACQUIRE, EFN_RELEASE, EFN_NAMES };
static const char *ef_texts[EFN_NAMES] = {
    "transaction_service", "store", "_shutdown", "_loaded", "commit_log", "mapped_file_queue", "mapped_files",
    "transient", "wrote_position", "file_from_offset", "view", "config", "enabled_append_prop_crc",
    "reput_message_service", "dispatched_offset", "_boot_offset", "_lock", "_recent", "index_service", "_files", "mm",
    "mapped_size", "hash_slot_num", "_index_count", "_begin_timestamp", "_entries_base", "put_message",
    "move_to_end", "popitem", "RECENT_ENDS", "_op_written", "is_ok", "acquire", "release",
};
static PyObject *ef_names[EFN_NAMES];
enum { EFC_BROKER, EFC_SERVICE_TYPE, EFC_HALF_TOPIC, EFC_OP_TOPIC, EFC_CHECK_TOPIC, EFC_COMMIT, EFC_ROLLBACK, EFC_TAG,
       EFC_GLOBALS, EFC_ODICT, EFC_COUNT };

static int ef_init(void) {
    if (ef_names[EFN_NAMES - 1] != NULL) return 0;
    for (int i = 0; i < EFN_NAMES; i++) {
        PyObject *n = PyUnicode_InternFromString(ef_texts[i]);
        if (n == NULL) return -1;
        ef_names[i] = n;
    }
    return 0;
}

/* the plain text of an extFields value it reads (ASCII, no escape), as a span; absent: present 0 */
typedef struct { const unsigned char *p; Py_ssize_t n; int present, plain; } ef_span;
enum { EFF_KIND, EFF_GROUP, EFF_CLO, EFF_TSO, EFF_FIELDS };

/* the properties the lane reads, by dict semantics (string_to_properties: a segment's name is up to its first
 * 0x01, a later segment wins, an empty name or value is no entry); `count` counts the segments naming it */
enum { EFP_UNIQ, EFP_PGROUP, EFP_STREAM, EFP_REAL_TOPIC, EFP_COUNT };
typedef struct { const char *v; Py_ssize_t n; int count; } ef_prop;

static void ef_props(const char *s, Py_ssize_t n, ef_prop *out) {
    static const char *names[EFP_COUNT] = {"UNIQ_KEY", "PGROUP", "STREAM_ID", "REAL_TOPIC"};
    static const Py_ssize_t lens[EFP_COUNT] = {8, 6, 9, 10};
    memset(out, 0, sizeof(ef_prop) * EFP_COUNT);
    if (n == 0) return;
    Py_ssize_t i = 0;
    for (;;) {
        const char *seg = s + i;
        const char *sep = memchr(seg, 0x02, (size_t)(n - i));
        Py_ssize_t sn = sep != NULL ? sep - seg : n - i;
        const char *eq = memchr(seg, 0x01, (size_t)sn);
        if (eq != NULL) {
            Py_ssize_t kn = eq - seg;
            for (int k = 0; k < EFP_COUNT; k++)
                if (kn == lens[k] && memcmp(seg, names[k], (size_t)kn) == 0) {
                    out[k].count++;
                    out[k].v = eq + 1;
                    out[k].n = sn - kn - 1;
                }
        }
        if (sep == NULL) break;
        i += sn + 1;
    }
}

/* `lock`.acquire(blocking=False) without a method call when its layout is known (fl_check): 1 taken, 0 busy */
static int ef_try_lock(PyObject *lock) {
    fl_check();
#ifdef FL_LAYOUT
    if (fl_lock_type != NULL && Py_TYPE(lock) == fl_lock_type) {
        fl_lockobject *l = (fl_lockobject *)lock;
        if (PyThread_acquire_lock(l->lock_lock, NOWAIT_LOCK) == 1) {
            l->locked = 1;
            return 1;
        }
        return 0;
    }
#endif
    PyObject *r = PyObject_CallMethodOneArg(lock, ef_names[EFN_ACQUIRE], Py_False);
    if (r == NULL) return -1;
    int got = PyObject_IsTrue(r);
    Py_DECREF(r);
    return got;
}

/* PutMessageResult.is_ok(): 1 / 0, -1 error */
static int ef_is_ok(PyObject *r) {
    if (pmr_type != NULL && Py_TYPE(r) == pmr_type && amr_type != NULL) {
        PyObject *a = *(PyObject **)((char *)r + pmr_off[1]);
        if (a == Py_None) return 0;
        if (a != NULL && Py_TYPE(a) == amr_type && *(PyObject **)((char *)a + amr_off[A_STATUS]) == amr_ok) return 1;
    }
    PyObject *v = PyObject_CallMethodNoArgs(r, ef_names[EFN_IS_OK]);
    if (v == NULL) return -1;
    int ok = PyObject_IsTrue(v);
    Py_DECREF(v);
    return ok;
}

/* TransactionalMessageService._remember(txid, outcome, op_written) */
static int ef_remember(PyObject *recent, PyObject *txid, PyObject *outcome, int op_written, PyObject *globals) {
    PyObject *t = PyTuple_Pack(2, outcome, op_written ? Py_True : Py_False);
    if (t == NULL) return -1;
    int rc = PyObject_SetItem(recent, txid, t);
    Py_DECREF(t);
    if (rc < 0) return -1;
    PyObject *r = PyObject_CallMethodOneArg(recent, ef_names[EFN_MOVE_TO_END], txid);
    if (r == NULL) return -1;
    Py_DECREF(r);
    PyObject *limit_obj = PyDict_GetItemWithError(globals, ef_names[EFN_RECENT_ENDS]);  /* borrowed */
    if (limit_obj == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "end_frame: RECENT_ENDS is gone");
        return -1;
    }
    for (;;) {  /* while len(_recent) > RECENT_ENDS: popitem(last=False) */
        Py_ssize_t size = PyObject_Size(recent);
        if (size < 0) return -1;
        PyObject *size_obj = PyLong_FromSsize_t(size);
        if (size_obj == NULL) return -1;
        int over = PyObject_RichCompareBool(size_obj, limit_obj, Py_GT);
        Py_DECREF(size_obj);
        if (over <= 0) return over;
        r = PyObject_CallMethodOneArg(recent, ef_names[EFN_POPITEM], Py_False);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
}

/* a Message made in its slots (fv: new references, taken) */
static PyObject *ef_message(PyObject **fv) {
    for (int f = 0; f < F_COUNT; f++)
        if (fv[f] == NULL) {
            for (int g = 0; g < F_COUNT; g++) Py_XDECREF(fv[g]);
            return NULL;
        }
    PyObject *m = message_type->tp_alloc(message_type, 0);
    if (m == NULL) {
        for (int g = 0; g < F_COUNT; g++) Py_DECREF(fv[g]);
        return NULL;
    }
    for (int f = 0; f < F_COUNT; f++) *(PyObject **)((char *)m + field_offsets[f]) = fv[f];
    return m;
}

/* "topic#txid" (ASCII both) */
static PyObject *ef_key(PyObject *topic, const char *tx, Py_ssize_t txn) {
    Py_ssize_t tn = PyUnicode_GET_LENGTH(topic);
    PyObject *k = PyUnicode_New(tn + 1 + txn, 127);
    if (k == NULL) return NULL;
    Py_UCS1 *w = PyUnicode_1BYTE_DATA(k);
    memcpy(w, PyUnicode_1BYTE_DATA(topic), (size_t)tn);
    w[tn] = '#';
    memcpy(w + tn + 1, tx, (size_t)txn);
    return k;
}

/* 1 when the (real) store answers the END; 0 decline; -1 error. The step-by-step state lives in `ef_state`. */
typedef struct {
    PyObject *service, *store, *cl, *mfq, *files, *mf, *view_obj, *lock, *recent, *reput, *index, *ifiles;
    Py_buffer view;
    int have_view, locked;
} ef_state;

static void ef_clear(ef_state *s) {
    if (s->have_view) PyBuffer_Release(&s->view);
    if (s->locked) {
        PyObject *exc_type, *exc, *tb;
        PyErr_Fetch(&exc_type, &exc, &tb);
        if (fl_release(s->lock) < 0) PyErr_Clear();  /* taken by ef_try_lock: fl_release's own type test */
        PyErr_Restore(exc_type, exc, tb);
    }
    Py_XDECREF(s->service); Py_XDECREF(s->store); Py_XDECREF(s->cl); Py_XDECREF(s->mfq); Py_XDECREF(s->files);
    Py_XDECREF(s->mf); Py_XDECREF(s->view_obj); Py_XDECREF(s->lock); Py_XDECREF(s->recent); Py_XDECREF(s->reput);
    Py_XDECREF(s->index); Py_XDECREF(s->ifiles);
}

/* the index's look for an earlier end (IndexService.have_candidates of the three keys, newest file first):
 * 1 none may exist, 0 one may (or the walk declined), -1 error */
static int ef_index_clear(ef_state *s, PyObject *keys) {
    s->index = PyObject_GetAttr(s->store, ef_names[EFN_INDEX]);
    if (s->index == NULL) return -1;
    s->ifiles = sf_get_any(s->index, ef_names[EFN_IFILES]);  /* a snapshot under the GIL (`files` copies it under its lock) */
    if (s->ifiles == NULL) return -1;
    if (!PyList_CheckExact(s->ifiles)) return 0;
    PyObject *found = PyList_New(3);
    if (found == NULL) return -1;
    for (int i = 0; i < 3; i++) PyList_SET_ITEM(found, i, Py_NewRef(Py_False));
    int res = 1;
    for (Py_ssize_t i = PyList_GET_SIZE(s->ifiles) - 1; i >= 0 && res == 1; i--) {
        PyObject *f = PyList_GET_ITEM(s->ifiles, i);
        Py_INCREF(f);
        PyObject *a[8] = {sf_get_any(f, ef_names[EFN_MM]), NULL, NULL, NULL, NULL, NULL, keys, found};
        if (a[0] == NULL) { Py_DECREF(f); res = -1; break; }
        if (a[0] != Py_None) {
            a[1] = PyObject_GetAttr(f, ef_names[EFN_MAPPED_SIZE]);
            a[2] = a[1] ? sf_get_any(f, ef_names[EFN_SLOT_NUM]) : NULL;
            a[3] = a[2] ? sf_get_any(f, ef_names[EFN_COUNT]) : NULL;
            a[4] = a[3] ? sf_get_any(f, ef_names[EFN_BEGIN_TS]) : NULL;
            a[5] = a[4] ? sf_get_any(f, ef_names[EFN_ENTRIES_BASE]) : NULL;
            if (a[5] == NULL) res = -1;
            else {
                PyObject *left = end_index_have(NULL, a, 8);
                if (left == NULL) res = -1;
                else {
                    if (left == Py_None || PyLong_AsLong(left) != 3) res = 0;  /* declined, or one may exist */
                    Py_DECREF(left);
                }
            }
        }
        for (int k = 0; k < 6; k++) Py_XDECREF(a[k]);
        Py_DECREF(f);
    }
    Py_DECREF(found);
    if (res == 0 && PyErr_Occurred()) PyErr_Clear();
    return res;
}

static PyObject *end_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyBytes_CheckExact(args[0]) || !PyTuple_CheckExact(args[2]) || PyTuple_GET_SIZE(args[2]) != 5 ||
        !PyByteArray_Check(PyTuple_GET_ITEM(args[2], 4)) || !PyTuple_CheckExact(PyTuple_GET_ITEM(args[2], 0)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(args[2], 0)) != EFC_COUNT) {
        PyErr_SetString(PyExc_TypeError, "end_frame(data, pos, (ctx, hold, max_frame, max_header, buffered))");
        return NULL;
    }
    PyObject *data = args[0], *fctx = args[2], *ctx = PyTuple_GET_ITEM(fctx, 0);
    Py_ssize_t at = PyLong_AsSsize_t(args[1]);
    if (at == -1 && PyErr_Occurred()) return NULL;
    Py_ssize_t n = PyBytes_GET_SIZE(data);
    if (at < 0 || n - at < 24) Py_RETURN_NONE;
    const unsigned char *base = (const unsigned char *)PyBytes_AS_STRING(data) + at;
    /* the code is the header's first member in every peer's frames (as ack_frame reads them): others at once */
    if (memcmp(base + 8, "{\"code\":37,", 11) != 0) Py_RETURN_NONE;
    if (ef_init() < 0) return NULL;
    if (PyByteArray_GET_SIZE(PyTuple_GET_ITEM(fctx, 4)) != 0 || message_type == NULL)
        Py_RETURN_NONE;  /* the decoder holds part of a frame: its read */
    Py_ssize_t max_frame = PyLong_AsSsize_t(PyTuple_GET_ITEM(fctx, 2)), max_header = PyLong_AsSsize_t(PyTuple_GET_ITEM(fctx, 3));
    if ((max_frame == -1 || max_header == -1) && PyErr_Occurred()) return NULL;
    int32_t length = get_i32(base), word = get_i32(base + 4);
    Py_ssize_t hlen = word & 0xFFFFFF;
    if (length < 4 || length > max_frame || hlen > max_header || hlen > length - 4 || hlen <= 0 ||
        ((word >> 24) & 0xFF) != 0 || n - at < 4 + (Py_ssize_t)length)
        Py_RETURN_NONE;  /* not a whole JSON frame: the decoder's */
    Py_ssize_t frame_end = at + 4 + (Py_ssize_t)length;
    const unsigned char *h = base + 8;
    jcur c = {h, h + hlen};
    long long code = 0, flag = 0, opaque = 0, version = 0;
    int have_code = 0;
    ef_span fs[EFF_FIELDS];
    memset(fs, 0, sizeof fs);
    /* the header object, as send_frame reads it, keeping the four extFields the END reads */
    if (hlen < 2 || *c.p != '{') Py_RETURN_NONE;
    c.p++;
    j_ws(&c);
    if (c.p < c.end && *c.p == '}') Py_RETURN_NONE;
    for (;;) {
        const unsigned char *k;
        Py_ssize_t kn;
        if (j_member(&c, &k, &kn) != J_OK) goto give_way;
        long long *iv = j_header_int(k, kn, &code, &opaque, &flag, &version);
        if (iv != NULL) {
            have_code |= iv == &code;
            if (j_int32(&c, iv) != J_OK) goto give_way;
            if (iv == &code && code != 37) Py_RETURN_NONE;  /* another request (code comes first): at once */
        } else if (key_is(k, kn, "language", 8) || key_is(k, kn, "remark", 6)) {
            if (*c.p != '"' || j_string(&c, NULL, 0) != J_OK) goto give_way;
        } else if (key_is(k, kn, "extFields", 9)) {
            if (*c.p != '{') Py_RETURN_NONE;
            memset(fs, 0, sizeof fs);  /* a new extFields object replaces an earlier one (json keeps the last) */
            c.p++;
            j_ws(&c);
            if (c.p < c.end && *c.p == '}') c.p++;
            else for (;;) {
                j_ws(&c);
                if (c.p >= c.end || *c.p != '"') Py_RETURN_NONE;
                const unsigned char *ek = c.p + 1, *q = ek;
                while (q < c.end && !j_scan[*q]) q++;  /* a plain ASCII key, else the decoder's */
                if (q >= c.end || *q != '"') Py_RETURN_NONE;
                Py_ssize_t ekn = q - ek;
                c.p = q + 1;
                j_ws(&c);
                if (c.p >= c.end || *c.p != ':') Py_RETURN_NONE;
                c.p++;
                j_ws(&c);
                if (c.p >= c.end || *c.p != '"') Py_RETURN_NONE;  /* a value not a string: the decoder's */
                int slot = key_is(ek, ekn, "commitOrRollback", 16) ? EFF_KIND
                           : key_is(ek, ekn, "producerGroup", 13) ? EFF_GROUP
                           : key_is(ek, ekn, "commitLogOffset", 15) ? EFF_CLO
                           : key_is(ek, ekn, "tranStateTableOffset", 20) ? EFF_TSO : -1;
                const unsigned char *vs = c.p + 1;
                if (j_string(&c, NULL, 0) != J_OK) goto give_way;
                if (slot >= 0) {
                    Py_ssize_t vn = c.p - 1 - vs;
                    const unsigned char *z = vs;
                    while (z < vs + vn && !j_scan[*z]) z++;  /* plain ASCII, no escapes: its text as it is */
                    fs[slot].present = 1;
                    fs[slot].plain = z == vs + vn;
                    fs[slot].p = vs;
                    fs[slot].n = vn;
                }
                int more = j_next(&c);
                if (more > 0) continue;
                if (more == 0) break;
                Py_RETURN_NONE;
            }
        } else if (j_skip_value(&c) != J_OK) goto give_way;  /* another field: checked, not kept (as j_header) */
        int more = j_next(&c);
        if (more > 0) continue;
        if (more == 0) break;
        Py_RETURN_NONE;
    }
    j_ws(&c);
    if (c.p != c.end || !have_code || code != 37 || (flag & 3) != 2) Py_RETURN_NONE;  /* one-way END requests */
    /* the header's values as EndTransactionProcessor.process reads them (get_int / get_str) */
    long long kind, clo, tso = -1;
    for (int i = 0; i < EFF_FIELDS; i++)
        if (fs[i].present && !fs[i].plain) Py_RETURN_NONE;
    if (!fs[EFF_KIND].present || !sl_int_span((const char *)fs[EFF_KIND].p, fs[EFF_KIND].n, &kind) ||
        (kind != 8 && kind != 12) || !fs[EFF_GROUP].present || !fs[EFF_CLO].present ||
        !sl_int_span((const char *)fs[EFF_CLO].p, fs[EFF_CLO].n, &clo) || clo < 0)
        Py_RETURN_NONE;
    int check_tso = fs[EFF_TSO].present && fs[EFF_TSO].n > 0;  /* absent or "": None, no check */
    if (check_tso && !sl_int_span((const char *)fs[EFF_TSO].p, fs[EFF_TSO].n, &tso)) Py_RETURN_NONE;
    int commit = kind == 8;

    PyObject *broker = PyTuple_GET_ITEM(ctx, EFC_BROKER), *half_topic = PyTuple_GET_ITEM(ctx, EFC_HALF_TOPIC);
    PyObject *globals = PyTuple_GET_ITEM(ctx, EFC_GLOBALS);
    if (!PyUnicode_CheckExact(half_topic) || !PyUnicode_IS_ASCII(half_topic) || !PyDict_CheckExact(globals) ||
        !PyUnicode_CheckExact(PyTuple_GET_ITEM(ctx, EFC_OP_TOPIC)) || !PyUnicode_IS_ASCII(PyTuple_GET_ITEM(ctx, EFC_OP_TOPIC)) ||
        !PyUnicode_CheckExact(PyTuple_GET_ITEM(ctx, EFC_CHECK_TOPIC)) || !PyUnicode_IS_ASCII(PyTuple_GET_ITEM(ctx, EFC_CHECK_TOPIC)) ||
        !PyUnicode_CheckExact(PyTuple_GET_ITEM(ctx, EFC_TAG)) || !PyUnicode_IS_ASCII(PyTuple_GET_ITEM(ctx, EFC_TAG)))
        Py_RETURN_NONE;
    ef_state s;
    memset(&s, 0, sizeof s);
    PyObject *result = NULL, *props = NULL, *txid = NULL, *done = NULL, *keys = NULL, *body = NULL, *host = NULL;
    PyObject *r = NULL, *cmsg = NULL, *omsg = NULL;
    int got;
    /* half_message: the service's store (MessageStore._read: running, loaded), the record in the current file */
    s.service = PyObject_GetAttr(broker, ef_names[EFN_TX_SERVICE]);
    if (s.service == NULL) goto error;
    if ((PyObject *)Py_TYPE(s.service) != PyTuple_GET_ITEM(ctx, EFC_SERVICE_TYPE)) goto decline;
    s.store = PyObject_GetAttr(s.service, ef_names[EFN_STORE]);
    if (s.store == NULL) goto error;
    {
        PyObject *sd = PyObject_GetAttr(s.store, ef_names[EFN_SHUTDOWN]);
        if (sd == NULL) goto error;
        PyObject *ld = PyObject_GetAttr(s.store, ef_names[EFN_LOADED]);
        if (ld == NULL) { Py_DECREF(sd); goto error; }
        int running = sd == Py_False && ld == Py_True;
        Py_DECREF(sd); Py_DECREF(ld);
        if (!running) goto decline;
    }
    s.cl = PyObject_GetAttr(s.store, ef_names[EFN_COMMIT_LOG]);
    if (s.cl == NULL || (s.mfq = sf_get_any(s.cl, ef_names[EFN_MFQ])) == NULL ||
        (s.files = sf_get_any(s.mfq, ef_names[EFN_FILES])) == NULL)
        goto error;
    if (!PyList_CheckExact(s.files) || PyList_GET_SIZE(s.files) == 0) goto decline;
    s.mf = Py_NewRef(PyList_GET_ITEM(s.files, PyList_GET_SIZE(s.files) - 1));
    int64_t from, wrote;
    {
        PyObject *tr = sf_get_any(s.mf, ef_names[EFN_TRANSIENT]);
        if (tr == NULL) goto error;
        int plain_file = tr == Py_False;
        Py_DECREF(tr);
        if (!plain_file) goto decline;  /* a write buffer: readers see committed bytes only, the Python's */
    }
    if ((got = single_attr_i64(s.mf, ef_names[EFN_FROM], 0, INT64_MAX / 2, &from)) <= 0 ||
        (got = single_attr_i64(s.mf, ef_names[EFN_WROTE], 0, INT32_MAX, &wrote)) <= 0)
        goto step;
    if (clo < from || clo - from >= wrote) goto decline;  /* not in the current file's readable bytes */
    s.view_obj = PyObject_GetAttr(s.mf, ef_names[EFN_VIEW]);
    if (s.view_obj == NULL) goto error;
    if (PyObject_GetBuffer(s.view_obj, &s.view, PyBUF_SIMPLE) < 0) { PyErr_Clear(); goto decline; }  /* destroyed */
    s.have_view = 1;
    if (s.view.len < wrote) goto decline;
    /* the record as look_message_by_offset's C path reads it (decode_records_c over its `total` bytes), the
     * plain V1 / IPv4 kind only; then the fields the end uses */
    const unsigned char *rec = (const unsigned char *)s.view.buf + (clo - from);
    Py_ssize_t avail = (Py_ssize_t)(wrote - (clo - from));
    if (avail < 4) goto decline;
    int32_t total = get_i32(rec);
    if (total <= 8 || total > avail || total < 88 + 4) goto decline;
    int32_t sys_flag = get_i32(rec + 36);
    if (get_i32(rec + 4) != REC_MAGIC_V1 || (sys_flag & (SF_BORN_V6 | SF_STORE_V6))) goto decline;
    int32_t body_len = get_i32(rec + 84);
    if (body_len < 0 || (Py_ssize_t)88 + body_len + 4 > total) goto decline;
    Py_ssize_t tpos = 88 + (Py_ssize_t)body_len, tl = rec[tpos];
    tpos += 1;
    if (tl > 127 || tpos + tl + 2 > total) goto decline;
    Py_ssize_t ppos = tpos + tl, pl = get_i16(rec + ppos);
    ppos += 2;
    if (pl < 0 || ppos + pl != total) goto decline;
    if (tl != PyUnicode_GET_LENGTH(half_topic) || memcmp(rec + tpos, PyUnicode_1BYTE_DATA(half_topic), (size_t)tl) != 0)
        goto decline;  /* not a half message: Python refuses it */
    const char *ps = (const char *)rec + ppos;
    for (Py_ssize_t i = 0; i < pl; i++)
        if ((unsigned char)ps[i] >= 0x80) goto decline;
    int64_t queue_offset = get_i64(rec + 20), phys = get_i64(rec + 28), born_ts = get_i64(rec + 40);
    int32_t queue_id = get_i32(rec + 12), hflag = get_i32(rec + 16), born_port = get_i32(rec + 52);
    int32_t reconsume = get_i32(rec + 72);
    if (phys != clo) goto decline;
    ef_prop pp[EFP_COUNT];
    ef_props(ps, pl, pp);
    if (pp[EFP_UNIQ].count != 1 || pp[EFP_UNIQ].n == 0 || pp[EFP_PGROUP].count != 1 || pp[EFP_PGROUP].n == 0 ||
        pp[EFP_STREAM].count != 0 ||
        pp[EFP_REAL_TOPIC].count != 1 || pp[EFP_REAL_TOPIC].n == 0)
        goto decline;
    /* half_message's checks: the producer group, the queue offset */
    if (pp[EFP_PGROUP].n != fs[EFF_GROUP].n || memcmp(pp[EFP_PGROUP].v, fs[EFF_GROUP].p, (size_t)fs[EFF_GROUP].n) != 0 ||
        (check_tso && tso != queue_offset))
        goto decline;
    /* what the end writes, made before anything changes */
    props = PyUnicode_DecodeASCII(ps, pl, NULL);
    txid = props != NULL ? PyUnicode_DecodeASCII(pp[EFP_UNIQ].v, pp[EFP_UNIQ].n, NULL) : NULL;
    if (txid == NULL) goto error;
    if (commit) {
        PyObject *cfg = PyObject_GetAttr(s.store, ef_names[EFN_CONFIG]);
        PyObject *crc = cfg != NULL ? PyObject_GetAttr(cfg, ef_names[EFN_PROP_CRC]) : NULL;
        Py_XDECREF(cfg);
        if (crc == NULL) goto error;
        PyObject *qo = PyLong_FromLongLong(queue_offset);
        if (qo == NULL) { Py_DECREF(crc); goto error; }
        PyObject *cargs[3] = {props, qo, crc};
        done = end_commit_props(NULL, cargs, 3);
        Py_DECREF(qo); Py_DECREF(crc);
        if (done == NULL) goto error;
        if (done == Py_None) goto decline;  /* an odd REAL_QID: Python's */
        /* format_host of an IPv4 address: "a.b.c.d:port" */
        char hb[48], *w = hb, t[24];
        for (int k = 0; k < 4; k++) {
            const char *d = sl_digits(t + sizeof t, rec[48 + k]);
            memcpy(w, d, (size_t)(t + sizeof t - d));
            w += t + sizeof t - d;
            *w++ = k < 3 ? '.' : ':';
        }
        const char *d = sl_digits(t + sizeof t, born_port);
        memcpy(w, d, (size_t)(t + sizeof t - d));
        w += t + sizeof t - d;
        body = PyBytes_FromStringAndSize((const char *)rec + 88, body_len);
        host = body != NULL ? PyUnicode_DecodeASCII(hb, w - hb, NULL) : NULL;
        if (host == NULL) goto error;
    }
    keys = PyList_New(3);
    if (keys == NULL) goto error;
    {
        PyObject *rt = PyUnicode_DecodeASCII(pp[EFP_REAL_TOPIC].v, pp[EFP_REAL_TOPIC].n, NULL);
        if (rt == NULL) goto error;
        PyObject *k0 = ef_key(PyTuple_GET_ITEM(ctx, EFC_OP_TOPIC), pp[EFP_UNIQ].v, pp[EFP_UNIQ].n);
        PyObject *k1 = ef_key(rt, pp[EFP_UNIQ].v, pp[EFP_UNIQ].n);
        PyObject *k2 = ef_key(PyTuple_GET_ITEM(ctx, EFC_CHECK_TOPIC), pp[EFP_UNIQ].v, pp[EFP_UNIQ].n);
        Py_DECREF(rt);
        PyList_SET_ITEM(keys, 0, k0); PyList_SET_ITEM(keys, 1, k1); PyList_SET_ITEM(keys, 2, k2);
        if (k0 == NULL || k1 == NULL || k2 == NULL) goto error;
    }
    PyBuffer_Release(&s.view);  /* everything read from the record is in objects now */
    s.have_view = 0;
    /* end(wait=False): the dispatcher past the records before this broker started, the lock free */
    s.reput = PyObject_GetAttr(s.store, ef_names[EFN_REPUT]);
    if (s.reput == NULL) goto error;
    {
        PyObject *disp = sf_get_any(s.reput, ef_names[EFN_DISPATCHED]);
        PyObject *boot = disp != NULL ? PyObject_GetAttr(s.service, ef_names[EFN_BOOT]) : NULL;
        int behind = boot != NULL ? PyObject_RichCompareBool(disp, boot, Py_LT) : -1;
        Py_XDECREF(disp); Py_XDECREF(boot);
        if (behind < 0) goto error;
        if (behind) goto decline;
    }
    s.recent = PyObject_GetAttr(s.service, ef_names[EFN_RECENT]);
    if (s.recent == NULL) goto error;
    if ((PyObject *)Py_TYPE(s.recent) != PyTuple_GET_ITEM(ctx, EFC_ODICT)) goto decline;
    s.lock = PyObject_GetAttr(s.service, ef_names[EFN_LOCK]);
    if (s.lock == NULL) goto error;
    got = ef_try_lock(s.lock);
    if (got < 0) goto error;
    if (got == 0) goto decline;
    s.locked = 1;
    /* _outcome: an end this broker remembers (even without its op message), or one the index may know */
    got = PyDict_Contains(s.recent, txid);
    if (got < 0) goto error;
    if (got) goto decline;
    got = ef_index_clear(&s, keys);
    if (got <= 0) goto step;
    /* _decide: the commit record (COMMIT), the end remembered, the op record */
    {
        PyObject *h = PyObject_CallNoArgs(PyTuple_GET_ITEM(fctx, 1));  /* served here from now on */
        if (h == NULL) goto error;
        Py_DECREF(h);
    }
    PyObject *outcome = PyTuple_GET_ITEM(ctx, commit ? EFC_COMMIT : EFC_ROLLBACK);
    if (commit) {
        PyObject *fv[F_COUNT] = {
            Py_NewRef(PyTuple_GET_ITEM(done, 1)), Py_NewRef(body), Py_NewRef(Py_None), Py_NewRef(Py_None),
            Py_NewRef(PyTuple_GET_ITEM(done, 2)), PyLong_FromLong(hflag), Py_NewRef(Py_None),
            PyLong_FromLong((sys_flag & ~0xC) | 0x8), PyLong_FromLongLong(born_ts), Py_NewRef(host),
            PyLong_FromLong(reconsume), PyLong_FromLongLong(phys), Py_NewRef(PyTuple_GET_ITEM(done, 0)),
            Py_NewRef(Py_None), Py_NewRef(Py_False)};
        cmsg = ef_message(fv);
        if (cmsg == NULL) goto error;
        PyObject *call[2] = {s.store, cmsg};
        r = PyObject_VectorcallMethod(ef_names[EFN_PUT], call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL) goto error;
        got = ef_is_ok(r);
        if (got < 0) goto error;
        Py_CLEAR(r);
        if (!got) goto served;  /* "commit failed": the answer a one-way END does not get; nothing remembered */
    }
    if (ef_remember(s.recent, txid, outcome, 0, globals) < 0) goto error;
    {
        char qb[24];
        const char *qd = sl_digits(qb + sizeof qb, queue_offset);  /* str(half.queue_offset).encode() */
        PyObject *keyl = PyList_New(1);
        if (keyl == NULL) goto error;
        PyList_SET_ITEM(keyl, 0, Py_NewRef(txid));
        /* op_properties_string(txid): TAGS then KEYS (txid is not empty) */
        PyObject *tag = PyTuple_GET_ITEM(ctx, EFC_TAG);
        Py_ssize_t tgn = PyUnicode_GET_LENGTH(tag), txn = PyUnicode_GET_LENGTH(txid);
        PyObject *ops = PyUnicode_New(5 + tgn + 6 + txn + 1, 127);
        if (ops != NULL) {
            Py_UCS1 *o = PyUnicode_1BYTE_DATA(ops);
            memcpy(o, "TAGS\x01", 5); o += 5;
            memcpy(o, PyUnicode_1BYTE_DATA(tag), (size_t)tgn); o += tgn;
            memcpy(o, "\x02KEYS\x01", 6); o += 6;
            memcpy(o, PyUnicode_1BYTE_DATA(txid), (size_t)txn); o += txn;
            *o = 2;
        }
        PyObject *fv[F_COUNT] = {
            Py_NewRef(PyTuple_GET_ITEM(ctx, EFC_OP_TOPIC)), PyBytes_FromStringAndSize(qd, qb + sizeof qb - qd),
            Py_NewRef(tag), keyl,
            PyLong_FromLong(queue_id), PyLong_FromLong(0), Py_NewRef(Py_None), PyLong_FromLong(0), PyLong_FromLong(0),
            Py_NewRef(Py_None), PyLong_FromLong(0), PyLong_FromLong(0), ops, Py_NewRef(Py_None), Py_NewRef(Py_False)};
        omsg = ef_message(fv);
        if (omsg == NULL) goto error;
        PyObject *call[2] = {s.store, omsg};
        r = PyObject_VectorcallMethod(ef_names[EFN_PUT], call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL) goto error;
        got = ef_is_ok(r);
        if (got < 0) goto error;
        if (got) {
            if (ef_remember(s.recent, txid, outcome, 1, globals) < 0) goto error;
        } else {  /* _op_written: its warning */
            PyObject *w[4] = {s.service, txid, outcome, r};
            PyObject *x = PyObject_VectorcallMethod(ef_names[EFN_OP_WRITTEN], w, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (x == NULL) goto error;
            Py_DECREF(x);
        }
    }
    /* the stream versions' release: nothing without a STREAM_ID */
served:
    result = PyLong_FromSsize_t(frame_end);
    goto out;
step:
    if (got < 0) goto error;
decline:
    result = Py_NewRef(Py_None);
    goto out;
give_way:
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
error:
    result = NULL;
out:
    ef_clear(&s);
    Py_XDECREF(props); Py_XDECREF(txid); Py_XDECREF(done); Py_XDECREF(keys); Py_XDECREF(body); Py_XDECREF(host);
    Py_XDECREF(r); Py_XDECREF(cmsg); Py_XDECREF(omsg);
    return result;
}
/* ============================ end of THE END FRAME ================================================== */
/* ============================================================================================== */
/* THE LONE CALLER (issue 16, branch pop-client): ClientConnection.invoke_frame's lone caller in    */
/* one C call (client/remoting_client.py; used by PopConsumer.pop and ack_batch).                   */
/*   client_lone_init  remoting_client's module dict (its _Pending, RCVTIMEO_SLACK / _STRETCH)       */
/*   client_lone       register the request and take the read role (one round of the connection's  */
/*                     lock), write the frame, make the first read, ask `take` about it and, when   */
/*                     it answers, drop the request and release the role (a second round): the     */
/*                     steps, reads and writes of invoke_frame's while_waiting=None path, in order. */
/* Before anything is done it declines (None) when the lock is busy or of another kind, the         */
/* connection closed or another caller reading: invoke_frame then does the whole request. After the */
/* write every other outcome goes to invoke_frame's own tails (_send_failed, _first_dispatch,        */
/* _finish, _lost), so errors, timeouts and hand-offs are the Python code's.                         */
/* ============================================================================================== */
#include <sys/socket.h>
#include <errno.h>

enum {
    LC_LOCK, LC_CLOSED, LC_BUSY, LC_PENDING, LC_SEND_LOCK, LC_SOCK, LC_RCVTIMEO, LC_RBUF, LC_DECODER, LC_BUF,
    LC_IDLE, LC_LAST, LC_HAND_ON, LC_FILENO, LC_SET_RCVTIMEO, LC_FINISH, LC_SEND_FAILED, LC_FIRST_DISPATCH,
    LC_LOST, LC_PENDING_CLS, LC_SLACK, LC_STRETCH, LC_N
};
static const char *const lc_names[LC_N] = {
    "_lock", "closed", "_reader_busy", "_pending", "_send_lock", "sock", "_rcvtimeo", "_rbuf", "_decoder", "_buf",
    "_idle_reading", "_last_read", "_hand_on", "fileno", "_set_rcvtimeo", "_finish", "_send_failed",
    "_first_dispatch", "_lost", "_Pending", "RCVTIMEO_SLACK", "RCVTIMEO_STRETCH",
};
static PyObject *lc_s[LC_N];
static PyObject *lc_globals;  /* remoting_client's module dict */

/* an exception taken out of the error indicator as one object (3.12's PyErr_GetRaisedException), NULL if none */
static PyObject *lc_fetch(void) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    if (t == NULL) return NULL;
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL && v != NULL) PyException_SetTraceback(v, tb);
    Py_DECREF(t);
    Py_XDECREF(tb);
    return v;
}
/* and put back (3.12's PyErr_SetRaisedException) */
static void lc_restore(PyObject *v) {
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(v)), v, PyException_GetTraceback(v));
}


/* time.monotonic(): CLOCK_MONOTONIC as CPython 3.11's _PyTime_AsSecondsDouble makes it a float */
static double lc_monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long long ns = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    if (ns % 1000000000LL == 0) return (double)(ns / 1000000000LL);
    double d = (double)ns;
    return d / 1e9;
}

/* CPython 3.11 / 3.12's _socket.socket begins {PyObject_HEAD; int sock_fd; int sock_family; int sock_type; int
 * sock_proto; PyObject *(*errorhandler)(void); _PyTime_t sock_timeout; ...}: the descriptor its calls use (-1
 * once closed) and its timeout (negative: blocking, 0: non-blocking; either way its calls make no poll), read in place after lc_sock_check proved
 * that layout on a socket of the running interpreter (fileno(), close(), settimeout() moving the fields as
 * expected); without it client_lone declines. */
typedef struct {
    PyObject_HEAD
    int sock_fd;
    int sock_family, sock_type, sock_proto;
    PyObject *(*errorhandler)(void);
    int64_t sock_timeout;
} lc_sockobject;
static PyTypeObject *lc_sock_type;  /* _socket.socket once its layout checked out */

static void lc_sock_check(void) {
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
    PyObject *mod = PyImport_ImportModule("_socket"), *tp = NULL, *so = NULL, *r = NULL;
    if (mod == NULL) goto out;
    tp = PyObject_GetAttrString(mod, "socket");
    if (tp == NULL || !PyType_Check(tp) || ((PyTypeObject *)tp)->tp_basicsize < (Py_ssize_t)sizeof(lc_sockobject))
        goto out;
    so = PyObject_CallFunction(tp, "ii", AF_INET, SOCK_STREAM);
    if (so == NULL) goto out;
    lc_sockobject *x = (lc_sockobject *)so;
    r = PyObject_CallMethod(so, "fileno", NULL);
    int ok = r != NULL && PyLong_AsLong(r) == x->sock_fd && x->sock_fd >= 0 && x->sock_family == AF_INET
             && x->sock_type == SOCK_STREAM && x->sock_timeout < 0;
    int64_t blocking = x->sock_timeout;
    Py_CLEAR(r);
    if (ok) {
        r = PyObject_CallMethod(so, "settimeout", "d", 2.5);
        ok = r != NULL && x->sock_timeout == 2500000000LL;
        Py_CLEAR(r);
        r = ok ? PyObject_CallMethod(so, "settimeout", "O", Py_None) : NULL;
        ok = r != NULL && x->sock_timeout == blocking;
        Py_CLEAR(r);
    }
    r = PyObject_CallMethod(so, "close", NULL);
    ok = ok && r != NULL && x->sock_fd == -1;
    if (ok) lc_sock_type = (PyTypeObject *)Py_NewRef(tp);
out:
    PyErr_Clear();
    Py_XDECREF(r); Py_XDECREF(so); Py_XDECREF(tp); Py_XDECREF(mod);
#endif
}

/* the socket's descriptor, read as its own calls read it (-1 once closed) */
static inline int lc_fd(PyObject *sock) { return ((lc_sockobject *)sock)->sock_fd; }

/* client_lone_init(globals): remoting_client's module dict, read at each call (_Pending, the RCVTIMEO bounds) */
static PyObject *client_lone_init(PyObject *self, PyObject *arg) {
    if (!PyDict_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "client_lone_init takes a dict");
        return NULL;
    }
    for (int i = 0; i < LC_N; i++)
        if (lc_s[i] == NULL && (lc_s[i] = PyUnicode_InternFromString(lc_names[i])) == NULL) return NULL;
    fl_check();
    if (lc_sock_type == NULL) lc_sock_check();
    Py_XSETREF(lc_globals, Py_NewRef(arg));
    Py_RETURN_NONE;
}

/* a float module global of remoting_client, or -1 with an error */
static int lc_global_double(int i, double *out) {
    PyObject *v = PyDict_GetItemWithError(lc_globals, lc_s[i]);
    if (v == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_NameError, lc_s[i]);
        return -1;
    }
    *out = PyFloat_AsDouble(v);
    return *out == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* obj.<name> is true: 1 / 0, -1 with an error */
static int lc_true(PyObject *obj, int i) {
    PyObject *v = PyObject_GetAttr(obj, lc_s[i]);
    if (v == NULL) return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* The connection's data attributes are read and written in its instance dict (materialised once) when its
 * type defines none of them as a data descriptor (checked once per type and version tag): the same values
 * PyObject_GetAttr / SetAttr would read and write, a dict look-up instead of the generic attribute path. */
static const int lc_data[] = {LC_LOCK, LC_CLOSED, LC_BUSY, LC_PENDING, LC_SEND_LOCK, LC_SOCK, LC_RCVTIMEO, LC_RBUF,
                              LC_DECODER, LC_IDLE, LC_LAST};
static PyTypeObject *lc_dict_tp;  /* (strong) the type last found fit, at version lc_dict_tag */
static unsigned int lc_dict_tag;
static int lc_dict_ok(PyTypeObject *tp) {
    if (tp == lc_dict_tp && tp->tp_version_tag == lc_dict_tag && (tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG))
        return 1;
    if (tp->tp_getattro != PyObject_GenericGetAttr || tp->tp_setattro != PyObject_GenericSetAttr
        || tp->tp_dictoffset == 0)
        return 0;
    for (size_t i = 0; i < sizeof lc_data / sizeof lc_data[0]; i++) {
        PyObject *a = _PyType_Lookup(tp, lc_s[lc_data[i]]);
        if (a != NULL && Py_TYPE(a)->tp_descr_set != NULL) return 0;
    }
    if (!(tp->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) return 0;  /* (_PyType_Lookup assigns one) */
    Py_XSETREF(lc_dict_tp, (PyTypeObject *)Py_NewRef((PyObject *)tp));
    lc_dict_tag = tp->tp_version_tag;
    return 1;
}
/* obj.<name> (new reference, NULL with the error): from its dict `d` when given and holding it */
static inline PyObject *lc_get(PyObject *d, PyObject *obj, int i) {
    if (d != NULL) {
        PyObject *v = PyDict_GetItemWithError(d, lc_s[i]);
        if (v != NULL) return Py_NewRef(v);
        if (PyErr_Occurred()) return NULL;
    }
    return PyObject_GetAttr(obj, lc_s[i]);
}
static inline int lc_set(PyObject *d, PyObject *obj, int i, PyObject *v) {
    return d != NULL ? PyDict_SetItem(d, lc_s[i], v) : PyObject_SetAttr(obj, lc_s[i], v);
}
static inline int lc_truth(PyObject *d, PyObject *obj, int i) {
    PyObject *v = lc_get(d, obj, i);
    if (v == NULL) return -1;
    int t = v == Py_True ? 1 : v == Py_False ? 0 : PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* client_lone(conn, frame, opaque, code, timeout, take, *args) -> take's answer, the response, or None.
 * invoke_frame(frame, opaque, code, timeout, partial(take, *args)) of a ClientConnection for a caller that
 * finds nobody reading: None, nothing done, when the connection's lock is busy or not a _thread.lock whose
 * layout fl_check proved, when the connection is closed or another caller holds the read role (invoke_frame
 * decides then, raising or waiting as it does). Otherwise the request is registered (a _Pending, made before
 * the lock is taken), the read role taken, the frame written under the send lock, and the first read made
 * (SO_RCVTIMEO set through _set_rcvtimeo when the time left is out of its bounds); a read that `take(*args,
 * buf, n, opaque)` answers (not None) drops the request and releases the role as invoke_frame does, and the
 * answer is returned. A failed write goes to _send_failed, a read with nothing for take or a partial frame
 * buffered to _first_dispatch, anything else (EOF, an error, SO_RCVTIMEO running out, take's None, no time
 * left) to _finish, each with invoke_frame's arguments. */
static PyObject *lc_invoke(PyObject *conn, PyObject *frame, PyObject *opaque, PyObject *code, PyObject *timeout_o,
                           PyObject *take, PyObject *const *targs, Py_ssize_t ntargs) {
    if (lc_globals == NULL || lc_sock_type == NULL || fl_lock_type == NULL || !PyBytes_CheckExact(frame)
        || !PyLong_CheckExact(opaque))
        Py_RETURN_NONE;
    double timeout = PyFloat_AsDouble(timeout_o);
    if (timeout == -1.0 && PyErr_Occurred()) { PyErr_Clear(); Py_RETURN_NONE; }
    PyObject *d = NULL, *lock = NULL, *slot = NULL, *pending = NULL, *send_lock = NULL, *sock = NULL, *rbuf = NULL,
             *res = NULL, *first = NULL, *nobj = NULL, *v = NULL;
    int locked = 0;
#ifdef FL_LAYOUT
    if (lc_dict_ok(Py_TYPE(conn)) && (d = PyObject_GenericGetDict(conn, NULL)) == NULL) return NULL;
    lock = lc_get(d, conn, LC_LOCK);
    if (lock == NULL) goto done;
    sock = lc_get(d, conn, LC_SOCK);
    if (sock == NULL) goto done;
    if (Py_TYPE(lock) != fl_lock_type || !PyObject_TypeCheck(sock, lc_sock_type)
        || ((lc_sockobject *)sock)->sock_timeout > 0) {  /* a socket with a timeout polls first: Python's call */
        res = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *pcls = PyDict_GetItemWithError(lc_globals, lc_s[LC_PENDING_CLS]);
    if (pcls == NULL) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_NameError, lc_s[LC_PENDING_CLS]);
        goto done;
    }
    PyTypeObject *ptp = (PyTypeObject *)pcls;
    if (PyType_Check(pcls) && ptp->tp_new == PyBaseObject_Type.tp_new && ptp->tp_init == PyBaseObject_Type.tp_init
        && !(ptp->tp_flags & Py_TPFLAGS_IS_ABSTRACT))
        slot = ptp->tp_alloc(ptp, 0);  /* what _Pending() makes: object's __new__ and __init__, nothing else */
    else
        slot = PyObject_CallNoArgs(pcls);  /* before the lock, as invoke_frame */
    if (slot == NULL) goto done;
    fl_lockobject *l = (fl_lockobject *)lock;
    if (PyThread_acquire_lock(l->lock_lock, NOWAIT_LOCK) != 1) { res = Py_NewRef(Py_None); goto done; }
    l->locked = 1;
    locked = 1;
    int t = lc_truth(d, conn, LC_CLOSED);
    if (t == 0) t = lc_truth(d, conn, LC_BUSY);
    if (t < 0) goto done;
    if (t) { res = Py_NewRef(Py_None); goto done; }  /* closed, or another caller reads: invoke_frame decides */
    pending = lc_get(d, conn, LC_PENDING);
    if (pending == NULL || PyObject_SetItem(pending, opaque, slot) < 0 || lc_set(d, conn, LC_BUSY, Py_True) < 0)
        goto done;
    Py_CLEAR(pending);
    l->locked = 0;
    PyThread_release_lock(l->lock_lock);
    locked = 0;
    double deadline = lc_monotonic() + timeout;
    /* the write: self.sock.sendall(frame) under the send lock */
    send_lock = lc_get(d, conn, LC_SEND_LOCK);
    if (send_lock == NULL || fl_acquire(send_lock) < 0) goto done;
    int sent_ok = 1;  /* (sock: read once; only __init__ sets it) */
    {
        const char *p = PyBytes_AS_STRING(frame);
        Py_ssize_t len = PyBytes_GET_SIZE(frame);
        do {  /* sock_sendall's loop: signal handlers run after every send, and on EINTR */
            int fd = lc_fd(sock);
            ssize_t k;
            int err;
            Py_BEGIN_ALLOW_THREADS
            k = send(fd, p, (size_t)len, 0);
            err = errno;
            Py_END_ALLOW_THREADS
            if (k < 0) {
                if (err == EINTR) {
                    if (PyErr_CheckSignals() < 0) { sent_ok = 0; break; }
                    continue;
                }
                errno = err;
                PyErr_SetFromErrno(PyExc_OSError);
                sent_ok = 0;
                break;
            }
            p += k;
            len -= k;
            if (PyErr_CheckSignals() < 0) { sent_ok = 0; break; }
        } while (len > 0);
    }
    if (fl_release(send_lock) < 0) goto done;
    if (!sent_ok) {
        if (!PyErr_ExceptionMatches(PyExc_OSError)) goto done;  /* a signal handler's exception: as sendall's */
        PyObject *e = lc_fetch();
        PyObject *was = PyErr_GetHandledException();
        PyErr_SetHandledException(e);  /* _send_failed runs in invoke_frame's `except OSError` */
        v = PyObject_CallMethodObjArgs(conn, lc_s[LC_SEND_FAILED], e, opaque, Py_True, NULL);
        PyErr_SetHandledException(was);
        Py_XDECREF(was);
        Py_DECREF(e);
        if (v != NULL) res = Py_NewRef(Py_None);  /* (it raises) */
        goto done;
    }
    /* the first read */
    double remaining = deadline - lc_monotonic();
    if (remaining <= 0) goto finish;
    double slack, stretch, rcvtimeo;
    if (lc_global_double(LC_SLACK, &slack) < 0 || lc_global_double(LC_STRETCH, &stretch) < 0) goto done;
    v = lc_get(d, conn, LC_RCVTIMEO);
    if (v == NULL) goto done;
    rcvtimeo = PyFloat_AsDouble(v);
    Py_CLEAR(v);
    if (rcvtimeo == -1.0 && PyErr_Occurred()) goto done;
    if (!(rcvtimeo - slack <= remaining && remaining <= rcvtimeo * stretch)) {
        PyObject *rem = PyFloat_FromDouble(remaining);
        if (rem == NULL) goto done;
        v = PyObject_CallMethodOneArg(conn, lc_s[LC_SET_RCVTIMEO], rem);
        Py_DECREF(rem);
        if (v == NULL) goto done;
        Py_CLEAR(v);
    }
    rbuf = lc_get(d, conn, LC_RBUF);
    if (rbuf == NULL) goto done;
    Py_buffer view;
    if (PyObject_GetBuffer(rbuf, &view, PyBUF_WRITABLE) < 0) goto done;
    ssize_t n;
    for (;;) {  /* sock_recv_into: recv, signal handlers on EINTR */
        int fd = lc_fd(sock), err;
        Py_BEGIN_ALLOW_THREADS
        n = recv(fd, view.buf, (size_t)view.len, 0);
        err = errno;
        Py_END_ALLOW_THREADS
        if (n >= 0) break;
        if (err == EINTR) {
            if (PyErr_CheckSignals() < 0) { PyBuffer_Release(&view); goto done; }
            continue;
        }
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        break;
    }
    PyBuffer_Release(&view);
    if (n < 0) {
        if (PyErr_ExceptionMatches(PyExc_BlockingIOError)) { PyErr_Clear(); goto finish; }  /* SO_RCVTIMEO ran out */
        first = lc_fetch();  /* _await fails the connection with it */
        goto finish;
    }
    nobj = PyLong_FromSsize_t(n);
    if (nobj == NULL) goto done;
    if (n == 0) { first = Py_NewRef(nobj); goto finish; }  /* EOF: _await fails the connection */
    int buffered;
    {
        PyObject *dec = lc_get(d, conn, LC_DECODER);
        if (dec == NULL) goto done;
        buffered = lc_true(dec, LC_BUF);
        Py_DECREF(dec);
        if (buffered < 0) goto done;
    }
    if (take == Py_None || buffered) {
        PyObject *dl = PyFloat_FromDouble(deadline);
        if (dl == NULL) goto done;
        res = PyObject_CallMethodObjArgs(conn, lc_s[LC_FIRST_DISPATCH], opaque, code, slot, dl, timeout_o, nobj, NULL);
        Py_DECREF(dl);
        goto done;
    }
    {
        PyObject *stack[7];
        Py_ssize_t na = ntargs;
        for (Py_ssize_t i = 0; i < na; i++) stack[i] = targs[i];
        stack[na] = rbuf; stack[na + 1] = nobj; stack[na + 2] = opaque;
        v = PyObject_Vectorcall(take, stack, (size_t)(na + 3), NULL);
    }
    if (v == NULL) goto done;
    if (v == Py_None) {  /* not a read take answers: _await dispatches it */
        Py_CLEAR(v);
        first = Py_NewRef(nobj);
        goto finish;
    }
    /* taken: the slot dropped, the read role released, the role handed on, in one lock round */
    if (fl_acquire(lock) < 0) goto done;
    locked = 1;
    pending = lc_get(d, conn, LC_PENDING);  /* _fail may have replaced it */
    if (pending == NULL) goto done;
    PyObject *mine = NULL;
    if (PyDict_CheckExact(pending)) {
        mine = PyDict_GetItemWithError(pending, opaque);
        if (mine != NULL) {
            Py_INCREF(mine);
            if (PyDict_DelItem(pending, opaque) < 0) { Py_DECREF(mine); goto done; }
        } else if (PyErr_Occurred()) goto done;
    } else {
        PyObject *pop = PyObject_CallMethod(pending, "pop", "OO", opaque, Py_None);
        if (pop == NULL) goto done;
        if (pop != Py_None) mine = pop;
        else Py_DECREF(pop);
    }
    PyObject *now = PyFloat_FromDouble(lc_monotonic());
    int ok = now != NULL && lc_set(d, conn, LC_BUSY, Py_False) == 0 && lc_set(d, conn, LC_IDLE, Py_False) == 0
             && lc_set(d, conn, LC_LAST, now) == 0;
    Py_XDECREF(now);
    if (ok) {
        int more = PyDict_CheckExact(pending) ? PyDict_GET_SIZE(pending) > 0 : PyObject_IsTrue(pending);
        if (more < 0) ok = 0;
        else if (more) {
            PyObject *h = PyObject_CallMethodNoArgs(conn, lc_s[LC_HAND_ON]);
            if (h == NULL) ok = 0;
            Py_XDECREF(h);
        }
    }
    if (!ok) { Py_XDECREF(mine); goto done; }
    locked = 0;
    if (fl_release(lock) < 0) { Py_XDECREF(mine); goto done; }
    if (mine == NULL) {  /* _fail took it meanwhile: its error, as _dispatch would leave it */
        PyObject *e = PyObject_CallMethodOneArg(conn, lc_s[LC_LOST], slot);
        if (e != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(e), e);
            Py_DECREF(e);
        }
        goto done;
    }
    Py_DECREF(mine);
    res = v;
    v = NULL;
    goto done;
finish:
    {
        PyObject *dl = PyFloat_FromDouble(deadline);
        if (dl == NULL) goto done;
        res = PyObject_CallMethodObjArgs(conn, lc_s[LC_FINISH], opaque, code, slot, dl, timeout_o, Py_True,
                                         first != NULL ? first : Py_None, NULL);
        Py_DECREF(dl);
    }
done:
    if (locked) {
        PyObject *exc = lc_fetch();
        if (fl_release(lock) < 0) Py_CLEAR(res);
        if (exc != NULL) lc_restore(exc);
    }
#else
    res = Py_NewRef(Py_None);
#endif
    Py_XDECREF(d); Py_XDECREF(lock); Py_XDECREF(slot); Py_XDECREF(pending); Py_XDECREF(send_lock);
    Py_XDECREF(sock); Py_XDECREF(rbuf); Py_XDECREF(first); Py_XDECREF(nobj); Py_XDECREF(v);
    return res;
}

static PyObject *client_lone(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 6 || nargs > 10) {
        PyErr_SetString(PyExc_TypeError, "client_lone takes 6 to 10 arguments");
        return NULL;
    }
    return lc_invoke(args[0], args[1], args[2], args[3], args[4], args[5], args + 6, nargs - 6);
}

/* next(opaques) & 0x7FFFFFFF (what `next(OPAQUES) & 0x7FFFFFFF` gives), NULL with an error */
static PyObject *lc_opaque(PyObject *opaques) {
    PyObject *o = PyIter_Next(opaques);
    if (o == NULL) {
        if (!PyErr_Occurred()) PyErr_SetNone(PyExc_StopIteration);
        return NULL;
    }
    static PyObject *mask;
    if (mask == NULL && (mask = PyLong_FromLong(0x7FFFFFFF)) == NULL) { Py_DECREF(o); return NULL; }
    PyObject *r = PyNumber_And(o, mask);
    Py_DECREF(o);
    return r;
}

static PyObject *lc_code_pop, *lc_code_batch_ack;
static int lc_codes(void) {
    if (lc_code_pop == NULL && (lc_code_pop = PyLong_FromLong(200050)) == NULL) return -1;
    if (lc_code_batch_ack == NULL && (lc_code_batch_ack = PyLong_FromLong(200151)) == NULL) return -1;
    return 0;
}

/* pop_lone(conn, opaques, group, topic, queue_id, max_nums, invisible_time, poll_time, tags, timeout, take,
 * broker_name) -> take's answer, the response, or None: the opaque next(opaques) & 0x7FFFFFFF, the POP_MESSAGE
 * frame pop_request_frame makes with it, and client_lone(conn, frame, opaque, POP_MESSAGE, timeout, take, topic,
 * broker_name), in one call. None when the frame or client_lone declines (nothing sent; an opaque was taken):
 * the caller then goes its own way. */
static PyObject *pop_lone(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "pop_lone takes 12 arguments");
        return NULL;
    }
    if (lc_codes() < 0) return NULL;
    PyObject *opaque = lc_opaque(args[1]);
    if (opaque == NULL) return NULL;
    PyObject *fargs[8] = {args[2], args[3], args[4], args[5], args[6], args[7], args[8], opaque};
    PyObject *frame = pop_request_frame(NULL, fargs, 8), *res = NULL;
    if (frame != NULL && frame != Py_None) {
        PyObject *targs[2] = {args[3], args[11]};
        res = lc_invoke(args[0], frame, opaque, lc_code_pop, args[9], args[10], targs, 2);
    } else if (frame != NULL) {
        res = Py_NewRef(Py_None);
    }
    Py_XDECREF(frame);
    Py_DECREF(opaque);
    return res;
}

/* ack_lone(conn, opaques, msgs, cls, topic, group, timeout, take) -> take's answer, the response, or None: the
 * opaque next(opaques) & 0x7FFFFFFF, the BATCH_ACK_MESSAGE frame pop_ack_frame(msgs, cls, topic, group, opaque)
 * makes and client_lone(conn, frame, opaque, BATCH_ACK_MESSAGE, timeout, take) in one call; None when the frame
 * or client_lone declines (nothing sent). */
static PyObject *ack_lone(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "ack_lone takes 8 arguments");
        return NULL;
    }
    if (lc_codes() < 0) return NULL;
    PyObject *opaque = lc_opaque(args[1]);
    if (opaque == NULL) return NULL;
    PyObject *fargs[5] = {args[2], args[3], args[4], args[5], opaque};
    PyObject *frame = pop_ack_frame(NULL, fargs, 5), *res = NULL;
    if (frame != NULL && frame != Py_None) res = lc_invoke(args[0], frame, opaque, lc_code_batch_ack, args[6], args[7], NULL, 0);
    else if (frame != NULL) res = Py_NewRef(Py_None);
    Py_XDECREF(frame);
    Py_DECREF(opaque);
    return res;
}
/* ============================ end of THE LONE CALLER ================================================= */

/* ============================ THE POP READ (branch pop-broker) ========================================== */
/* PopService.pop_now's read of one queue, without its Python glue: ConsumeQueue.get_units_raw (the units'  */
/* bytes from the consume-queue file holding the offset, MappedFileQueue.find_mapped_file_by_offset and     */
/* MappedFile.get_read_position), the memory floor (CommitLog.get_max_offset - total RAM * ratio // 100),  */
/* CommitLog.get_min_offset, and read_runs' loop (rr_core) with MessageStore._file_span (CommitLog.find_file */
/* and the file's readable end) looked up in C. The fields are read as the Python reads them (slots by      */
/* offset, the rest by attribute); anything they do not hold as the reference expects (not an exact int, a  */
/* list, a bool; no units; a view released) is None: the caller then takes the reference's read            */
/* (MessageStore.read_for_pop). Reference: get_units_raw + read_runs + _file_span (tests/test_pop_read.py). */
static PyObject *prd_n_min_logic, *prd_n_mfq, *prd_n_mfs, *prd_n_files, *prd_n_ffo, *prd_n_wrote, *prd_n_committed,
    *prd_n_transient, *prd_n_view, *prd_n_available, *prd_n_file_size;

static int prd_init(void) {
    if (prd_n_file_size != NULL)
        return 0;
#define PRD_NAME(v, s) if ((v = PyUnicode_InternFromString(s)) == NULL) return -1
    PRD_NAME(prd_n_min_logic, "_min_logic_offset"); PRD_NAME(prd_n_mfq, "mapped_file_queue");
    PRD_NAME(prd_n_mfs, "mapped_file_size"); PRD_NAME(prd_n_files, "mapped_files");
    PRD_NAME(prd_n_ffo, "file_from_offset"); PRD_NAME(prd_n_wrote, "wrote_position");
    PRD_NAME(prd_n_committed, "committed_position"); PRD_NAME(prd_n_transient, "transient");
    PRD_NAME(prd_n_view, "view"); PRD_NAME(prd_n_available, "available"); PRD_NAME(prd_n_file_size, "file_size");
#undef PRD_NAME
    return 0;
}

/* getattr(o, name): by the slot's offset (sf_get_any) for the slots of the classes read here (MappedFile's
 * positions, MappedFileQueue.mapped_files, ConsumeQueue.mapped_file_queue), the generic look-up for the rest
 * (instance-dict attributes: sf_get_any's table would only add its own look-up) */
static PyObject *prd_get(PyObject *o, PyObject *name) {
    if (name == prd_n_ffo || name == prd_n_wrote || name == prd_n_committed || name == prd_n_transient
        || name == prd_n_files || name == prd_n_mfq)
        return sf_get_any(o, name);
    return PyObject_GetAttr(o, name);
}

/* an attribute that is an exact int within +-2**53: 1 (*out); 0 otherwise or on a look-up error (cleared) */
static int prd_int(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = prd_get(o, name);
    if (v == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = pcore_int(v, out);
    Py_DECREF(v);
    return ok;
}

/* an attribute that is True or False: 1 / 0; -1 otherwise or on a look-up error (cleared) */
static int prd_bool(PyObject *o, PyObject *name) {
    PyObject *v = prd_get(o, name);
    if (v == NULL) {
        PyErr_Clear();
        return -1;
    }
    int r = v == Py_True ? 1 : v == Py_False ? 0 : -1;
    Py_DECREF(v);
    return r;
}

static long long prd_floordiv(long long a, long long b) {
    long long q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* MappedFile.get_read_position: 1 (*out), 0 when the fields are not what it reads */
static int prd_read_pos(PyObject *mf, long long *out) {
    int tr = prd_bool(mf, prd_n_transient);
    return tr >= 0 && prd_int(mf, tr ? prd_n_committed : prd_n_wrote, out);
}

/* a MappedFileQueue's mapped_files as a new reference to an exact list, else NULL (nothing set) */
static PyObject *prd_files(PyObject *mfq) {
    PyObject *files = prd_get(mfq, prd_n_files);
    if (files == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (!PyList_CheckExact(files)) {
        Py_DECREF(files);
        return NULL;
    }
    return files;
}

/* MappedFileQueue.find_mapped_file_by_offset over `files` (its mapped_files) with file size `size` > 0:
 * 1 with the file (borrowed from files) or NULL for none in *out; 0 when a field is not what it reads */
static int prd_find(PyObject *files, long long size, long long offset, int return_first, PyObject **out) {
    Py_ssize_t n = PyList_GET_SIZE(files);
    *out = NULL;
    if (n == 0)
        return 1;
    PyObject *first = PyList_GET_ITEM(files, 0), *last = PyList_GET_ITEM(files, n - 1);
    long long f0, fl, fo;
    if (!prd_int(first, prd_n_ffo, &f0) || !prd_int(last, prd_n_ffo, &fl))
        return 0;
    if (offset < f0 || offset >= fl + size) {
        *out = return_first ? first : NULL;
        return 1;
    }
    long long idx = prd_floordiv(offset, size) - prd_floordiv(f0, size);
    if (idx >= 0 && idx < n) {
        PyObject *mf = PyList_GET_ITEM(files, (Py_ssize_t)idx);
        if (!prd_int(mf, prd_n_ffo, &fo))
            return 0;
        if (fo <= offset && offset < fo + size) {
            *out = mf;
            return 1;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {  /* holes or disorder: linear scan */
        PyObject *mf = PyList_GET_ITEM(files, i);
        if (!prd_int(mf, prd_n_ffo, &fo))
            return 0;
        if (fo <= offset && offset < fo + size) {
            *out = mf;
            return 1;
        }
    }
    *out = return_first ? first : NULL;
    return 1;
}

/* the commitlog's state for the read: its mapped_files, their file size, its file_size (roll_next_file) */
typedef struct { PyObject *files; long long mfs; } prd_span_ctx;

/* MessageStore._file_span for rr_core */
static int prd_span(void *ctx, long long at, long long *base, long long *limit, PyObject **view) {
    prd_span_ctx *c = ctx;
    PyObject *mf;
    if (!prd_find(c->files, c->mfs, at, at == 0, &mf))
        goto odd;
    if (mf == NULL)
        return 0;
    long long ffo, rp;
    if (!prd_int(mf, prd_n_ffo, &ffo) || !prd_read_pos(mf, &rp))
        goto odd;
    PyObject *v = prd_get(mf, prd_n_view);
    if (v == NULL)
        return -1;
    *base = ffo;
    *limit = ffo + rp;
    *view = v;
    return 1;
odd:  /* a field the reference would read differently: rr_core fails, the caller declines */
    PyErr_SetString(PyExc_LookupError, "pop_read: unexpected mapped file fields");
    return -1;
}

/* pop_read(cq, offset, want, commit_log, max_total, total_ram, mem_ratio, mem_bytes, mem_count, disk_bytes,
 *          disk_count) -> read_runs' (status, taken, total, max_pulled, body, layout), or None: the reference */
static PyObject *pop_read(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 11) {
        PyErr_SetString(PyExc_TypeError, "pop_read takes 11 arguments");
        return NULL;
    }
    if (pcore_init_names() < 0 || prd_init() < 0)
        return NULL;
    PyObject *cq = a[0], *commit_log = a[3];
    long long offset, want, max_total, total_ram, mem_ratio, mem_bytes, mem_count, disk_bytes, disk_count;
    if (!pcore_int(a[1], &offset) || !pcore_int(a[2], &want) || !pcore_int(a[4], &max_total)
        || !pcore_int(a[5], &total_ram) || !pcore_int(a[6], &mem_ratio) || !pcore_int(a[7], &mem_bytes)
        || !pcore_int(a[8], &mem_count) || !pcore_int(a[9], &disk_bytes) || !pcore_int(a[10], &disk_count)
        || total_ram < 0 || mem_ratio < 0 || mem_ratio > 100)
        Py_RETURN_NONE;
    /* get_units_raw(offset, want) */
    if (offset < 0 || want <= 0 || want > (1LL << 40))
        Py_RETURN_NONE;
    long long logic = offset * 20, min_logic, qsize, cq_mfs;
    if (!prd_int(cq, prd_n_min_logic, &min_logic) || logic < min_logic)
        Py_RETURN_NONE;
    PyObject *mfq = prd_get(cq, prd_n_mfq);
    if (mfq == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *qfiles = prd_files(mfq), *cfiles = NULL, *clq = NULL, *view = NULL, *res = NULL;
    Py_buffer vb;
    vb.obj = NULL;
    int ok = qfiles != NULL && prd_int(mfq, prd_n_mfs, &qsize) && qsize > 0;
    PyObject *mf = NULL;
    if (!ok || !prd_find(qfiles, qsize, logic, 0, &mf) || mf == NULL)
        goto decline;
    long long rp;
    if (!prd_int(cq, prd_n_mfs, &cq_mfs) || cq_mfs <= 0 || !prd_read_pos(mf, &rp))
        goto decline;
    long long pos = logic % cq_mfs, end = pos + want * 20;
    if (end > rp)
        end = rp;
    if (end <= pos || (end - pos) % 20)
        goto decline;
    if ((view = prd_get(mf, prd_n_view)) == NULL) {
        PyErr_Clear();
        goto decline;
    }
    if (!PyMemoryView_Check(view) || PyObject_GetBuffer(view, &vb, PyBUF_SIMPLE) < 0) {  /* released: b"" */
        PyErr_Clear();
        vb.obj = NULL;
        goto decline;
    }
    if (end > vb.len)  /* the slice stops at the view's end */
        end = vb.len;
    if (end <= pos)
        goto decline;
    /* the memory floor and the min physical offset, as pop_now's arguments to read_runs */
    long long cl_mfs, cl_file_size, max_phy = 0, min_phy = -1;
    if ((clq = prd_get(commit_log, prd_n_mfq)) == NULL) {
        PyErr_Clear();
        goto decline;
    }
    if ((cfiles = prd_files(clq)) == NULL || !prd_int(clq, prd_n_mfs, &cl_mfs) || cl_mfs <= 0)
        goto decline;
    Py_ssize_t nc = PyList_GET_SIZE(cfiles);
    if (nc) {
        PyObject *last = PyList_GET_ITEM(cfiles, nc - 1), *first = PyList_GET_ITEM(cfiles, 0);
        long long lffo, lrp, fffo;
        if (!prd_int(last, prd_n_ffo, &lffo) || !prd_read_pos(last, &lrp) || !prd_int(first, prd_n_ffo, &fffo))
            goto decline;
        max_phy = lffo + lrp;
        int avail = prd_bool(first, prd_n_available);
        if (avail < 0)
            goto decline;
        if (avail) {
            min_phy = fffo;
        } else {
            if (!prd_int(commit_log, prd_n_file_size, &cl_file_size) || cl_file_size <= 0)
                goto decline;
            min_phy = fffo + cl_file_size - (fffo % cl_file_size + cl_file_size) % cl_file_size;
        }
    }
    if (total_ram > (1LL << 53) / 101)
        goto decline;
    prd_span_ctx ctx = {cfiles, cl_mfs};
    res = rr_core((const unsigned char *)vb.buf + pos, (Py_ssize_t)(end - pos), offset, want, max_total,
                  max_phy - total_ram * mem_ratio / 100, mem_bytes, mem_count, disk_bytes, disk_count, min_phy,
                  prd_span, &ctx);
    if (res == NULL && PyErr_ExceptionMatches(PyExc_LookupError)) {  /* prd_span's odd field */
        PyErr_Clear();
        goto decline;
    }
    goto out;
decline:
    res = Py_NewRef(Py_None);
out:
    if (vb.obj != NULL)
        PyBuffer_Release(&vb);
    Py_XDECREF(view); Py_XDECREF(qfiles); Py_XDECREF(cfiles); Py_XDECREF(clq); Py_DECREF(mfq);
    return res;
}
/* queue_max(cq): ConsumeQueue.get_max_offset_in_queue (its MappedFileQueue.get_max_offset // 20) without
 * the two Python frames, or None when a field is not what they read (the caller then calls the method) */
static PyObject *queue_max(PyObject *self, PyObject *cq) {
    if (prd_init() < 0)
        return NULL;
    PyObject *mfq = prd_get(cq, prd_n_mfq);
    if (mfq == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *files = prd_files(mfq);
    Py_DECREF(mfq);
    if (files == NULL)
        Py_RETURN_NONE;
    long long top = 0, ffo, rp;
    Py_ssize_t n = PyList_GET_SIZE(files);
    if (n) {
        PyObject *last = PyList_GET_ITEM(files, n - 1);
        if (!prd_int(last, prd_n_ffo, &ffo) || !prd_read_pos(last, &rp)) {
            Py_DECREF(files);
            Py_RETURN_NONE;
        }
        top = ffo + rp;
    }
    Py_DECREF(files);
    return PyLong_FromLongLong(prd_floordiv(top, 20));
}
static PyObject *prd_n_get_max, *prd_zero;

/* queue_live(cq_table, plan, first) -> [(topic, queue_id, retry, cq, max offset), ...]: the queues of `plan` (a
 * list of (topic, queue_id, retry)), from index `first` on and round (plan[first:] + plan[:first]), that the
 * store has (cq_table[topic][queue_id]) and that hold something (max offset > 0), in that order: the ones
 * PopService.pop_now's loop reads or counts. The max offset as queue_max, else the method's. None when the
 * table or the plan is not what it takes (the caller then makes the list in Python: queue_live_py) */
static PyObject *queue_live(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 3) {
        PyErr_SetString(PyExc_TypeError, "queue_live takes 3 arguments");
        return NULL;
    }
    if (prd_init() < 0)
        return NULL;
    if (prd_n_get_max == NULL && (prd_n_get_max = PyUnicode_InternFromString("get_max_offset_in_queue")) == NULL)
        return NULL;
    if (prd_zero == NULL && (prd_zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    PyObject *table = a[0], *plan = a[1];
    long long first;
    if (!PyDict_CheckExact(table) || !PyList_CheckExact(plan) || !pcore_int(a[2], &first))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(plan);
    if (first < 0 || (n && first >= n) || (!n && first))
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < n; i++) {  /* the plan's shape first: nothing called before a decline */
        PyObject *it = PyList_GET_ITEM(plan, i);
        if (!PyTuple_CheckExact(it) || PyTuple_GET_SIZE(it) != 3 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(it, 0))
            || !PyLong_CheckExact(PyTuple_GET_ITEM(it, 1)))
            Py_RETURN_NONE;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *it = PyList_GET_ITEM(plan, (Py_ssize_t)((first + k) % n));
        PyObject *t = PyTuple_GET_ITEM(it, 0), *q = PyTuple_GET_ITEM(it, 1);
        PyObject *queues = PyDict_GetItemWithError(table, t);  /* borrowed */
        if (queues == NULL) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        if (!PyDict_CheckExact(queues)) {
            Py_DECREF(out);
            Py_RETURN_NONE;  /* nothing was called yet for this queue; the caller redoes the list */
        }
        PyObject *cq = PyDict_GetItemWithError(queues, q);
        if (cq == NULL) {
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        if (cq == Py_None)
            continue;
        Py_INCREF(cq);
        PyObject *top = queue_max(NULL, cq);
        if (top == Py_None) {
            Py_DECREF(top);
            top = PyObject_CallMethodNoArgs(cq, prd_n_get_max);
        }
        if (top == NULL) {
            Py_DECREF(cq);
            goto fail;
        }
        int live = PyObject_RichCompareBool(top, prd_zero, Py_GT);
        PyObject *entry = live > 0 ? PyTuple_Pack(5, t, q, PyTuple_GET_ITEM(it, 2), cq, top) : NULL;
        Py_DECREF(cq);
        Py_DECREF(top);
        if (live < 0 || (live > 0 && (entry == NULL || PyList_Append(out, entry) < 0))) {
            Py_XDECREF(entry);
            goto fail;
        }
        Py_XDECREF(entry);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}
static PyObject *prd_n_acquire, *prd_n_release, *prd_n_enabled, *prd_n_count, *prd_n_max_size, *prd_n_stay_ms,
    *prd_n_margin_ms, *prd_n_fd, *prd_n_size, *prd_n_scan_commit;

static int prd_init2(void) {
    if (prd_n_scan_commit != NULL)
        return 0;
#define PRD_NAME(v, s) if ((v = PyUnicode_InternFromString(s)) == NULL) return -1
    PRD_NAME(prd_n_acquire, "acquire"); PRD_NAME(prd_n_release, "release"); PRD_NAME(prd_n_enabled, "enabled");
    PRD_NAME(prd_n_count, "_count"); PRD_NAME(prd_n_max_size, "max_size"); PRD_NAME(prd_n_stay_ms, "stay_ms");
    PRD_NAME(prd_n_margin_ms, "margin_ms"); PRD_NAME(prd_n_fd, "_fd"); PRD_NAME(prd_n_size, "size");
    PRD_NAME(prd_n_scan_commit, "_scan_commit");
#undef PRD_NAME
    return 0;
}

/* o.name += d for an int attribute (as the statement does: getattr, +, setattr); -1 with an error set */
static int prd_add(PyObject *o, PyObject *name, PyObject *d) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    PyObject *w = PyNumber_InPlaceAdd(v, d);
    Py_DECREF(v);
    if (w == NULL)
        return -1;
    int r = PyObject_SetAttr(o, name, w);
    Py_DECREF(w);
    return r;
}

/* with blk (the buffer's lock, held by this thread for the call): pop_now's registration of a contiguous pop,
 * `if buffer.enabled and buffer._count < buffer.max_size: got = pop_register(...)` and its bookkeeping
 * (journal.size, buffer._count, buffer._scan_commit(qkey)): pop_register's tuple, None (not registered, nothing
 * changed), or NULL with an error set */
static PyObject *prd_register(PyObject *buffer, PyObject *journal, PyObject *const *reg) {
    int en = prd_bool(buffer, prd_n_enabled);
    long long cnt, maxsize;
    if (en <= 0 || !prd_int(buffer, prd_n_count, &cnt) || !prd_int(buffer, prd_n_max_size, &maxsize) || cnt >= maxsize)
        Py_RETURN_NONE;  /* off, full or not what the test reads: the reference's add_ck decides */
    PyObject *args[19];
    memcpy(args, reg, sizeof args);
    PyObject *fd = NULL, *stay = NULL, *margin = NULL, *got = NULL;
    if ((fd = prd_get(journal, prd_n_fd)) == NULL || (stay = prd_get(buffer, prd_n_stay_ms)) == NULL
        || (margin = prd_get(buffer, prd_n_margin_ms)) == NULL)
        goto out;
    args[6] = fd;
    args[16] = stay;
    args[17] = margin;
    got = pop_register(NULL, args, 19);
    if (got == NULL || got == Py_None)
        goto out;
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL || prd_add(journal, prd_n_size, PyTuple_GET_ITEM(got, 0)) < 0 || prd_add(buffer, prd_n_count, one) < 0) {
        Py_XDECREF(one);
        Py_CLEAR(got);
        goto out;
    }
    Py_DECREF(one);
    if (PyTuple_GET_ITEM(got, 1) == Py_True) {
        PyObject *sargs[2] = {buffer, reg[5]};
        PyObject *r = PyObject_VectorcallMethod(prd_n_scan_commit, sargs, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL) {
            Py_CLEAR(got);
            goto out;
        }
        Py_DECREF(r);
    }
out:
    Py_XDECREF(fd); Py_XDECREF(stay); Py_XDECREF(margin);
    return got;
}

/* pop_queue(cq, top, pop_offset, want, topic, queue_id, qkey, retry, ctx): PopService.pop_now's work on one
 * queue, its lock held by the caller, from the buffer's pop offset on: the queue's bounds, the read (pop_read)
 * and, for a read of consecutive offsets, the registration in the buffer (pop_register and its bookkeeping under
 * the buffer's lock). ctx: (commit_log, max_total, total_ram, mem_ratio, mem_bytes, mem_count, disk_bytes,
 * disk_count, buffer, buffer lock, journal, PopCheckPoint, _Entry, deque, by_key, buffer queues, group, pop_time,
 * invisible_time, broker_name, revive_qid). Returns
 *   None                                   nothing to read there (pop_now's `continue`)
 *   (offset, max_offset, lo)               the caller reads and registers as the reference does
 *   (offset, max_offset, lo, read)         read (read_runs' tuple), not registered: the caller goes on from the read
 *   (start item, info item, body, n, end, max_offset)   read and registered
 * Nothing is changed before the registration, and that is all or nothing (pop_register). */
static PyObject *pop_queue(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 9 || !PyTuple_CheckExact(a[8]) || PyTuple_GET_SIZE(a[8]) != 21) {
        PyErr_SetString(PyExc_TypeError, "pop_queue takes 9 arguments, the last a tuple of 21");
        return NULL;
    }
    if (pcore_init_names() < 0 || prd_init() < 0 || prd_init2() < 0)
        return NULL;
    PyObject *cq = a[0], *ctx = a[8];
    PyObject *const *c = &PyTuple_GET_ITEM(ctx, 0);
    long long top, pop_off, want, min_logic, lo, offset, max_offset;
    if (!pcore_int(a[1], &top) || !pcore_int(a[2], &pop_off) || !pcore_int(a[3], &want)) {
        PyErr_SetString(PyExc_TypeError, "pop_queue: top, pop_offset and want are ints");
        return NULL;
    }
    if (prd_int(cq, prd_n_min_logic, &min_logic)) {
        lo = prd_floordiv(min_logic, 20);  /* ConsumeQueue.get_min_offset_in_queue */
    } else {  /* the method's */
        PyObject *m = PyObject_CallMethod(cq, "get_min_offset_in_queue", NULL);
        if (m == NULL)
            return NULL;
        int ok = pcore_int(m, &lo);
        Py_DECREF(m);
        if (!ok) {
            PyErr_SetString(PyExc_TypeError, "pop_queue: the queue's min offset is not an int");
            return NULL;
        }
    }
    offset = pop_off > lo ? pop_off : lo;
    if (offset < 0)
        offset = 0;
    PyObject *mo = queue_max(NULL, cq);
    if (mo == Py_None) {
        Py_DECREF(mo);
        mo = PyObject_CallMethodNoArgs(cq, prd_n_get_max == NULL
            ? (prd_n_get_max = PyUnicode_InternFromString("get_max_offset_in_queue")) : prd_n_get_max);
    }
    if (mo == NULL)
        return NULL;
    if (!pcore_int(mo, &max_offset)) {
        Py_DECREF(mo);
        PyErr_SetString(PyExc_TypeError, "pop_queue: the queue's max offset is not an int");
        return NULL;
    }
    Py_DECREF(mo);
    if (offset >= top && offset >= max_offset)
        Py_RETURN_NONE;
    if (!(lo <= offset && offset < max_offset))
        return Py_BuildValue("(LLL)", offset, max_offset, lo);
    PyObject *rargs[11] = {cq, NULL, a[3], c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]};
    PyObject *off_obj = PyLong_FromLongLong(offset);
    if (off_obj == NULL)
        return NULL;
    rargs[1] = off_obj;
    PyObject *r = pop_read(NULL, rargs, 11);
    if (r == NULL || r == Py_None) {
        Py_DECREF(off_obj);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
        return Py_BuildValue("(LLL)", offset, max_offset, lo);
    }
    /* (status, taken, total, max_pulled, body, layout): consecutive when taken == records */
    PyObject *body = PyTuple_GET_ITEM(r, 4), *layout = PyTuple_GET_ITEM(r, 5);
    long long taken;
    Py_ssize_t n = PyBytes_GET_SIZE(layout) / 24;
    if (!pcore_int(PyTuple_GET_ITEM(r, 1), &taken) || n == 0 || taken != n) {
        Py_DECREF(off_obj);
        PyObject *res = Py_BuildValue("(LLLN)", offset, max_offset, lo, r);
        return res;
    }
    PyObject *end_obj = PyLong_FromLongLong(offset + taken);
    if (end_obj == NULL) {
        Py_DECREF(off_obj);
        Py_DECREF(r);
        return NULL;
    }
    /* pop_register's arguments; the journal's fd, stay_ms and margin_ms are read under the lock */
    PyObject *reg[19] = {c[11], c[12], c[13], c[14], c[15], a[6], NULL, c[16], a[4], a[5], off_obj, end_obj, c[17],
                         c[18], c[19], c[20], NULL, NULL, a[7]};
    PyObject *blk = c[9], *got = NULL, *res = NULL;
    PyObject *ok = PyObject_VectorcallMethod(prd_n_acquire, &blk, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (ok == NULL)
        goto out;
    Py_DECREF(ok);
    got = prd_register(c[8], c[10], reg);
    {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);  /* the release whatever happened, as `with` does */
        PyObject *rel = PyObject_VectorcallMethod(prd_n_release, &blk, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (rel == NULL) {
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);
            Py_CLEAR(got);
            goto out;
        }
        Py_DECREF(rel);
        PyErr_Restore(et, ev, etb);
    }
    if (got == NULL)
        goto out;
    if (got == Py_None)
        res = Py_BuildValue("(LLLO)", offset, max_offset, lo, r);
    else {  /* Py_BuildValue("(OOOnOL)", ...) without its format's parse */
        PyObject *n_obj = PyLong_FromSsize_t(n), *mo_obj = n_obj != NULL ? PyLong_FromLongLong(max_offset) : NULL;
        res = mo_obj != NULL ? PyTuple_Pack(6, PyTuple_GET_ITEM(got, 2), PyTuple_GET_ITEM(got, 3), body, n_obj, end_obj,
                                            mo_obj) : NULL;
        Py_XDECREF(n_obj); Py_XDECREF(mo_obj);
    }
out:
    Py_XDECREF(got);
    Py_DECREF(off_obj);
    Py_DECREF(end_obj);
    Py_DECREF(r);
    return res;
}
/* ============================ end of THE POP READ ===================================================== */

/* ============================ THE ACK BATCH (branch ack-batch) ======================================== */
/* A POP of 32 acked by one BATCH_ACK_MESSAGE: THE ACK LANE's al_entry read the body's 32-number bit list with    */
/* two calls a number (j_ws, j_int) and each of its ten keys with j_member + j_string. These read the shape our   */
/* clients write (`"key":` with the ':' right after the quote; `0,1,...,31]`) inline, and hand anything else back */
/* to those general readers at the same place, so what they take is read as before. al_member also reads the    */
/* header keys of ack_frame and pop_frame. Tests: tests/test_ack_lane.py (the C against loads_text +            */
/* BatchAck.from_dict, hypothesis on the bit list's text, the frame readers against the decoder) and           */
/* tests/test_pop_lane.py (pop_frame's declines, the twin brokers).                                              */
/* ============================================================================================================== */
/* al_bits_plain: the bit list of a BATCH_ACK entry as our clients write it, `0,1,...,31]`
 * after its '[' (non-negative integers in canonical decimal, no white space, consecutive ascending), read
 * without a call per number. 1 with *first / *count set and c->p after the ']'; 0 for anything else (white
 * space, a sign, a gap, a leading zero, more than 18 digits, an empty list, a float...), c->p untouched: the
 * general loop below reads it from the same place, so what this takes is what that loop takes. */
static int al_bits_plain(jcur *c, long long *first, long long *count) {
    const unsigned char *p = c->p, *e = c->end;
    long long n = 0, f = 0;
    for (;;) {
        if (p >= e) return 0;
        long long x = *p - '0';
        if ((unsigned long long)x > 9) return 0;
        const unsigned char *d = p++;
        if (x) {
            while (p < e && (unsigned)(*p - '0') <= 9) {
                if (p - d >= 18) return 0;  /* j_int's limit */
                x = x * 10 + (*p++ - '0');
            }
        }
        if (n == 0) f = x;
        else if (x != f + n) return 0;
        n++;
        if (p >= e) return 0;
        if (*p == ',') { p++; continue; }
        if (*p == ']') break;
        return 0;
    }
    c->p = p + 1;
    *first = f;
    *count = n;
    return 1;
}

/* j_member for a plain key written as our clients write it ("key": its ':' right after the quote), with the
 * table scan inline; any other key (white space before the ':', an escape, a byte j_scan stops at) is
 * j_member's, from the same place */
static int al_member(jcur *c, const unsigned char **k, Py_ssize_t *kn) {
    const unsigned char *p = c->p;
    if (p < c->end && *p == '"') {
        const unsigned char *s = p + 1, *q = s;
        while (q < c->end && !j_scan[*q]) q++;
        if (q + 1 < c->end && *q == '"' && q[1] == ':') {
            *k = s;
            *kn = q - s;
            c->p = q + 2;
            j_ws(c);
            return c->p < c->end ? J_OK : J_GIVE_WAY;
        }
    }
    return j_member(c, k, kn);
}

/* ============================ end of THE ACK BATCH ===================================================== */

/* ============================ THE POP ENTRY (branch pop-ck) ============================================ */
/* PopEntry: the base of pop_buffer._Entry (a Python subclass with __slots__ = ()): its fields revive_qid,   */
/* next_offset, acked, full, stored, flush_at and contiguous as T_OBJECT_EX slots (what _Entry's __slots__   */
/* were), and `ck`, the PopCheckPoint, made when first read for an entry pop_register made (pe_make): such    */
/* an entry keeps the checkpoint's fields (its class, group, topic, queue id, start offset, pop time,       */
/* invisible time, broker name, count) and builds `ck_cls(start, pop_time, invisible, n, queue_id, topic,    */
/* group, broker_name, list(range(n)))` then, as pop_now's Python lines build it; ack_settle reads a made     */
/* entry's fields without building it (pe_settle_fields). Setting `ck` (what _Entry.__init__ does) drops    */
/* the kept fields. No cycle can go through an entry (ints, bools, strs, a class, a checkpoint): not GC.    */
typedef struct {
    PyObject_HEAD
    PyObject *ck, *revive_qid, *next_offset, *acked, *full, *stored, *flush_at, *contiguous;
    PyObject *ck_cls, *group, *topic, *queue_id, *start_offset, *pop_time, *invisible_time, *broker_name;
    long long so, n;  /* the start offset and message count, when ck_cls is set */
} PopEntryObject;

static void pe_clear_fields(PopEntryObject *e) {
    Py_CLEAR(e->ck_cls); Py_CLEAR(e->group); Py_CLEAR(e->topic); Py_CLEAR(e->queue_id); Py_CLEAR(e->start_offset);
    Py_CLEAR(e->pop_time); Py_CLEAR(e->invisible_time); Py_CLEAR(e->broker_name);
}

static void pe_dealloc(PyObject *o) {
    PopEntryObject *e = (PopEntryObject *)o;
    Py_XDECREF(e->ck); Py_XDECREF(e->revive_qid); Py_XDECREF(e->next_offset); Py_XDECREF(e->acked);
    Py_XDECREF(e->full); Py_XDECREF(e->stored); Py_XDECREF(e->flush_at); Py_XDECREF(e->contiguous);
    pe_clear_fields(e);
    Py_TYPE(o)->tp_free(o);
}

static PyObject *pe_get_ck(PyObject *o, void *closure) {
    PopEntryObject *e = (PopEntryObject *)o;
    if (e->ck == NULL && e->ck_cls != NULL) {
        PyObject *diffs = PyList_New((Py_ssize_t)e->n);
        if (diffs == NULL)
            return NULL;
        for (long long i = 0; i < e->n; i++) {
            PyObject *v = PyLong_FromLongLong(i);
            if (v == NULL) {
                Py_DECREF(diffs);
                return NULL;
            }
            PyList_SET_ITEM(diffs, (Py_ssize_t)i, v);
        }
        PyObject *num = PyLong_FromLongLong(e->n);
        if (num == NULL) {
            Py_DECREF(diffs);
            return NULL;
        }
        PyObject *args[9] = {e->start_offset, e->pop_time, e->invisible_time, num, e->queue_id, e->topic, e->group,
                             e->broker_name, diffs};
        PyObject *ck = PyObject_Vectorcall(e->ck_cls, args, 9, NULL);
        Py_DECREF(num);
        Py_DECREF(diffs);
        if (ck == NULL)
            return NULL;
        e->ck = ck;
    }
    if (e->ck == NULL) {
        PyErr_SetString(PyExc_AttributeError, "'ck'");
        return NULL;
    }
    return Py_NewRef(e->ck);
}

static int pe_set_ck(PyObject *o, PyObject *v, void *closure) {
    PopEntryObject *e = (PopEntryObject *)o;
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "ck cannot be deleted");
        return -1;
    }
    Py_XSETREF(e->ck, Py_NewRef(v));
    pe_clear_fields(e);  /* the checkpoint given is the one from now on */
    return 0;
}

static PyMemberDef pe_members[] = {
    {"revive_qid", T_OBJECT_EX, offsetof(PopEntryObject, revive_qid), 0, NULL},
    {"next_offset", T_OBJECT_EX, offsetof(PopEntryObject, next_offset), 0, NULL},
    {"acked", T_OBJECT_EX, offsetof(PopEntryObject, acked), 0, NULL},
    {"full", T_OBJECT_EX, offsetof(PopEntryObject, full), 0, NULL},
    {"stored", T_OBJECT_EX, offsetof(PopEntryObject, stored), 0, NULL},
    {"flush_at", T_OBJECT_EX, offsetof(PopEntryObject, flush_at), 0, NULL},
    {"contiguous", T_OBJECT_EX, offsetof(PopEntryObject, contiguous), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef pe_getset[] = {
    {"ck", pe_get_ck, pe_set_ck, "the PopCheckPoint (made when first read, for an entry pop_register made)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PopEntry_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rmq_eventstore._native.PopEntry",
    .tp_basicsize = sizeof(PopEntryObject),
    .tp_dealloc = pe_dealloc,
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "The fields of a POP buffer entry (pop_buffer._Entry's base); `ck` made when first read.",
    .tp_members = pe_members,
    .tp_getset = pe_getset,
    .tp_new = PyType_GenericNew,
};

/* pop_register's entry when its class is a PopEntry subclass: the fields set, the checkpoint kept as its fields
 * (n > 0); a new reference, or NULL with an error set. `Full` and `flush_at` are new references given to it. */
static PyObject *pe_make(PyTypeObject *et, PyObject *ck_cls, PyObject *group, PyObject *topic, PyObject *q_obj,
                         PyObject *offset_obj, PyObject *pop_time_obj, PyObject *invisible, PyObject *broker_name,
                         long long offset, long long n, PyObject *revive_qid, PyObject *next_offset, PyObject *full,
                         PyObject *flush_at) {
    PyObject *acked = PyLong_FromLong(0);
    PyObject *o = acked != NULL ? et->tp_alloc(et, 0) : NULL;
    if (o == NULL) {
        Py_XDECREF(acked); Py_DECREF(full); Py_DECREF(flush_at);
        return NULL;
    }
    PopEntryObject *e = (PopEntryObject *)o;
    e->revive_qid = Py_NewRef(revive_qid); e->next_offset = Py_NewRef(next_offset); e->acked = acked;
    e->full = full; e->stored = Py_NewRef(Py_False); e->flush_at = flush_at; e->contiguous = Py_NewRef(Py_True);
    e->ck_cls = Py_NewRef(ck_cls); e->group = Py_NewRef(group); e->topic = Py_NewRef(topic);
    e->queue_id = Py_NewRef(q_obj); e->start_offset = Py_NewRef(offset_obj); e->pop_time = Py_NewRef(pop_time_obj);
    e->invisible_time = Py_NewRef(invisible); e->broker_name = Py_NewRef(broker_name);
    e->so = offset;
    e->n = n;
    return o;
}

/* ack_settle's read of an entry pop_register made and nobody re-pointed: 1 with its start offset, count, acked and
 * full bits (stored False, contiguous True, acked / full exact ints in 0..2**53); 0 when it is not such an entry */
static int pe_settle_fields(PyObject *o, long long *so, long long *n, long long *acked, long long *full) {
    if (!PyType_IsSubtype(Py_TYPE(o), &PopEntry_Type))
        return 0;
    PopEntryObject *e = (PopEntryObject *)o;
    if (e->ck_cls == NULL || e->stored != Py_False || e->contiguous != Py_True || e->acked == NULL || e->full == NULL
        || !PyLong_CheckExact(e->acked) || !PyLong_CheckExact(e->full))
        return 0;
    int o1 = 0, o2 = 0;
    long long a = PyLong_AsLongLongAndOverflow(e->acked, &o1), f = PyLong_AsLongLongAndOverflow(e->full, &o2);
    if (o1 || o2 || a < 0 || f < 0 || a > (1LL << 53) || f > (1LL << 53)) {  /* pcore_int's bounds, as the other way */
        PyErr_Clear();
        return 0;
    }
    *so = e->so;
    *n = e->n;
    *acked = a;
    *full = f;
    return 1;
}

/* the type, added to the module by PyInit__native: 0, or -1 with an error set */
static int pe_add_type(PyObject *m) {
    if (PyType_Ready(&PopEntry_Type) < 0)
        return -1;
    Py_INCREF(&PopEntry_Type);
    if (PyModule_AddObject(m, "PopEntry", (PyObject *)&PopEntry_Type) < 0) {
        Py_DECREF(&PopEntry_Type);
        return -1;
    }
    return 0;
}
/* ============================ end of THE POP ENTRY ===================================================== */

/* ============================ THE ACK ONE (branch pop-ck) =============================================== */
/* AckMessageProcessor.lane for the usual ack in one call: an ACK_MESSAGE (ack_frame's 14-tuple) or a         */
/* BATCH_ACK_MESSAGE of one entry (ack_frame's / ack_body's (frame, [entry])), checked as the lane checks it    */
/* (TopicManager.get from its cache as ConfigCache.entries keeps it, the queue's bounds, _lane_run's retry    */
/* naming) and settled as PopBufferMergeService.ack_one settles it under the buffer's lock: ack_settle (its   */
/* bits, journal line, _by_key entry), journal.size, and for a settled checkpoint `settled += 1` and          */
/* _scan_commit (the queue's settled-or-stored prefix dropped, its offset committed through the buffer's own  */
/* committed / commit callables, _committed_by_me). True when settled there; None, before anything changed,  */
/* for everything else (a cache out of date, a retry topic to name, a check that fails, an entry ack_settle  */
/* leaves alone): the caller then takes the lane's Python, which answers as before. Reference: lane + ack_one */
/* + _scan_commit (broker/processor/pop.py, broker/pop_buffer.py; tests/test_pop_lane.py's twins).             */
static PyObject *ak1_n_file, *ak1_n_dv, *ak1_n_counter, *ak1_n_timestamp, *ak1_n_key, *ak1_n_entries, *ak1_n_rqn,
    *ak1_n_settled, *ak1_n_count, *ak1_n_popleft, *ak1_n_fd, *ak1_n_size, *ak1_n_acquire, *ak1_n_release,
    *ak1_n_stored, *ak1_n_acked, *ak1_n_full, *ak1_n_next, *ak1_n_min_logic, *ak1_n_journal, *ak1_n_table, *ak1_n_lock,
    *ak1_n_commits, *ak1_n_step, *ak1_n_next_version, *ak1_sep, *ak1_one, *ak1_minus_one, *ak1_zero;

static int ak1_init(void) {
    if (ak1_zero != NULL)
        return 0;
#define AK1_NAME(v, s) if ((v = PyUnicode_InternFromString(s)) == NULL) return -1
    AK1_NAME(ak1_n_file, "file"); AK1_NAME(ak1_n_dv, "data_version"); AK1_NAME(ak1_n_counter, "counter");
    AK1_NAME(ak1_n_timestamp, "timestamp"); AK1_NAME(ak1_n_key, "_key"); AK1_NAME(ak1_n_entries, "_entries");
    AK1_NAME(ak1_n_rqn, "read_queue_nums"); AK1_NAME(ak1_n_settled, "settled"); AK1_NAME(ak1_n_count, "_count");
    AK1_NAME(ak1_n_popleft, "popleft"); AK1_NAME(ak1_n_fd, "_fd"); AK1_NAME(ak1_n_size, "size");
    AK1_NAME(ak1_n_acquire, "acquire"); AK1_NAME(ak1_n_release, "release"); AK1_NAME(ak1_n_stored, "stored");
    AK1_NAME(ak1_n_acked, "acked"); AK1_NAME(ak1_n_full, "full"); AK1_NAME(ak1_n_next, "next_offset");
    AK1_NAME(ak1_n_min_logic, "_min_logic_offset"); AK1_NAME(ak1_n_journal, "journal");
    AK1_NAME(ak1_n_table, "_offset_table"); AK1_NAME(ak1_n_lock, "_lock"); AK1_NAME(ak1_n_commits, "_commits");
    AK1_NAME(ak1_n_step, "update_version_step"); AK1_NAME(ak1_n_next_version, "next_version"); AK1_NAME(ak1_sep, "@");
#undef AK1_NAME
    if ((ak1_one = PyLong_FromLong(1)) == NULL || (ak1_minus_one = PyLong_FromLong(-1)) == NULL)
        return -1;
    ak1_zero = PyLong_FromLong(0);
    return ak1_zero == NULL ? -1 : 0;
}

/* an attribute that is an exact int within +-2**53: 1 (*out); 0 otherwise or on a look-up error (cleared) */
static int ak1_int(PyObject *o, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = pcore_int(v, out);
    Py_DECREF(v);
    return ok;
}

/* TopicManager.get(topic)'s read_queue_nums when the topic is in its cache and the cache is the current one
 * (ConfigCache.entries would keep it): 1 (*rqn); 0 otherwise (nothing changed, no error set) */
static int ak1_topic(PyObject *cache, PyObject *absent, PyObject *topic, long long *rqn) {
    PyObject *file = NULL, *dv = NULL, *key = NULL, *entries = NULL;
    long long counter, ts, k0, k1;
    int ok = 0;
    if ((file = PyObject_GetAttr(cache, ak1_n_file)) == NULL || (dv = PyObject_GetAttr(file, ak1_n_dv)) == NULL
        || (key = PyObject_GetAttr(cache, ak1_n_key)) == NULL || (entries = PyObject_GetAttr(cache, ak1_n_entries)) == NULL)
        goto out;
    if (!ak1_int(dv, ak1_n_counter, &counter) || !ak1_int(dv, ak1_n_timestamp, &ts) || !PyTuple_CheckExact(key)
        || PyTuple_GET_SIZE(key) != 2 || !pcore_int(PyTuple_GET_ITEM(key, 0), &k0)
        || !pcore_int(PyTuple_GET_ITEM(key, 1), &k1) || k0 != counter || k1 != ts || !PyDict_CheckExact(entries))
        goto out;
    PyObject *tc = PyDict_GetItemWithError(entries, topic);  /* borrowed */
    if (tc == NULL || tc == absent)
        goto out;
    ok = ak1_int(tc, ak1_n_rqn, rqn);
out:
    PyErr_Clear();
    Py_XDECREF(file); Py_XDECREF(dv); Py_XDECREF(key); Py_XDECREF(entries);
    return ok;
}

/* the store's queue (find_consume_queue(topic, q, create=False)) with its min and max offsets: a new reference,
 * or NULL (no error set) when it is not there or its fields are not what the methods read */
static PyObject *ak1_queue(PyObject *table, PyObject *topic, PyObject *q_obj, long long *lo, long long *hi) {
    if (!PyDict_CheckExact(table))
        return NULL;
    PyObject *queues = PyDict_GetItemWithError(table, topic);
    if (queues == NULL || !PyDict_CheckExact(queues)) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *cq = PyDict_GetItemWithError(queues, q_obj);
    long long min_logic;
    if (cq == NULL || !ak1_int(cq, ak1_n_min_logic, &min_logic)) {
        PyErr_Clear();
        return NULL;
    }
    *lo = prd_floordiv(min_logic, 20);  /* ConsumeQueue.get_min_offset_in_queue */
    PyObject *top = queue_max(NULL, cq);
    if (top == NULL || !pcore_int(top, hi)) {
        PyErr_Clear();
        Py_XDECREF(top);
        return NULL;
    }
    Py_DECREF(top);
    return Py_NewRef(cq);
}

/* ConsumerOffsetFile.query_offset(group, topic, q) (no lock, as it reads): a new reference, or NULL with an error set */
static PyObject *ak1_query(PyObject *file, PyObject *group, PyObject *topic, PyObject *q_obj) {
    PyObject *table = PyObject_GetAttr(file, ak1_n_table), *key = NULL, *res = NULL, *tk = NULL;
    if (table == NULL)
        return NULL;
    if ((tk = PyUnicode_Concat(topic, ak1_sep)) == NULL || (key = PyUnicode_Concat(tk, group)) == NULL)
        goto out;  /* the table's key: topic + TOPIC_GROUP_SEPARATOR + group */
    if (!PyDict_CheckExact(table)) {  /* not the table the method reads: its own answer */
        res = PyObject_CallMethod(file, "query_offset", "OOO", group, topic, q_obj);
        goto out;
    }
    PyObject *offsets = PyDict_GetItemWithError(table, key);
    if (offsets == NULL) {
        if (!PyErr_Occurred())
            res = Py_NewRef(ak1_minus_one);
        goto out;
    }
    if (!PyDict_CheckExact(offsets)) {
        res = PyObject_CallMethod(file, "query_offset", "OOO", group, topic, q_obj);
        goto out;
    }
    PyObject *off = PyDict_GetItemWithError(offsets, q_obj);
    if (off != NULL)
        res = Py_NewRef(off);
    else if (!PyErr_Occurred())
        res = Py_NewRef(ak1_minus_one);
out:
    Py_DECREF(table); Py_XDECREF(tk); Py_XDECREF(key);
    return res;
}

/* ConsumerOffsetFile.commit_offset(group, topic, q, offset) for a pair its table has and an offset not below the one
 * there (no warning to log): 1 done; 0 not that case, nothing changed (the caller calls the method); -1 error */
static int ak1_commit(PyObject *file, PyObject *group, PyObject *topic, PyObject *q_obj, PyObject *offset) {
    PyObject *table = PyObject_GetAttr(file, ak1_n_table), *tk = NULL, *key = NULL, *lock = NULL;
    if (table == NULL)
        return -1;
    int rc = -1;
    if ((tk = PyUnicode_Concat(topic, ak1_sep)) == NULL || (key = PyUnicode_Concat(tk, group)) == NULL
        || (lock = PyObject_GetAttr(file, ak1_n_lock)) == NULL)
        goto out;
    rc = 0;
    if (!PyDict_CheckExact(table))
        goto out;
    PyObject *ok = PyObject_CallMethodNoArgs(lock, ak1_n_acquire);
    if (ok == NULL) {
        rc = -1;
        goto out;
    }
    Py_DECREF(ok);
    PyObject *offsets = PyDict_GetItemWithError(table, key), *previous = NULL;
    int le = 0;
    if (offsets != NULL && PyDict_CheckExact(offsets)) {  /* a pair the table has (validated when added) */
        previous = PyDict_GetItemWithError(offsets, q_obj);
        le = previous == NULL ? (PyErr_Occurred() ? -1 : 1) : PyObject_RichCompareBool(previous, offset, Py_LE);
    }
    if (le == 1) {  /* offsets[queue_id] = offset; self._commits += 1; the version step */
        PyObject *commits = NULL, *step = NULL, *m = NULL;
        int next = 0;
        if (PyDict_SetItem(offsets, q_obj, offset) < 0 || prd_add(file, ak1_n_commits, ak1_one) < 0
            || (commits = PyObject_GetAttr(file, ak1_n_commits)) == NULL
            || (step = PyObject_GetAttr(file, ak1_n_step)) == NULL || (next = PyObject_RichCompareBool(step, ak1_zero, Py_GT)) < 0)
            le = -1;
        else if (next && ((m = PyNumber_Remainder(commits, step)) == NULL || (next = PyObject_RichCompareBool(m, ak1_zero, Py_EQ)) < 0))
            le = -1;
        if (le == 1 && next) {
            PyObject *dv = PyObject_GetAttr(file, ak1_n_dv), *r = NULL;
            if (dv == NULL || (r = PyObject_CallMethodNoArgs(dv, ak1_n_next_version)) == NULL)
                le = -1;
            Py_XDECREF(dv); Py_XDECREF(r);
        }
        Py_XDECREF(commits); Py_XDECREF(step); Py_XDECREF(m);
    }
    {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);
        PyObject *rel = PyObject_CallMethodNoArgs(lock, ak1_n_release);
        if (rel == NULL) {
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);
            le = -1;
        } else {
            Py_DECREF(rel);
            PyErr_Restore(et, ev, etb);
        }
    }
    rc = le < 0 ? -1 : le;
out:
    Py_DECREF(table); Py_XDECREF(tk); Py_XDECREF(key); Py_XDECREF(lock);
    return rc;
}

/* PopBufferMergeService._scan_commit(qkey), lock held: 0, or -1 with an error set */
static int ak1_scan(PyObject *buffer, PyObject *queues, PyObject *qkey, PyObject *by_me, PyObject *commit,
                    PyObject *committed, PyObject *file) {
    PyObject *q = PyDict_GetItemWithError(queues, qkey);
    if (q == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(q);
    PyObject *offset = Py_NewRef(ak1_minus_one);
    int rc = -1;
    Py_ssize_t len = PyObject_Size(q);
    if (len < 0)
        goto out;
    if (len == 0) {
        rc = 0;
        goto out;
    }
    while (len > 0) {  /* while q and (q[0].stored or q[0].acked == q[0].full) */
        PyObject *head = PySequence_GetItem(q, 0);
        if (head == NULL)
            goto out;
        PyObject *st = sf_get_any(head, ak1_n_stored);
        int take = st == NULL ? -1 : PyObject_IsTrue(st);
        Py_XDECREF(st);
        if (take == 0) {
            PyObject *ac = sf_get_any(head, ak1_n_acked), *fu = ac != NULL ? sf_get_any(head, ak1_n_full) : NULL;
            take = fu != NULL ? PyObject_RichCompareBool(ac, fu, Py_EQ) : -1;
            Py_XDECREF(ac); Py_XDECREF(fu);
        }
        Py_DECREF(head);
        if (take < 0)
            goto out;
        if (!take)
            break;
        PyObject *popped = PyObject_CallMethodNoArgs(q, ak1_n_popleft);
        if (popped == NULL)
            goto out;
        PyObject *nxt = sf_get_any(popped, ak1_n_next);
        Py_DECREF(popped);
        if (nxt == NULL)
            goto out;
        Py_SETREF(offset, nxt);
        if (prd_add(buffer, ak1_n_count, ak1_minus_one) < 0 || (len = PyObject_Size(q)) < 0)
            goto out;
    }
    int ge = PyObject_RichCompareBool(offset, ak1_zero, Py_GE);  /* offset >= 0 and offset > committed(*qkey) */
    if (ge < 0)
        goto out;
    if (ge) {
        PyObject *c = file != Py_None  /* committed is file.query_offset: read here */
            ? ak1_query(file, PyTuple_GET_ITEM(qkey, 0), PyTuple_GET_ITEM(qkey, 1), PyTuple_GET_ITEM(qkey, 2))
            : PyObject_Call(committed, qkey, NULL);
        if (c == NULL)
            goto out;
        int gt = PyObject_RichCompareBool(offset, c, Py_GT);
        Py_DECREF(c);
        if (gt < 0)
            goto out;
        if (gt) {
            PyObject *cargs[4] = {PyTuple_GET_ITEM(qkey, 0), PyTuple_GET_ITEM(qkey, 1), PyTuple_GET_ITEM(qkey, 2), offset};
            int done = file != Py_None ? ak1_commit(file, cargs[0], cargs[1], cargs[2], offset) : 0;
            if (done < 0)
                goto out;
            if (!done) {  /* commit's own call (a new pair, an offset below the committed one: its checks, its warning) */
                PyObject *r = PyObject_Vectorcall(commit, cargs, 4, NULL);
                if (r == NULL)
                    goto out;
                Py_DECREF(r);
            }
            if (PyDict_SetItem(by_me, qkey, offset) < 0)
                goto out;
        }
    }
    if (len == 0 && PyDict_DelItem(queues, qkey) < 0)
        goto out;
    rc = 0;
out:
    Py_DECREF(offset);
    Py_DECREF(q);
    return rc;
}

/* ack_one(got, ctx): ctx = (topic cache, topic_manager.ABSENT, consume_queue_table, buffer, buffer lock, _by_key, _queues,
 * _committed_by_me, commit, committed, offset file: the ConsumerOffsetFile whose query_offset `committed` is and
 * whose commit_offset `commit` calls, else None) -> True, or None (nothing changed), or NULL with an error set */
static PyObject *ack_one(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 2 || !PyTuple_CheckExact(a[1]) || PyTuple_GET_SIZE(a[1]) != 11) {
        PyErr_SetString(PyExc_TypeError, "ack_one(got, ctx): ctx a tuple of 11");
        return NULL;
    }
    if (ak1_init() < 0 || pcore_init_names() < 0 || prd_init() < 0)
        return NULL;
    PyObject *got = a[0];
    PyObject *const *c = &PyTuple_GET_ITEM(a[1], 0);
    PyObject *group, *topic, *q_obj, *key_q, *start_obj, *pop_time_obj;
    long long first, stop, q, tmp, lo, hi;
    if (!PyTuple_CheckExact(got))
        Py_RETURN_NONE;
    if (PyTuple_GET_SIZE(got) == 14) {  /* ACK_MESSAGE: the lane's checks (_check_target's) */
        group = PyTuple_GET_ITEM(got, 2); topic = PyTuple_GET_ITEM(got, 3); q_obj = PyTuple_GET_ITEM(got, 4);
        start_obj = PyTuple_GET_ITEM(got, 6); pop_time_obj = PyTuple_GET_ITEM(got, 7); key_q = PyTuple_GET_ITEM(got, 12);
        if (!pcore_int(PyTuple_GET_ITEM(got, 5), &first) || !pcore_int(q_obj, &q))
            Py_RETURN_NONE;
        stop = first + 1;
    } else if (PyTuple_GET_SIZE(got) == 2 && PyList_CheckExact(PyTuple_GET_ITEM(got, 1))
               && PyList_GET_SIZE(PyTuple_GET_ITEM(got, 1)) == 1) {  /* BATCH_ACK_MESSAGE of one entry: _lane_run's */
        PyObject *e = PyList_GET_ITEM(PyTuple_GET_ITEM(got, 1), 0);
        long long so, fb, cnt;
        if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 10 || PyTuple_GET_ITEM(e, 2) != Py_False)
            Py_RETURN_NONE;  /* a retry entry: its topic named by pop_retry_topic, in Python */
        group = PyTuple_GET_ITEM(e, 0); topic = PyTuple_GET_ITEM(e, 1); q_obj = key_q = PyTuple_GET_ITEM(e, 4);
        start_obj = PyTuple_GET_ITEM(e, 3); pop_time_obj = PyTuple_GET_ITEM(e, 6);
        if (!pcore_int(start_obj, &so) || !pcore_int(PyTuple_GET_ITEM(e, 8), &fb) || !pcore_int(PyTuple_GET_ITEM(e, 9), &cnt)
            || !pcore_int(q_obj, &q) || cnt < 1)
            Py_RETURN_NONE;
        first = so + fb;
        stop = first + cnt;
    } else {
        Py_RETURN_NONE;
    }
    if (!PyUnicode_CheckExact(group) || !PyUnicode_CheckExact(topic) || !pcore_int(key_q, &tmp)
        || !pcore_int(start_obj, &tmp) || !pcore_int(pop_time_obj, &tmp))
        Py_RETURN_NONE;
    if (PyTuple_GET_SIZE(got) == 14) {
        long long rqn;
        if (!ak1_topic(c[0], c[1], topic, &rqn) || q < 0 || q >= rqn)
            Py_RETURN_NONE;
    }
    PyObject *cq = ak1_queue(c[2], topic, q_obj, &lo, &hi);
    if (cq == NULL)
        Py_RETURN_NONE;
    Py_DECREF(cq);  /* only its bounds are read */
    if (lo < 0 || first < lo || stop - 1 > hi)  /* (an ACK_MESSAGE's lo >= 0 too: its offset >= lo, a min >= 0) */
        Py_RETURN_NONE;
    PyObject *buffer = c[3], *blk = c[4], *journal = PyObject_GetAttr(buffer, ak1_n_journal);
    if (journal == NULL)
        return NULL;
    if (journal == Py_None) {  /* ack_one's Python writes no journal line */
        Py_DECREF(journal);
        Py_RETURN_NONE;
    }
    PyObject *key = PyTuple_Pack(5, group, topic, key_q, start_obj, pop_time_obj), *qkey = NULL, *fd = NULL;
    PyObject *lo_obj = NULL, *hi_obj = NULL, *settle = NULL, *res = NULL;
    if (key == NULL) {
        Py_DECREF(journal);
        return NULL;
    }
    PyObject *ok = PyObject_CallMethodNoArgs(blk, ak1_n_acquire);
    if (ok == NULL) {
        Py_DECREF(key);
        Py_DECREF(journal);
        return NULL;
    }
    Py_DECREF(ok);
    if ((fd = PyObject_GetAttr(journal, ak1_n_fd)) == NULL || (lo_obj = PyLong_FromLongLong(first)) == NULL
        || (hi_obj = PyLong_FromLongLong(stop)) == NULL)
        goto out;
    PyObject *sargs[5] = {c[5], key, lo_obj, hi_obj, fd};
    if ((settle = ack_settle(NULL, sargs, 5)) == NULL)
        goto out;
    if (settle == Py_None) {  /* not its case: nothing changed */
        res = Py_NewRef(Py_None);
        goto out;
    }
    if (prd_add(journal, ak1_n_size, PyTuple_GET_ITEM(settle, 0)) < 0)
        goto out;
    if (PyTuple_GET_ITEM(settle, 1) == Py_True) {
        if (prd_add(buffer, ak1_n_settled, ak1_one) < 0 || (qkey = PyTuple_GetSlice(key, 0, 3)) == NULL
            || ak1_scan(buffer, c[6], qkey, c[7], c[8], c[9], c[10]) < 0)
            goto out;
    }
    res = Py_NewRef(Py_True);
out:
    {
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);  /* the release whatever happened, as `with` does */
        PyObject *rel = PyObject_CallMethodNoArgs(blk, ak1_n_release);
        if (rel == NULL) {
            Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);
            Py_CLEAR(res);
        } else {
            Py_DECREF(rel);
            PyErr_Restore(et, ev, etb);
        }
    }
    if (PyErr_Occurred())
        Py_CLEAR(res);
    Py_DECREF(key); Py_DECREF(journal); Py_XDECREF(qkey); Py_XDECREF(fd); Py_XDECREF(lo_obj); Py_XDECREF(hi_obj); Py_XDECREF(settle);
    return res;
}
/* ============================ end of THE ACK ONE ====================================================== */

/* ============================ THE POP OFFSET (branch pop-ck) ============================================ */
/* pop_offset(ctx, qkey): PopBufferMergeService.pop_offset (where a queue's next pop starts) under the        */
/* buffer's lock, without its two Python frames (it and the offset file's query_offset); ctx = (lock, _queues, */
/* committed, offset file or None: as THE ACK ONE's, the file whose query_offset `committed` is, read in C).   */
/* (A C read of the POP's ConfigCache look-ups was tried here and dropped: its generic attribute look-ups     */
/* cost as much as the Python they replaced.)                                                                */
static PyObject *pop_offset(PyObject *self, PyObject *const *a, Py_ssize_t na) {
    if (na != 2 || !PyTuple_CheckExact(a[0]) || PyTuple_GET_SIZE(a[0]) != 4 || !PyTuple_CheckExact(a[1])
        || PyTuple_GET_SIZE(a[1]) != 3) {
        PyErr_SetString(PyExc_TypeError, "pop_offset(ctx, qkey): ctx a tuple of 4, qkey of 3");
        return NULL;
    }
    if (ak1_init() < 0)
        return NULL;
    PyObject *lock = PyTuple_GET_ITEM(a[0], 0), *queues = PyTuple_GET_ITEM(a[0], 1);
    PyObject *committed_fn = PyTuple_GET_ITEM(a[0], 2), *file = PyTuple_GET_ITEM(a[0], 3), *qkey = a[1];
    if (!PyDict_CheckExact(queues)) {
        PyErr_SetString(PyExc_TypeError, "pop_offset: the buffer's queues are a dict");
        return NULL;
    }
    PyObject *ok = PyObject_CallMethodNoArgs(lock, ak1_n_acquire);
    if (ok == NULL)
        return NULL;
    Py_DECREF(ok);
    PyObject *res = NULL, *committed = file != Py_None
        ? ak1_query(file, PyTuple_GET_ITEM(qkey, 0), PyTuple_GET_ITEM(qkey, 1), PyTuple_GET_ITEM(qkey, 2))
        : PyObject_Call(committed_fn, qkey, NULL);
    if (committed != NULL) {
        PyObject *q = PyDict_GetItemWithError(queues, qkey);  /* borrowed */
        Py_ssize_t len = q == NULL ? (PyErr_Occurred() ? -1 : 0) : PyObject_Size(q);
        if (len == 0) {
            res = Py_NewRef(committed);
        } else if (len > 0) {  /* nxt = q[-1].next_offset; nxt if nxt > committed else committed */
            Py_INCREF(q);
            PyObject *last = PySequence_GetItem(q, len - 1);
            PyObject *nxt = last != NULL ? sf_get_any(last, ak1_n_next) : NULL;
            int gt = nxt != NULL ? PyObject_RichCompareBool(nxt, committed, Py_GT) : -1;
            if (gt >= 0)
                res = Py_NewRef(gt ? nxt : committed);
            Py_XDECREF(last); Py_XDECREF(nxt); Py_DECREF(q);
        }
        Py_DECREF(committed);
    }
    PyObject *et, *ev, *etb;
    PyErr_Fetch(&et, &ev, &etb);  /* the release whatever happened, as `with` does */
    PyObject *rel = PyObject_CallMethodNoArgs(lock, ak1_n_release);
    if (rel == NULL) {
        Py_XDECREF(et); Py_XDECREF(ev); Py_XDECREF(etb);
        Py_CLEAR(res);
        return NULL;
    }
    Py_DECREF(rel);
    PyErr_Restore(et, ev, etb);
    if (PyErr_Occurred())
        Py_CLEAR(res);
    return res;
}
/* ============================ end of THE POP OFFSET =================================================== */

/* ============================================================================================== */
/* THE KOMBU JSON (branch celery-prod): the kombu transport's message body,                       */
/* json.JSONEncoder(separators=(",", ":")).encode(message).encode() in one pass into one buffer    */
/* ============================================================================================== */
/* `Channel._put` sends kombu's message dict as its JSON text (rmq_eventstore/kombu/transport.py,
 * `_MESSAGE_JSON`). The stdlib's C encoder makes a list of items per dict, a new str per key and string
 * and joins the pieces (~90k instructions for a Celery task message of ~900 bytes); this writes the same
 * bytes straight into one buffer. Only the exact types json's C encoder treats as itself are taken: None,
 * True, False, str, int, float, list, tuple, dict with str keys, nested at most KJ_DEPTH deep. Anything
 * else (a subclass, a non-str key, `default`'s objects, a cycle's depth) declines: None, and the caller
 * runs json's encoder, which stays the definition (tests/test_kombu_publish_fastpath.py compares them). */

#define KJ_DEPTH 48

typedef struct {
    char *p;       /* the buffer: `stack` until it outgrows it */
    Py_ssize_t n;  /* bytes written */
    Py_ssize_t cap;
    char *heap;    /* the buffer once on the heap (PyMem), else NULL */
} kjbuf;

static int kj_grow_slow(kjbuf *b, Py_ssize_t need) {
    Py_ssize_t cap = b->cap;
    while (cap < b->n + need) {
        if (cap > PY_SSIZE_T_MAX / 2) return -1;
        cap *= 2;
    }
    char *q = b->heap != NULL ? PyMem_Realloc(b->heap, (size_t)cap) : PyMem_Malloc((size_t)cap);
    if (q == NULL) return -1;
    if (b->heap == NULL) memcpy(q, b->p, (size_t)b->n);
    b->heap = b->p = q;
    b->cap = cap;
    return 0;
}

/* room for `need` more bytes: 0, or -1 (no memory) */
static inline int kj_grow(kjbuf *b, Py_ssize_t need) {
    return b->n + need <= b->cap ? 0 : kj_grow_slow(b, need);
}

static inline int kj_put(kjbuf *b, const char *s, Py_ssize_t n) {
    if (kj_grow(b, n) < 0) return -1;
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += n;
    return 0;
}

static inline int kj_ch(kjbuf *b, char c) {
    if (kj_grow(b, 1) < 0) return -1;
    b->p[b->n++] = c;
    return 0;
}

/* json's S_CHAR: written as it is (printable ASCII but '"' and '\\') */
static unsigned char kj_plain[256];
static int kj_plain_ready = 0;

static void kj_init(void) {
    for (int c = 0; c < 256; c++) kj_plain[c] = c >= ' ' && c <= '~' && c != '"' && c != '\\';
    kj_plain_ready = 1;
}

/* whether the 8 bytes at p are all S_CHAR: none below ' ', none '"', '\\', 0x7f or above */
static inline int kj_plain8(const unsigned char *p) {
    const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
    uint64_t x;
    memcpy(&x, p, 8);
    uint64_t q = x ^ (ones * '"'), s = x ^ (ones * '\\'), d = x + ones;  /* d: 0x7f becomes 0x80 */
    uint64_t bad = ((x - ones * ' ') & ~x) | ((q - ones) & ~q) | ((s - ones) & ~s) | x | d;
    return (bad & high) == 0;
}

/* one char that is not S_CHAR, as ascii_escape_unichar writes it (lower-case hex, a surrogate pair above
 * U+FFFF), at w (room for 12 bytes): where it ends */
static inline char *kj_escape(char *w, Py_UCS4 c) {
    static const char hex[] = "0123456789abcdef";
    *w++ = '\\';
    switch (c) {
    case '\\': *w++ = '\\'; return w;
    case '"': *w++ = '"'; return w;
    case '\b': *w++ = 'b'; return w;
    case '\f': *w++ = 'f'; return w;
    case '\n': *w++ = 'n'; return w;
    case '\r': *w++ = 'r'; return w;
    case '\t': *w++ = 't'; return w;
    default:
        if (c >= 0x10000) {
            Py_UCS4 v = Py_UNICODE_HIGH_SURROGATE(c);
            *w++ = 'u';
            *w++ = hex[(v >> 12) & 0xf];
            *w++ = hex[(v >> 8) & 0xf];
            *w++ = hex[(v >> 4) & 0xf];
            *w++ = hex[v & 0xf];
            c = Py_UNICODE_LOW_SURROGATE(c);
            *w++ = '\\';
        }
        *w++ = 'u';
        *w++ = hex[(c >> 12) & 0xf];
        *w++ = hex[(c >> 8) & 0xf];
        *w++ = hex[(c >> 4) & 0xf];
        *w++ = hex[c & 0xf];
        return w;
    }
}

#define KJ_SPAN 4096  /* chars of a string written per reservation of the worst case (12 bytes a char) */

/* an exact str as py_encode_basestring_ascii writes it: quoted, plain ASCII copied 8 bytes at a time */
static int kj_str(kjbuf *b, PyObject *s) {
    Py_ssize_t len = PyUnicode_GET_LENGTH(s), i = 0;
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    if (kj_ch(b, '"') < 0) return -1;
    while (i < len) {
        Py_ssize_t stop = len - i > KJ_SPAN ? i + KJ_SPAN : len;
        if (kj_grow(b, (stop - i) * (kind == PyUnicode_1BYTE_KIND ? 6 : 12)) < 0) return -1;
        char *w = b->p + b->n;
        if (kind == PyUnicode_1BYTE_KIND) {
            const unsigned char *d = (const unsigned char *)data + i, *e = (const unsigned char *)data + stop;
            while (d < e) {
                if (e - d >= 8) {
                    if (kj_plain8(d)) {
                        memcpy(w, d, 8);
                        w += 8;
                        d += 8;
                        continue;
                    }
                } else if (e - (const unsigned char *)data >= 8 && kj_plain8(e - 8)) {
                    /* the tail of a string of 8 or more: its last 8 bytes are plain, so those before d went out
                     * as they are, just before w: write the 8 again, ending where the tail ends */
                    w += e - d;
                    memcpy(w - 8, e - 8, 8);
                    break;
                }
                unsigned char c = *d++;
                if (kj_plain[c]) *w++ = (char)c;
                else w = kj_escape(w, c);
            }
        } else {
            for (Py_ssize_t j = i; j < stop; j++) {
                Py_UCS4 c = PyUnicode_READ(kind, data, j);
                if (c < 128 && kj_plain[c]) *w++ = (char)c;
                else w = kj_escape(w, c);
            }
        }
        b->n = w - b->p;
        i = stop;
    }
    return kj_ch(b, '"');
}

/* 1 written, 0 declined (nothing the caller may keep), -1 error set */
static int kj_value(kjbuf *b, PyObject *o, int depth) {
    PyTypeObject *t = Py_TYPE(o);
    if (o == Py_None) return kj_put(b, "null", 4) < 0 ? -1 : 1;
    if (o == Py_True) return kj_put(b, "true", 4) < 0 ? -1 : 1;
    if (o == Py_False) return kj_put(b, "false", 5) < 0 ? -1 : 1;
    if (t == &PyUnicode_Type) return kj_str(b, o) < 0 ? -1 : 1;
    if (t == &PyLong_Type) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (v == -1 && PyErr_Occurred()) return -1;
        if (!overflow) {
            char tmp[24], *q = tmp + sizeof tmp;
            unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
            do { *--q = (char)('0' + u % 10); u /= 10; } while (u);
            if (v < 0) *--q = '-';
            return kj_put(b, q, tmp + sizeof tmp - q) < 0 ? -1 : 1;
        }
        PyObject *r = PyLong_Type.tp_repr(o);  /* what json writes: int.__repr__ */
        if (r == NULL) { PyErr_Clear(); return 0; }  /* too many digits, say: json's encoder raises its error */
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(r, &n);
        int rc = s == NULL ? -1 : (kj_put(b, s, n) < 0 ? -1 : 1);
        Py_DECREF(r);
        return rc;
    }
    if (t == &PyFloat_Type) {
        double x = PyFloat_AS_DOUBLE(o);
        if (!Py_IS_FINITE(x)) {  /* allow_nan */
            if (Py_IS_NAN(x)) return kj_put(b, "NaN", 3) < 0 ? -1 : 1;
            return (x > 0 ? kj_put(b, "Infinity", 8) : kj_put(b, "-Infinity", 9)) < 0 ? -1 : 1;
        }
        char *s = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);  /* float.__repr__ */
        if (s == NULL) return -1;
        int rc = kj_put(b, s, (Py_ssize_t)strlen(s)) < 0 ? -1 : 1;
        PyMem_Free(s);
        return rc;
    }
    if (depth >= KJ_DEPTH) return 0;
    if (t == &PyList_Type || t == &PyTuple_Type) {
        int list = t == &PyList_Type;
        Py_ssize_t n = list ? PyList_GET_SIZE(o) : PyTuple_GET_SIZE(o);
        if (n == 0) return kj_put(b, "[]", 2) < 0 ? -1 : 1;
        if (kj_ch(b, '[') < 0) return -1;
        for (Py_ssize_t i = 0; i < n; i++) {
            /* a list cannot change under us: no Python code runs here (only exact types are read) */
            PyObject *v = list ? PyList_GET_ITEM(o, i) : PyTuple_GET_ITEM(o, i);
            if (i && kj_ch(b, ',') < 0) return -1;
            int rc = kj_value(b, v, depth + 1);
            if (rc <= 0) return rc;
        }
        return kj_ch(b, ']') < 0 ? -1 : 1;
    }
    if (t == &PyDict_Type) {
        if (PyDict_GET_SIZE(o) == 0) return kj_put(b, "{}", 2) < 0 ? -1 : 1;
        if (kj_ch(b, '{') < 0) return -1;
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *v;
        while (PyDict_Next(o, &pos, &k, &v)) {
            if (Py_TYPE(k) != &PyUnicode_Type) return 0;  /* json's key conversions: its encoder's */
            if (i++ && kj_ch(b, ',') < 0) return -1;
            if (kj_str(b, k) < 0 || kj_ch(b, ':') < 0) return -1;
            int rc = kj_value(b, v, depth + 1);
            if (rc <= 0) return rc;
        }
        return kj_ch(b, '}') < 0 ? -1 : 1;
    }
    return 0;
}

/* kombu_json(message): json.JSONEncoder(separators=(",", ":")).encode(message).encode() for a dict of the exact
 * types above, or None (declined: json's encoder decides) */
static PyObject *kombu_json(PyObject *self, PyObject *msg) {
    if (!kj_plain_ready) kj_init();
    if (Py_TYPE(msg) != &PyDict_Type) Py_RETURN_NONE;
    char stack[2048];
    kjbuf b = {stack, 0, (Py_ssize_t)sizeof stack, NULL};
    int rc = kj_value(&b, msg, 0);
    PyObject *r = NULL;
    if (rc > 0) r = PyBytes_FromStringAndSize(b.p, b.n);
    else if (rc == 0) r = Py_NewRef(Py_None);
    else if (!PyErr_Occurred()) PyErr_NoMemory();
    if (b.heap != NULL) PyMem_Free(b.heap);
    return r;
}

/* ============================ end of THE KOMBU JSON ================================================== */

static PyMethodDef methods[] = {
    {"java_hash", java_hash_py, METH_O, "Java's String.hashCode of a str (None: a lone surrogate)."},
    {"count_missing_uniq", count_missing_uniq, METH_O, "CommitLog._uniq_keys's count (None: not all Messages)."},
    {"copy_into", copy_into, METH_VARARGS, "dst[pos:pos + len(src)] = src (without the GIL from 64 KiB)."},
    {"populate", populate, METH_VARARGS, "Fault in buf[start:end]'s pages for writing, without the GIL (bytes)."},
    {"init", native_init, METH_VARARGS, "init(Message): look up the slots of the Message dataclass once."},
    {"encode_plain_batch", encode_plain_batch, METH_VARARGS,
     "RecordEncoder.encode_plain_batch's loop: (data, requests, offsets, uniq_keys, queue_offsets, first_q) "
     "or None when the Python reference must decide."},
    {"encode_plain_one", (PyCFunction)(void (*)(void))encode_plain_one, METH_FASTCALL,
     "encode_plain_batch for one message at a known queue offset: (record bytes, DispatchRequest) or None."},
    {"encode_network_batch", encode_network_batch, METH_VARARGS,
     "RecordEncoder.encode_network_batch's loop: as encode_plain_batch, or None when the reference decides."},
    {"index_keys", index_keys, METH_VARARGS,
     "IndexService.build_index's key loop: (int32 hashes, int64 offsets, int64 timestamps) as bytes, or None."},
    {"group_units", group_units, METH_VARARGS,
     "MessageStore._dispatch's grouping: [((topic, queue_id), int64 units bytes)], or None."},
    {"format_ids", format_ids, METH_VARARGS, "UniqueIdGenerator.create_many's formatting (None: not ASCII)."},
    {"cq_pack", cq_pack, METH_VARARGS, "ConsumeQueue._put_small_in_order's check and pack: (bytes, last end) or None."},
    {"put_index_entries", put_index_entries, METH_VARARGS,
     "IndexFile._put_hash per entry into the mapped file: (written, slots used, begin phy or None, begin ts)."},
    {"skim_records", skim_records, METH_VARARGS, "codec.skim_records's walk (states passed in)."},
    {"crc32", crc32_py, METH_VARARGS, "zlib.crc32(data, value)."},
    /* verify (store/repair.py): the block above the table */
    {"verify_crc32", verify_crc32, METH_VARARGS, "zlib.crc32(data), folded with PCLMULQDQ when the CPU has it."},
    {"verify_scan", verify_scan, METH_VARARGS,
     "_verify_commit_log's walk: (next_pos, state, reason, records, undecided trailer positions) or None."},
    {"verify_units", verify_units, METH_VARARGS,
     "_verify_consume_queues' unit loop over a span: (held, [(q, offset, size, tags) the reference decides])."},
    {"verify_index", verify_index, METH_VARARGS,
     "_verify_index's entry loop over a span: [(i, hash, phy) the reference decides]."},
    /* THE PULL READ (branch pull-native) */
    {"init_pull", init_pull, METH_VARARGS, "init_pull(MessageExt): look up the slots of MessageExt once."},
    {"decode_records", decode_records_c, METH_VARARGS,
     "codec.decode_records' fast branch: appends MessageExts to out from pos; returns where it stopped."},
    {"read_runs", read_runs, METH_VARARGS,
     "MessageStore._get_matching_all's loop on raw units: (status, taken, total, max_pulled, body, layout) or None."},
    /* end of THE PULL READ */
    REMOTING_METHODS
    /* the single put (branch put-single) */
    {"single_init", single_init, METH_VARARGS,
     "single_init(AppendMessageResult, PutMessageResult, AppendMessageStatus.PUT_OK, PutMessageStatus.PUT_OK)."},
    {"take_requests", (PyCFunction)(void (*)(void))take_requests, METH_FASTCALL,
     "ReputMessageService._take_pending's walk over request chunks: (offset, taken)."},
    /* SLOT FIELDS (branch send-core): the block above the table */
    {"slot_getattr", (PyCFunction)(void (*)(void))slot_getattr, METH_FASTCALL,
     "getattr(o, name) as the dispatch pass reads a field: by slot offset when the generic protocol would read that slot."},
    {"slot_setattr", (PyCFunction)(void (*)(void))slot_setattr, METH_FASTCALL,
     "setattr(o, name, value) as the dispatch pass writes a field: by slot offset when the generic protocol would."},
    {"slot_getattr_any", (PyCFunction)(void (*)(void))slot_getattr_any, METH_FASTCALL,
     "slot_getattr with the (name, type) table single_attr_i64 and the single put's hand-off use."},
    {"slot_setattr_any", (PyCFunction)(void (*)(void))slot_setattr_any, METH_FASTCALL,
     "slot_setattr with the (name, type) table single_set_i64 and the single put's hand-off use."},
    {"uniq_create", uniq_create, METH_O, "UniqueIdGenerator.create's fast path: the id, or None (create() claims)."},
    {"append_one", (PyCFunction)(void (*)(void))append_one, METH_FASTCALL,
     "CommitLog._append_one's locked body: PutMessageResult(PUT_OK, AppendMessageResult) or None."},
    /* THE BATCH SEND (branch send-batch) */
    {"decode_batch_messages", (PyCFunction)(void (*)(void))decode_batch_messages, METH_FASTCALL,
     "codec.decode_batch_messages_py: the Messages of a SEND_BATCH_MESSAGE body (None: the reference decides)."},
    {"join_message_ids", join_message_ids, METH_VARARGS,
     "message_id.join_message_ids_py: a batch's comma-joined offsetMsgIds (None: the reference decides)."},
    {"encode_batch_body", encode_batch_body, METH_O,
     "codec.encode_batch_body_py: a SEND_BATCH_MESSAGE body (None: the reference decides)."},
    {"encode_batch_messages", encode_batch_messages, METH_VARARGS,
     "Producer._batch_body_py for Messages without a properties_string: (body, ids), or None."},
    {"decorate_batch", decorate_batch, METH_VARARGS,
     "SendMessageProcessor._store's loop for a plain batch: True when done, False when the loop must decide."},
    /* end of THE BATCH SEND */
    /* THE NETWORK SINGLE PUT (branch send-single) */
    {"put_one", (PyCFunction)(void (*)(void))put_one, METH_FASTCALL,
     "put_one(commit_log, msg, uniq_ids, encoder, put_lock, file_size, flush_wakeup): CommitLog.put_message's "
     "native path: None (not taken), (uniq,) (declined) or the PutMessageResult."},
    {"append_one_net", (PyCFunction)(void (*)(void))append_one_net, METH_FASTCALL,
     "CommitLog._append_one_net's locked body (a message with a properties string): PutMessageResult or None."},
    /* end of THE NETWORK SINGLE PUT */
    /* POP receipt handles (client/pop_consumer.py): the block above the table */
    {"pop_set_handles", pop_set_handles, METH_VARARGS,
     "PopConsumer.pop's handle loop: (msgs, start, MessageExt, topic, leads) -> first index not handled."},
    {"pop_ack_scan", pop_ack_scan, METH_VARARGS,
     "PopConsumer._ack_requests' loop: (msgs, start, MessageExt, lead, acks) -> first index not handled."},
    /* POP offsets (broker/pop_service.py, pop_buffer.py, common/pop.py): the block above the table */
    {"offsets_text", offsets_text, METH_VARARGS, "offsets_text(start, stop) -> ','.join(map(str, range(start, stop)))."},
    {"int_run", int_run, METH_O, "int_run(value) -> value is a non-empty list of exact ints, each the one before + 1."},
    /* THE DISPATCH PASS (branch dispatch-native): the block above the table */
    {"dispatch_singles", (PyCFunction)(void (*)(void))dispatch_singles, METH_FASTCALL,
     "ReputMessageService's pass over single puts' requests: (taken, grown or None, bytes behind)."},
    /* THE SEND LANE (branch lane-native): the block above the table */
    {"send_lane", (PyCFunction)(void (*)(void))send_lane, METH_FASTCALL,
     "SendMessageProcessor.lane in C: None (the Python lane decides), the response frame, or (cmd, result, queue_id)."},
    {"send_frame", (PyCFunction)(void (*)(void))send_frame, METH_FASTCALL,
     "send_lane for a read that is one SEND_MESSAGE_V2 frame, from its bytes: None, the frame, or (cmd, result, qid)."},
    /* THE HALF LANE (branch half-lane): the block above the table */
    /* THE CLIENT SEND (branch client-send): the block above the table */
    {"client_send_frame", (PyCFunction)(void (*)(void))client_send_frame, METH_FASTCALL,
     "client_send_frame(msg, uniq, group, queue_id, opaque, born_ms[, extra, sys_flag]): Producer.send's (or a half message's) SEND_MESSAGE_V2 frame, or None."},
    {"client_send_take", (PyCFunction)(void (*)(void))client_send_take, METH_FASTCALL,
     "client_send_take(buf, n, opaque): (msgId, queue id or None, queue offset) of a lone SUCCESS response, or None."},
    {"client_take_response", (PyCFunction)(void (*)(void))client_take_response, METH_FASTCALL,
     "client_take_response(buf, n, opaque): the RemotingCommand of a lone caller's read holding just its response, or None."},
    {"client_new_request", (PyCFunction)(void (*)(void))client_new_request, METH_FASTCALL,
     "client_new_request(code, ext, body, opaque, flag): RemotingCommand.request's command, or None (Python decides)."},
    /* THE POP LANE (branch pop-lane): the block above the table */
    {"pop_frame", (PyCFunction)(void (*)(void))pop_frame, METH_FASTCALL,
     "pop_frame(data, max_frame, max_header, buffered): a lone POP_MESSAGE frame's fields, or None."},
    {"pop_response", (PyCFunction)(void (*)(void))pop_response, METH_FASTCALL,
     "pop_response(code, opaque, version, remark, popTime, ...): a POP response frame, or None (Python encodes)."},
    /* THE ACK LANE (branch ack-lane): the block above the table */
    {"ack_body", ack_body, METH_O,
     "ack_body(body): a BATCH_ACK_MESSAGE body's entries (c, t, retry, so, q, rq, pt, it, first bit, bit count), or None."},
    {"ack_frame", (PyCFunction)(void (*)(void))ack_frame, METH_FASTCALL,
     "ack_frame(data, max_frame, max_header, buffered): one ACK_MESSAGE / BATCH_ACK_MESSAGE request frame's fields, or None."},
    /* THE POP CLIENT (branch pop-client): the block above the table */
    {"pop_request_frame", (PyCFunction)(void (*)(void))pop_request_frame, METH_FASTCALL,
     "pop_request_frame(group, topic, queue_id, max_nums, invisible_time, poll_time, tags, opaque): PopConsumer.pop's POP_MESSAGE frame, or None."},
    {"pop_take", (PyCFunction)(void (*)(void))pop_take, METH_FASTCALL,
     "pop_take(topic, broker_name, buf, n, opaque): the messages of a lone SUCCESS POP response, handles set, or None."},
    {"pop_ack_take", (PyCFunction)(void (*)(void))pop_ack_take, METH_FASTCALL,
     "pop_ack_take(buf, n, opaque): True when a lone caller's read is just its SUCCESS response, or None."},
    {"pop_ack_frame", (PyCFunction)(void (*)(void))pop_ack_frame, METH_FASTCALL,
     "pop_ack_frame(msgs, MessageExt, topic, group, opaque): PopConsumer.ack_batch's BATCH_ACK_MESSAGE frame, or None."},
    /* THE POP CORE (branch pop-core): the block above the table */
    {"pop_register", (PyCFunction)(void (*)(void))pop_register, METH_FASTCALL,
     "pop_register(PopCheckPoint, _Entry, deque, by_key, queues, qkey, fd, group, topic, q, offset, end, ...): "
     "a contiguous pop registered in the POP buffer: (journal bytes, scan, startOffsetInfo item, msgOffsetInfo item) or None."},
    {"ack_settle", (PyCFunction)(void (*)(void))ack_settle, METH_FASTCALL,
     "ack_settle(by_key, key, start, stop, fd): PopBufferMergeService.ack_one for a contiguous entry: (journal bytes, "
     "settled) or None."},
    {"end_commit_props", (PyCFunction)(void (*)(void))end_commit_props, METH_FASTCALL,
     "end_commit_props(props, queue_offset, drop_crc): an END COMMIT's record properties from its half's, "
     "(commit_props, real_topic, real_qid), or None (THE END LANE)."},
    {"end_index_have", (PyCFunction)(void (*)(void))end_index_have, METH_FASTCALL,
     "end_index_have(mm, size, slot_num, count, begin_ts, entries_base, keys, found): have_candidates' walk "
     "of one index file (found set in place), the keys still not found, or None (THE END LANE)."},
    {"end_props_dict", (PyCFunction)end_props_dict, METH_O,
     "end_props_dict(props): string_to_properties(props) for an ASCII string, else None (THE END LANE)."},
    /* THE END FRAME (branch end-lane2): the block above the table */
    {"end_frame", (PyCFunction)(void (*)(void))end_frame, METH_FASTCALL,
     "end_frame(data, pos, (ctx, hold, max_frame, max_header, buffered)): a one-way END_TRANSACTION frame at pos "
     "served (the position after it), or None (THE END FRAME)."},
    {"client_lone_init", (PyCFunction)client_lone_init, METH_O,
     "client_lone_init(globals): remoting_client's module dict, for client_lone (THE LONE CALLER)."},
    {"pop_lone", (PyCFunction)(void (*)(void))pop_lone, METH_FASTCALL,
     "pop_lone(conn, opaques, group, topic, queue_id, max_nums, invisible_time, poll_time, tags, timeout, take, "
     "broker_name): pop_request_frame + client_lone in one call, or None (THE LONE CALLER)."},
    {"ack_lone", (PyCFunction)(void (*)(void))ack_lone, METH_FASTCALL,
     "ack_lone(conn, opaques, msgs, cls, topic, group, timeout, take): pop_ack_frame + client_lone in one call, "
     "or None (THE LONE CALLER)."},
    {"client_lone", (PyCFunction)(void (*)(void))client_lone, METH_FASTCALL,
     "client_lone(conn, frame, opaque, code, timeout, take, *args): ClientConnection.invoke_frame of a lone caller "
     "in one call (take called as take(*args, buf, n, opaque)), or None, nothing done (THE LONE CALLER)."},
    /* THE POP READ (branch pop-broker): the block above the table */
    {"pop_read", (PyCFunction)(void (*)(void))pop_read, METH_FASTCALL,
     "pop_read(cq, offset, want, commit_log, max_total, total_ram, mem_ratio, mem_bytes, mem_count, disk_bytes, "
     "disk_count): PopService.pop_now's read of one queue (get_units_raw + read_runs), or None."},
    {"queue_max", (PyCFunction)queue_max, METH_O,
     "queue_max(cq): cq.get_max_offset_in_queue(), or None."},
    {"queue_live", (PyCFunction)(void (*)(void))queue_live, METH_FASTCALL,
     "queue_live(cq_table, plan, first): the queues of plan (rotated by first) that exist and hold something, "
     "[(topic, queue_id, retry, cq, max offset)], or None."},
    /* THE KOMBU JSON (branch celery-prod): the block above the table */
    {"kombu_json", (PyCFunction)kombu_json, METH_O,
     "kombu_json(message): json.JSONEncoder(separators=(',', ':')).encode(message).encode() for a dict of exact "
     "JSON types, or None (json's encoder decides)."},
    {"pop_queue", (PyCFunction)(void (*)(void))pop_queue, METH_FASTCALL,
     "pop_queue(cq, top, pop_offset, want, topic, queue_id, qkey, retry, ctx): PopService.pop_now's read and "
     "registration of one queue: None, (offset, max_offset, lo[, read]) or (start, info, body, n, end, max_offset)."},
    {"ack_one", (PyCFunction)(void (*)(void))ack_one, METH_FASTCALL,
     "ack_one(got, ctx): AckMessageProcessor.lane + PopBufferMergeService.ack_one for an ACK_MESSAGE or a one-entry "
     "BATCH_ACK settled in the buffer: True, or None (nothing changed: the Python lane decides)."},
    {"pop_offset", (PyCFunction)(void (*)(void))pop_offset, METH_FASTCALL,
     "pop_offset(ctx, qkey): PopBufferMergeService.pop_offset under the buffer's lock; ctx (lock, queues, committed, "
     "offset file or None)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "rmq_eventstore._native",
    "The store's per-record loops in C; rmq_eventstore.common.codec decides whether they are used.", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    crc_init();
    PyObject *m = PyModule_Create(&moduledef);
    /* THE BATCH SEND: decode_batch_messages sets this many Message slots (codec checks the dataclass has no more) */
    if (m != NULL && PyModule_AddIntConstant(m, "MESSAGE_FIELD_COUNT", F_COUNT) < 0) Py_CLEAR(m);
    if (m != NULL && pe_add_type(m) < 0) Py_CLEAR(m);  /* THE POP ENTRY */
    return m;
}
