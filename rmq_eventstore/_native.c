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
 *   count_missing_uniq  CommitLog._uniq_keys's count of messages the store gives a UNIQ_KEY
 *   append_one          CommitLog._append_one's locked body (a single put: file, queue offset, record, hand-off)
 *   uniq_create         UniqueIdGenerator.create's fast path (a single put's UNIQ_KEY)
 *   take_requests       ReputMessageService._take_pending's walk over a run of request chunks
 *
 * Plain CPython C API. CRC-32 comes from zlib when its header is there at build time (setup.py defines
 * RMQ_HAVE_ZLIB), else from the slice-by-8 loop below (the same values, about half as fast).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
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
/* big-endian writers / readers                                                                     */
static inline void put_i32(unsigned char *p, int32_t v) {
    uint32_t u = (uint32_t)v;
    p[0] = (unsigned char)(u >> 24); p[1] = (unsigned char)(u >> 16);
    p[2] = (unsigned char)(u >> 8); p[3] = (unsigned char)u;
}
static inline void put_i64(unsigned char *p, int64_t v) {
    uint64_t u = (uint64_t)v;
    for (int k = 7; k >= 0; k--) { p[k] = (unsigned char)u; u >>= 8; }
}
static inline void put_i16(unsigned char *p, int v) {
    p[0] = (unsigned char)((unsigned)v >> 8); p[1] = (unsigned char)v;
}
static inline int32_t get_i32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}
static inline int64_t get_i64(const unsigned char *p) {
    uint64_t u = 0;
    for (int k = 0; k < 8; k++) u = (u << 8) | p[k];
    return (int64_t)u;
}
static inline int16_t get_i16(const unsigned char *p) { return (int16_t)(((unsigned)p[0] << 8) | p[1]); }

/* The 20-byte `__CRC32#` trailer (codec.crc_trailer) of the record at `rec`, `total` bytes long: written
 * into its last 20 bytes from the CRC of the bytes before them (codec.fill_crc_trailer). */
#define CRC_RESERVED 20
static void fill_crc_trailer(unsigned char *rec, Py_ssize_t total) {
    Py_ssize_t end = total - CRC_RESERVED;
    uint32_t c = crc32_update(0, rec, end) & 0x7FFFFFFFu;
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

static PyObject *native_init(PyObject *self, PyObject *args) {
    PyObject *tp;
    if (!PyArg_ParseTuple(args, "O!", &PyType_Type, &tp)) return NULL;
    Py_ssize_t offs[F_COUNT];
    for (int i = 0; i < F_COUNT; i++) {
        PyObject *d = PyObject_GetAttrString(tp, field_names[i]);
        if (d == NULL) return NULL;
        if (Py_TYPE(d) != &PyMemberDescr_Type) {
            Py_DECREF(d);
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot", ((PyTypeObject *)tp)->tp_name, field_names[i]);
            return NULL;
        }
        PyMemberDef *md = ((PyMemberDescrObject *)d)->d_member;
        if (md->type != T_OBJECT_EX && md->type != T_OBJECT) {
            Py_DECREF(d);
            PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot", ((PyTypeObject *)tp)->tp_name,
                         field_names[i]);
            return NULL;
        }
        offs[i] = md->offset;
        Py_DECREF(d);
    }
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

#define MAX_QUEUES 4096

/* ---------------------------------------------------------------------------------------------- */
/* Java String.hashCode over a str's UTF-16 code units, continuing from h; -1 for a lone surrogate  */
static inline int java_hash_append(PyObject *s, Py_ssize_t start, Py_ssize_t end, uint32_t *h) {
    int kind = PyUnicode_KIND(s);
    const void *d = PyUnicode_DATA(s);
    uint32_t x = *h;
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *c = (const Py_UCS1 *)d;
        for (Py_ssize_t i = start; i < end; i++) x = 31u * x + c[i];
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
            PyObject *qkey = PyUnicode_FromFormat("%U-%d", topic, (int)r->qid);
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

/* whether `needle` (nl > 0 bytes) occurs in `h` (n bytes) */
static int memmem_simple(const char *h, Py_ssize_t n, const char *needle, Py_ssize_t nl) {
    for (Py_ssize_t p = 0; p + nl <= n; p++)
        if (h[p] == needle[0] && memcmp(h + p, needle, nl) == 0) return 1;
    return 0;
}

/* the value of the last "\x02NAME\x01" in "\x02" + props (UTF-8): 1 found non-empty, 0 absent, -1 empty */
static int find_prop(const char *u, Py_ssize_t n, const char *name, Py_ssize_t nl, Py_ssize_t *at, Py_ssize_t *len) {
    for (Py_ssize_t p = n - nl; p >= 0; p--) {
        if ((p == 0 || u[p - 1] == 2) && memcmp(u + p, name, nl) == 0) {
            Py_ssize_t v = p + nl, e = v;
            while (e < n && u[e] != 2) e++;
            if (e == v) return -1;
            *at = v;
            *len = e - v;
            return 1;
        }
    }
    *at = -1;
    *len = 0;
    return 0;
}

static PyObject *encode_network_batch(PyObject *self, PyObject *args) {
    PyObject *msgs, *queue_table, *topics, *tags_cache, *tags_fn, *request_type, *parse_host, *schedule_topic;
    long long base, now, max_body, max_record;
    const char *store_addr; Py_ssize_t addr_len;
    int store_port, append_crc;
    if (!PyArg_ParseTuple(args, "OO!LLO!y#iLLO!OO!OUp", &msgs, &PyDict_Type, &queue_table, &base, &now,
                          &PyDict_Type, &topics, &store_addr, &addr_len, &store_port, &max_body, &max_record,
                          &PyDict_Type, &tags_cache, &tags_fn, &PyType_Type, &request_type, &parse_host,
                          &schedule_topic, &append_crc))
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
    const int store_v6 = addr_len == 16 ? 0x20 : 0;
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
        if (Py_TYPE(m) != message_type) goto decline;
        PyObject *topic = field(m, F_TOPIC), *body = field(m, F_BODY), *ps = field(m, F_PROPERTIES_STRING);
        if (topic == NULL || body == NULL || ps == NULL || !PyUnicode_CheckExact(topic) ||
            !PyBytes_CheckExact(body) || !PyUnicode_CheckExact(ps))
            goto decline;
        PyObject *tp = PyDict_GetItemWithError(topics, topic);
        if (tp == NULL) { PyErr_Clear(); goto decline; }
        if (!PyTuple_CheckExact(tp) || PyTuple_GET_SIZE(tp) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(tp, 0)))
            goto decline;
        PyObject *fv = field(m, F_FORCE_V2);
        if (fv == NULL || is_falsy_default(fv) != 1) goto decline;
        int64_t v;
        PyObject *o = field(m, F_SYS_FLAG);
        if (o == NULL || !as_i64(o, INT32_MIN, INT32_MAX, &v)) goto decline;
        int32_t sys_flag = (int32_t)v;
        int tx = sys_flag & 0xC;
        if (tx != 0 && tx != 0x8) goto decline;
        int cmp = PyUnicode_Compare(topic, schedule_topic);
        if (cmp == -1 && PyErr_Occurred()) { PyErr_Clear(); goto decline; }
        if (cmp == 0) goto decline;
        r->pu = PyUnicode_AsUTF8AndSize(ps, &r->pl);
        if (r->pu == NULL) { PyErr_Clear(); goto decline; }
        if (find_prop(r->pu, r->pl, "TAGS\x01", 5, &r->tags_at, &r->tags_len) < 0 ||
            find_prop(r->pu, r->pl, "KEYS\x01", 5, &r->keys_at, &r->keys_len) < 0 ||
            find_prop(r->pu, r->pl, "UNIQ_KEY\x01", 9, &r->uniq_at, &r->uniq_len) < 0)
            goto decline;
        if (!as_i64(PyTuple_GET_ITEM(tp, 1), INT32_MIN, INT32_MAX, &v)) goto decline;
        r->magic = (int32_t)v;
        r->topic_part = PyBytes_AS_STRING(PyTuple_GET_ITEM(tp, 0));
        r->topic_part_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(tp, 0));
        PyObject *born = field(m, F_BORN_HOST);
        if (born == NULL) goto decline;
        int bf = is_falsy_default(born);
        if (bf < 0) goto decline;
        if (!bf) {
            if (!PyUnicode_CheckExact(born)) goto decline;
            PyObject *h = PyObject_CallOneArg(parse_host, born);
            if (h == NULL) { PyErr_Clear(); goto decline; }
            int64_t port;
            if (!PyTuple_CheckExact(h) || PyTuple_GET_SIZE(h) != 2 || !PyBytes_CheckExact(PyTuple_GET_ITEM(h, 0)) ||
                (PyBytes_GET_SIZE(PyTuple_GET_ITEM(h, 0)) != 4 && PyBytes_GET_SIZE(PyTuple_GET_ITEM(h, 0)) != 16) ||
                !as_i64(PyTuple_GET_ITEM(h, 1), INT32_MIN, INT32_MAX, &port)) {
                Py_DECREF(h);
                goto decline;
            }
            r->born_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(h, 0));
            memcpy(r->born_addr, PyBytes_AS_STRING(PyTuple_GET_ITEM(h, 0)), r->born_len);
            r->born_port = (int32_t)port;
            Py_DECREF(h);
        } else {
            r->born_len = addr_len;
            memcpy(r->born_addr, store_addr, addr_len);
            r->born_port = store_port;
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
            goto decline;
        r->qid = (int32_t)qid; r->flag = (int32_t)flag; r->born_ts = bts ? bts : now;
        r->reconsume = (int32_t)rc; r->ptx = ptx;
        r->topic = topic; r->body = body; r->ps = ps;
        r->plen = r->pl;
        if (reserved) {
            /* a __CRC32# already there: the general path deletes it; else a 0x02 closes the last property */
            if (r->pl >= 8 && memmem_simple(r->pu, r->pl, "__CRC32#", 8)) goto decline;
            if (r->pl && r->pu[r->pl - 1] != 2) r->plen++;
            r->plen += reserved;
        }
        Py_ssize_t bl = PyBytes_GET_SIZE(body);
        Py_ssize_t total = r->hsize + bl + r->topic_part_len + 2 + r->plen;
        if (r->plen > 32767 || bl > max_body || total > max_record || total > INT32_MAX) goto decline;
        r->total = total;
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
            PyObject *qkey = PyUnicode_FromFormat("%U-%d", topic, (int)r->qid);
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
        sum += total;
        if (sum > PY_SSIZE_T_MAX / 2) goto decline;
    }
    if (base < 0 || base > INT64_MAX - sum) goto decline;
    data = PyBytes_FromStringAndSize(NULL, sum);
    requests = PyList_New(n);
    offsets = PyList_New(n);
    uniqs = PyList_New(n);
    seen = PyDict_New();
    if (data == NULL || requests == NULL || offsets == NULL || uniqs == NULL || seen == NULL) goto fail;
    PyObject *now_obj = PyLong_FromLongLong(now), *zero = PyLong_FromLong(0);
    if (now_obj == NULL || zero == NULL) { Py_XDECREF(now_obj); Py_XDECREF(zero); goto fail; }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(data);
    int64_t phys = base;
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        net_rec *r = &recs[i];
        unsigned char *p = out;
        const unsigned char *body = (const unsigned char *)PyBytes_AS_STRING(r->body);
        Py_ssize_t bl = PyBytes_GET_SIZE(r->body);
        put_i32(p, (int32_t)r->total); put_i32(p + 4, r->magic);
        put_i32(p + 8, (int32_t)(crc32_update(0, body, bl) & 0x7FFFFFFFu));
        put_i32(p + 12, r->qid); put_i32(p + 16, r->flag);
        put_i64(p + 20, r->q); put_i64(p + 28, phys); put_i32(p + 36, r->sys_flag); put_i64(p + 40, r->born_ts);
        p += 48;
        memcpy(p, r->born_addr, r->born_len); p += r->born_len; put_i32(p, r->born_port); p += 4;
        put_i64(p, now); p += 8;
        memcpy(p, store_addr, addr_len); p += addr_len; put_i32(p, store_port); p += 4;
        put_i32(p, r->reconsume); put_i64(p + 4, r->ptx); put_i32(p + 12, (int32_t)bl); p += 16;
        memcpy(p, body, bl); p += bl;
        memcpy(p, r->topic_part, r->topic_part_len); p += r->topic_part_len;
        put_i16(p, (int)r->plen); p += 2;
        memcpy(p, r->pu, r->pl);
        if (reserved) {
            if (r->plen - reserved > r->pl) p[r->pl] = 2;
            fill_crc_trailer(out, r->total);
        }
        out += r->total;
        PyObject *tags = NULL, *keys = NULL, *uniq = NULL, *code = NULL;
        if (r->tags_at >= 0) tags = PyUnicode_DecodeUTF8(r->pu + r->tags_at, r->tags_len, "strict");
        keys = r->keys_at >= 0 ? PyUnicode_DecodeUTF8(r->pu + r->keys_at, r->keys_len, "strict") : Py_NewRef(Py_None);
        uniq = r->uniq_at >= 0 ? PyUnicode_DecodeUTF8(r->pu + r->uniq_at, r->uniq_len, "strict") : Py_NewRef(Py_None);
        if (r->tags_at >= 0) {
            if (tags != NULL) {
                code = PyDict_GetItemWithError(tags_cache, tags);
                if (code != NULL) Py_INCREF(code);
                else if (!PyErr_Occurred()) code = PyObject_CallOneArg(tags_fn, tags);
            }
        } else code = Py_NewRef(zero);
        Py_XDECREF(tags);
        PyObject *phys_obj = PyLong_FromLongLong(phys);
        PyObject *qid_obj = PyLong_FromLong(r->qid), *total_obj = PyLong_FromSsize_t(r->total);
        PyObject *q_obj = PyLong_FromLongLong(r->q), *sys_obj = PyLong_FromLong(r->sys_flag);
        PyObject *ptx_obj = PyLong_FromLongLong(r->ptx);
        PyObject *req = rtype->tp_alloc(rtype, 12);
        if (keys == NULL || uniq == NULL || code == NULL || phys_obj == NULL || qid_obj == NULL ||
            total_obj == NULL || q_obj == NULL || sys_obj == NULL || ptx_obj == NULL || req == NULL) {
            Py_XDECREF(keys); Py_XDECREF(uniq); Py_XDECREF(code); Py_XDECREF(phys_obj); Py_XDECREF(qid_obj);
            Py_XDECREF(total_obj); Py_XDECREF(q_obj); Py_XDECREF(sys_obj); Py_XDECREF(ptx_obj); Py_XDECREF(req);
            ok = 0;
            break;
        }
        PyTuple_SET_ITEM(req, 0, Py_NewRef(r->topic));
        PyTuple_SET_ITEM(req, 1, qid_obj);
        PyTuple_SET_ITEM(req, 2, Py_NewRef(phys_obj));
        PyTuple_SET_ITEM(req, 3, total_obj);
        PyTuple_SET_ITEM(req, 4, code);
        PyTuple_SET_ITEM(req, 5, Py_NewRef(now_obj));
        PyTuple_SET_ITEM(req, 6, q_obj);
        PyTuple_SET_ITEM(req, 7, keys);
        PyTuple_SET_ITEM(req, 8, Py_NewRef(uniq));
        PyTuple_SET_ITEM(req, 9, sys_obj);
        PyTuple_SET_ITEM(req, 10, ptx_obj);
        PyTuple_SET_ITEM(req, 11, Py_NewRef(r->ps));
        PyObject_GC_UnTrack(req);  /* str, int and None only (see encode_plain_batch) */
        PyList_SET_ITEM(requests, i, req);
        PyList_SET_ITEM(offsets, i, phys_obj);
        PyList_SET_ITEM(uniqs, i, uniq);
        phys += r->total;
    }
    Py_DECREF(now_obj); Py_DECREF(zero);
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
    /* The entries are written without the GIL (page faults on fresh index pages then overlap with the put
       thread). Only the dispatch thread writes the last index file; a reader (select_by_hash) follows a
       slot to its entry, so each entry is stored before its slot points at it (release fence). */
    Py_BEGIN_ALLOW_THREADS
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
    Py_END_ALLOW_THREADS
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
                c = crc32_update(0, b + bpos, body_len) & 0x7FFFFFFFu;
                Py_END_ALLOW_THREADS
            } else c = crc32_update(0, b + bpos, body_len) & 0x7FFFFFFFu;
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
                    c = crc32_update(0, p, total - 20) & 0x7FFFFFFFu;
                    Py_END_ALLOW_THREADS
                } else c = crc32_update(0, p, total - 20) & 0x7FFFFFFFu;
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
    Py_BEGIN_ALLOW_THREADS
    c = crc32_update(value, view.buf, view.len);
    Py_END_ALLOW_THREADS
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
static int single_attr_i64(PyObject *o, PyObject *name, int64_t lo, int64_t hi, int64_t *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    int ok = PyLong_CheckExact(v) && as_i64(v, lo, hi, out);
    Py_DECREF(v);
    return ok;
}

static int single_set_i64(PyObject *o, PyObject *name, int64_t v) {
    PyObject *x = PyLong_FromLongLong(v);
    if (x == NULL) return -1;
    int r = PyObject_SetAttr(o, name, x);
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

static int slot_offsets(PyObject *tp, const char **names, int n, Py_ssize_t *out) {
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

/* `on_appended(base, end, reqs)` when it is ReputMessageService.notify_appended of some service: what that
 * method does, without its frame: under MAX_PENDING pending requests the chunk goes to `_pending` and
 * `_pending_count` grows; the first hand-off since the loop last woke (`_signalled` false) sets `_wakeup`.
 * 1: done; 0: `cb` is something else (the caller calls it); -1: error. The chunk is untracked (ints and
 * an untracked tuple). */
static PyObject *h_pending, *h_count, *h_signalled, *h_wakeup, *h_append, *h_set;

static int single_handoff(PyObject *cb, PyObject *base_obj, PyObject *end_obj, PyObject *reqs) {
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
        PyObject *pend = PyObject_GetAttr(svc, h_pending);
        if (pend == NULL) return -1;
        PyObject *chunk = PyTuple_Pack(3, base_obj, end_obj, reqs);
        if (chunk == NULL) { Py_DECREF(pend); return -1; }
        PyObject_GC_UnTrack(chunk);
        PyObject *r = PyObject_CallMethodOneArg(pend, h_append, chunk);
        Py_DECREF(chunk); Py_DECREF(pend);
        if (r == NULL) return -1;
        Py_DECREF(r);
        if (single_set_i64(svc, h_count, count + PyTuple_GET_SIZE(reqs)) < 0) return -1;
    }
    PyObject *sig = PyObject_GetAttr(svc, h_signalled);
    if (sig == NULL) return -1;
    int is_set = PyObject_IsTrue(sig);
    Py_DECREF(sig);
    if (is_set < 0) return -1;
    if (!is_set) {
        if (PyObject_SetAttr(svc, h_signalled, Py_True) < 0) return -1;
        PyObject *ev = PyObject_GetAttr(svc, h_wakeup);
        if (ev == NULL) return -1;
        PyObject *r = PyObject_CallMethodNoArgs(ev, h_set);
        Py_DECREF(ev);
        if (r == NULL) return -1;
        Py_DECREF(r);
    }
    return 1;
}

static PyObject *append_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) { PyErr_SetString(PyExc_TypeError, "append_one takes 5 arguments"); return NULL; }
    if (message_type == NULL || amr_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_native.init() / single_init() was not called");
        return NULL;
    }
    if (single_names() < 0) return NULL;
    PyObject *cl = args[0], *msg = args[1], *u = args[2], *ctx = args[3];
    int64_t file_size, port, sys_flag, max_body, max_record, pos, from;
    if (Py_TYPE(msg) != message_type || !as_i64(args[4], 1, INT32_MAX, &file_size)) Py_RETURN_NONE;
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

    /* the current file: files[-1], with room beyond the END_FILE_MIN_BLANK_LENGTH */
    PyObject *mfq = PyObject_GetAttr(cl, s_mfq);
    if (mfq == NULL) return NULL;
    PyObject *files = PyObject_GetAttr(mfq, s_mapped_files);
    Py_DECREF(mfq);
    if (files == NULL) return NULL;
    if (!PyList_CheckExact(files) || PyList_GET_SIZE(files) == 0) { Py_DECREF(files); Py_RETURN_NONE; }
    PyObject *mf = Py_NewRef(PyList_GET_ITEM(files, PyList_GET_SIZE(files) - 1));
    Py_DECREF(files);
    PyObject *result = NULL, *table = NULL, *key = NULL, *req = NULL, *base_obj = NULL, *now_obj = NULL;
    plain_rec r;
    memset(&r, 0, sizeof r);
    int got = single_attr_i64(mf, s_wrote_position, 0, file_size, &pos);
    if (got <= 0) goto done;
    if (file_size - pos <= 8) { got = 0; goto done; }  /* END_FILE_MIN_BLANK_LENGTH: the general path rolls */
    /* the queue: topic_queue_table[f"{topic}-{queue_id}"] */
    PyObject *topic = field(msg, F_TOPIC), *qid = field(msg, F_QUEUE_ID);
    if (topic == NULL || qid == NULL || !PyUnicode_CheckExact(topic) || !PyLong_CheckExact(qid)) { got = 0; goto done; }
    table = PyObject_GetAttr(cl, s_table);
    if (table == NULL) { got = -1; goto done; }
    if (!PyDict_CheckExact(table)) { got = 0; goto done; }
    key = single_queue_key(topic, qid);
    if (key == NULL) { got = -1; goto done; }
    PyObject *qo = PyDict_GetItemWithError(table, key);
    if (qo == NULL) { got = PyErr_Occurred() ? -1 : 0; goto done; }  /* a new queue: the general path */
    int64_t q;
    if (!PyLong_CheckExact(qo) || !as_i64(qo, 0, INT64_MAX - 1, &q)) { got = 0; goto done; }
    got = single_attr_i64(mf, s_file_from_offset, 0, INT64_MAX - file_size, &from);
    if (got <= 0) goto done;
    int64_t base = from + pos;
    got = plain_prepare(msg, u, topics, hsize, reserved, max_body, max_record, &r);
    if (got <= 0) goto done;
    if (r.total > file_size - pos - 8) { got = 0; goto done; }  /* does not fit before the file's end */
    r.q = q;
    int64_t now = single_now_ms();
    now_obj = PyLong_FromLongLong(now);
    if (now_obj == NULL || PyObject_SetAttr(cl, s_begin_in_lock, now_obj) < 0) { got = -1; goto done; }
    PyObject *view = PyObject_GetAttr(mf, s_write_view);
    if (view == NULL) { got = -1; goto done; }
    Py_buffer dst;
    if (PyObject_GetBuffer(view, &dst, PyBUF_WRITABLE) < 0) { Py_DECREF(view); got = -1; goto done; }
    Py_DECREF(view);
    if (pos > dst.len || r.total > dst.len - pos) {
        PyBuffer_Release(&dst);
        got = single_set_i64(cl, s_begin_in_lock, 0) < 0 ? -1 : 0;
        goto done;
    }
    PyObject *sys_obj = PyLong_FromLongLong(sys_flag), *zero = PyLong_FromLong(0);
    PyObject *empty = PyUnicode_New(0, 0);
    base_obj = PyLong_FromLongLong(base);
    if (sys_obj != NULL && zero != NULL && empty != NULL && base_obj != NULL) {
        unsigned char *props = plain_write(&r, (unsigned char *)dst.buf + pos, base, now, PyBytes_AS_STRING(addr),
                                           addr_len, (int)port, (int)sys_flag, reserved);
        req = plain_request(&r, Py_NewRef(base_obj), props, reserved, tags_cache, tags_fn, (PyTypeObject *)rt, now_obj,
                            sys_obj, zero, empty);
    }
    PyBuffer_Release(&dst);
    Py_XDECREF(sys_obj); Py_XDECREF(zero); Py_XDECREF(empty);
    if (req == NULL) { got = -1; goto done; }
    /* the record is in the file: publish it as the reference does */
    PyObject *nq = PyLong_FromLongLong(q + 1);
    if (nq == NULL || single_set_i64(mf, s_wrote_position, pos + r.total) < 0 ||
        PyObject_SetAttr(mf, s_store_ts, now_obj) < 0 || PyDict_SetItem(table, key, nq) < 0) {
        Py_XDECREF(nq); got = -1; goto done;
    }
    Py_DECREF(nq);
    PyObject *cb = PyObject_GetAttr(cl, s_on_appended);
    if (cb == NULL) { got = -1; goto done; }
    if (cb != Py_None) {
        /* (request,): a tuple of an untracked tuple, so untracked too (the collector never walks what waits
           for the reput thread, and a burst of single puts does not age into the old generations) */
        PyObject *reqs = PyTuple_Pack(1, req), *cres = NULL;
        PyObject *e_obj = PyLong_FromLongLong(base + r.total);
        if (reqs != NULL && e_obj != NULL) {
            PyObject_GC_UnTrack(reqs);
            int h = single_handoff(cb, base_obj, e_obj, reqs);
            if (h > 0) cres = Py_NewRef(Py_None);
            else if (h == 0) {
                PyObject *cargs[3] = {base_obj, e_obj, reqs};
                cres = PyObject_Vectorcall(cb, cargs, 3, NULL);
            }
        }
        Py_XDECREF(reqs); Py_XDECREF(e_obj);
        if (cres == NULL) { Py_DECREF(cb); got = -1; goto done; }
        Py_DECREF(cres);
    }
    Py_DECREF(cb);
    if (single_set_i64(cl, s_begin_in_lock, 0) < 0) { got = -1; goto done; }
    /* the request's total (3) and queue offset (6) are the result's; its uniq key (8) too */
    result = single_result(base_obj, PyTuple_GET_ITEM(req, 3), now_obj, PyTuple_GET_ITEM(req, 6), single_now_ms() - now,
                           addr, PyTuple_GET_ITEM(ctx, 2), PyTuple_GET_ITEM(req, 8));
    if (result == NULL) got = -1;
done:
    Py_XDECREF(req); Py_XDECREF(key); Py_XDECREF(table); Py_XDECREF(r.keys); Py_XDECREF(base_obj); Py_XDECREF(now_obj);
    Py_DECREF(mf);
    if (got < 0) return NULL;
    if (got == 0) Py_RETURN_NONE;
    return result;
}
/* uniq_create(generator) -> str or None: UniqueIdGenerator.create's fast path (the millisecond of the ids
 * being issued already has its text `_head` and fewer than 65536 ids): under the generator's `_lock`, the
 * same reads and writes of `_time`, `_time_used`, `_counter` as the Python method, and the same id text.
 * None, having changed nothing, when the fast path does not apply (create() then claims). */
static PyObject *u_lock, *u_time, *u_used, *u_head, *u_head_time, *u_counter, *u_acquire, *u_release;

static PyObject *uniq_create(PyObject *self, PyObject *gen) {
    if (u_release == NULL) {
        const char *names[] = {"_lock", "_time", "_time_used", "_head", "_head_time", "_counter", "acquire", "release"};
        PyObject **slots[] = {&u_lock, &u_time, &u_used, &u_head, &u_head_time, &u_counter, &u_acquire, &u_release};
        for (int i = 0; i < 8; i++) {
            PyObject *n = PyUnicode_InternFromString(names[i]);
            if (n == NULL) return NULL;
            *slots[i] = n;
        }
    }
    int64_t now = single_now_ms();
    PyObject *lock = PyObject_GetAttr(gen, u_lock);
    if (lock == NULL) return NULL;
    PyObject *ok = PyObject_CallMethodNoArgs(lock, u_acquire);
    if (ok == NULL) { Py_DECREF(lock); return NULL; }
    Py_DECREF(ok);
    PyObject *result = NULL, *head = NULL;
    int64_t t, used, head_t, counter;
    int got = single_attr_i64(gen, u_time, INT64_MIN, INT64_MAX, &t);
    if (got > 0) got = single_attr_i64(gen, u_used, 0, INT64_MAX - 1, &used);
    if (got > 0) got = single_attr_i64(gen, u_head_time, INT64_MIN, INT64_MAX, &head_t);
    if (got > 0) got = single_attr_i64(gen, u_counter, 0, 0xFFFF, &counter);
    if (got > 0) {
        if (now > t) { t = now; used = 0; }
        if (t != head_t || used >= 0x10000) got = 0;
    }
    if (got > 0) {
        head = PyObject_GetAttr(gen, u_head);
        if (head == NULL) got = -1;
        else if (!PyUnicode_CheckExact(head) || !PyUnicode_IS_ASCII(head)) got = 0;
    }
    if (got > 0) {
        Py_ssize_t hl = PyUnicode_GET_LENGTH(head);
        result = PyUnicode_New(hl + 4, 127);
        if (result == NULL) got = -1;
        else {
            static const char hex[] = "0123456789ABCDEF";
            char *d = (char *)PyUnicode_1BYTE_DATA(result);
            memcpy(d, PyUnicode_1BYTE_DATA(head), hl);
            unsigned c = (unsigned)counter;
            d[hl] = hex[c >> 12]; d[hl + 1] = hex[(c >> 8) & 15]; d[hl + 2] = hex[(c >> 4) & 15]; d[hl + 3] = hex[c & 15];
            /* commit: the same state the Python fast path leaves */
            if (single_set_i64(gen, u_time, t) < 0 || single_set_i64(gen, u_used, used + 1) < 0 ||
                single_set_i64(gen, u_counter, (counter + 1) & 0xFFFF) < 0)
                got = -1;
        }
    }
    Py_XDECREF(head);
    PyObject *rel = PyObject_CallMethodNoArgs(lock, u_release);
    Py_DECREF(lock);
    if (rel == NULL) got = -1;
    Py_XDECREF(rel);
    if (got <= 0) {
        Py_XDECREF(result);
        if (got < 0) return NULL;
        Py_RETURN_NONE;
    }
    return result;
}

/* take_requests(pending, popleft, offset, limit, room, out) -> (offset, taken): ReputMessageService.
 * _take_pending's walk over a run of request chunks (single puts hand over one (start, end, (request,)) each):
 * while the first chunk starts at `offset`, ends by `limit` and holds requests (a non-empty list or tuple),
 * and fewer than `room` were taken: its requests go to `out`, it is popped, `offset` moves to its end.
 * Anything else (a BLANK, columns, a gap) stops the walk; the Python loop decides what it is. */
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
        int64_t start, end;
        PyObject *reqs;
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

static PyMethodDef methods[] = {
    {"count_missing_uniq", count_missing_uniq, METH_O, "CommitLog._uniq_keys's count (None: not all Messages)."},
    {"copy_into", copy_into, METH_VARARGS, "dst[pos:pos + len(src)] = src (without the GIL from 64 KiB)."},
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
    /* the single put (branch put-single) */
    {"single_init", single_init, METH_VARARGS,
     "single_init(AppendMessageResult, PutMessageResult, AppendMessageStatus.PUT_OK, PutMessageStatus.PUT_OK)."},
    {"take_requests", (PyCFunction)(void (*)(void))take_requests, METH_FASTCALL,
     "ReputMessageService._take_pending's walk over request chunks: (offset, taken)."},
    {"uniq_create", uniq_create, METH_O, "UniqueIdGenerator.create's fast path: the id, or None (create() claims)."},
    {"append_one", (PyCFunction)(void (*)(void))append_one, METH_FASTCALL,
     "CommitLog._append_one's locked body: PutMessageResult(PUT_OK, AppendMessageResult) or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "rmq_eventstore._native",
    "The store's per-record loops in C; rmq_eventstore.common.codec decides whether they are used.", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    crc_init();
    return PyModule_Create(&moduledef);
}
