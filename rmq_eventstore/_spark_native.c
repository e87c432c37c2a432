/* rmq_eventstore._spark_native: the Spark source's commitlog scan in C (issue 16).
 *
 * Two functions mirror `rmq_eventstore.spark.decode`:
 *   walk(buf, pos, stop, limit, max_rows, max_bytes) -> (starts: bytes of int64, pos, reason, detail)
 *   decode(buf, starts: bytes of int64, check_crc, skip_bad) -> None | tuple of column buffers
 * `decode` fills the Arrow buffers of all 19 columns in two passes over the records (validate and size,
 * then copy), so Python only wraps them with `pa.Array.from_buffers`. It returns None for a batch it
 * leaves to the numpy decoder: a record with an IPv6 host, text that is not UTF-8, or properties that
 * repeat a name (the numpy decoder handles those exactly as the engine does). Self-contained: no Python
 * objects of the project are touched, the buffer is only read.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#ifdef RMQ_HAVE_ZLIB
#include <zlib.h>
#endif

#define MAGIC_V1 ((int32_t)0xDAA320A7)
#define MAGIC_V2 ((int32_t)0xDAA320AB)
#define MAGIC_BLANK ((int32_t)0xCBD43194)
#define BORNHOST_V6 0x10
#define STOREHOST_V6 0x20

static inline int32_t be32(const uint8_t *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}
static inline int16_t be16(const uint8_t *p) { return (int16_t)(((uint16_t)p[0] << 8) | p[1]); }
static inline int64_t be64(const uint8_t *p) {
    return (int64_t)(((uint64_t)(uint32_t)be32(p) << 32) | (uint32_t)be32(p + 4));
}

#ifndef RMQ_HAVE_ZLIB
static uint32_t crc_table[256];
static int crc_ready = 0;
static uint32_t crc32_bytes(const uint8_t *p, Py_ssize_t n) {
    if (!crc_ready) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            crc_table[i] = c;
        }
        crc_ready = 1;
    }
    uint32_t c = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}
#else
static uint32_t crc32_bytes(const uint8_t *p, Py_ssize_t n) {
    uLong c = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        uInt chunk = n > (1 << 30) ? (1 << 30) : (uInt)n;
        c = crc32(c, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)c;
}
#endif

/* Strict UTF-8 (no overlongs, no surrogates, at most U+10FFFF), as Arrow's string validation. */
static int utf8_valid(const uint8_t *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ULL) break;
            i += 8;
        }
        if (i >= n) break;
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            uint8_t c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0;
            if (c == 0xED && c1 > 0x9F) return 0;
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            uint8_t c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && c1 < 0x90) return 0;
            if (c == 0xF4 && c1 > 0x8F) return 0;
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

/* -- walk ------------------------------------------------------------------------------------------- */
static PyObject *sn_walk(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, stop, limit, max_rows, max_bytes;
    if (!PyArg_ParseTuple(args, "y*nnnnn", &view, &pos, &stop, &limit, &max_rows, &max_bytes)) return NULL;
    if (limit > view.len || limit < 0 || pos < 0 || max_rows < 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "walk: bounds outside the buffer");
        return NULL;
    }
    const uint8_t *a = (const uint8_t *)view.buf;
    Py_ssize_t cap = max_rows < 65536 ? max_rows : 65536;
    PyObject *out = PyBytes_FromStringAndSize(NULL, cap * 8);
    if (!out) { PyBuffer_Release(&view); return NULL; }
    int64_t *st = (int64_t *)PyBytes_AS_STRING(out);
    Py_ssize_t n = 0;
    Py_ssize_t budget = pos + max_bytes;
    if (budget < pos) budget = PY_SSIZE_T_MAX;  /* overflow: no byte budget */
    const char *reason = "more";
    char detail[96] = "";
    int broke = 0;
    while (pos < stop && n < max_rows && pos < budget) {
        if (limit - pos < 8) {
            int zero = 1;
            for (Py_ssize_t i = pos; i < limit; i++) if (a[i]) { zero = 0; break; }
            reason = zero ? "zero" : "damage";
            if (!zero) snprintf(detail, sizeof detail, "no room for a record header");
            broke = 1;
            break;
        }
        int32_t total = be32(a + pos), magic = be32(a + pos + 4);
        if (magic == MAGIC_V1 || magic == MAGIC_V2) {
            if (total <= 0 || pos + total > limit) {
                reason = "damage";
                snprintf(detail, sizeof detail, "total size %d runs past the readable data", (int)total);
                broke = 1;
                break;
            }
            if (n == cap) {
                Py_ssize_t ncap = cap * 2 > max_rows ? max_rows : cap * 2;
                if (_PyBytes_Resize(&out, ncap * 8) < 0) { PyBuffer_Release(&view); return NULL; }
                cap = ncap;
                st = (int64_t *)PyBytes_AS_STRING(out);
            }
            st[n++] = pos;
            pos += total;
            continue;
        }
        if (magic == MAGIC_BLANK) reason = "blank";
        else if (total == 0 && magic == 0) reason = "zero";
        else {
            reason = "damage";
            snprintf(detail, sizeof detail, "illegal magic code 0x%08x", (unsigned)magic);
        }
        broke = 1;
        break;
    }
    if (!broke && pos >= stop) reason = "end";
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&out, n * 8) < 0) return NULL;
    return Py_BuildValue("Nnss", out, pos, reason, detail);
}

/* -- decode ----------------------------------------------------------------------------------------- */
#define MAX_PAIRS 4096

typedef struct {
    int64_t start;
    int32_t total, topic_len, props_len, body_len, n_pairs, v2;
    int32_t tags_i, keys_i, uniq_i;  /* index of the pair among the record's pairs, -1 if absent */
} Rec;

/* Split a properties string into (name, value) pairs as `string_to_properties` (segments at 0x02, the
 * first 0x01 of a segment splits it, both parts non-empty). Returns the number of pairs, -1 when a
 * name repeats (left to the numpy decoder), -2 when there are more than MAX_PAIRS. */
static int split_props(const uint8_t *p, int32_t len, int32_t *ks, int32_t *kl, int32_t *vs, int32_t *vl) {
    int np = 0;
    int32_t s = 0;
    while (s <= len) {
        int32_t e = s;
        while (e < len && p[e] != 2) e++;
        if (s == len) break;
        int32_t f = s;
        while (f < e && p[f] != 1) f++;
        if (f < e && f > s && f + 1 < e) {
            if (np >= MAX_PAIRS) return -2;
            for (int j = 0; j < np; j++)
                if (kl[j] == f - s && memcmp(p + ks[j], p + s, (size_t)(f - s)) == 0) return -1;
            ks[np] = s; kl[np] = f - s; vs[np] = f + 1; vl[np] = e - f - 1;
            np++;
        }
        s = e + 1;
    }
    return np;
}

static int name_is(const uint8_t *p, int32_t len, const char *name) {
    size_t n = strlen(name);
    return (size_t)len == n && memcmp(p, name, n) == 0;
}

/* Java's `a.b.c.d:port` of the 8 bytes address + port at `hp`; the last one is kept (hosts repeat). */
typedef struct {
    uint8_t raw[8];
    int len, valid;
    char text[32];
} HostCache;

static int host_text(char *dst, const uint8_t *hp, HostCache *c) {
    if (!c->valid || memcmp(c->raw, hp, 8) != 0) {
        c->len = snprintf(c->text, sizeof c->text, "%u.%u.%u.%u:%d", hp[0], hp[1], hp[2], hp[3], (int)be32(hp + 4));
        memcpy(c->raw, hp, 8);
        c->valid = 1;
    }
    memcpy(dst, c->text, (size_t)c->len);
    return c->len;
}

static const char HEXU[] = "0123456789ABCDEF";

#define NEWBYTES(var, size) do { var = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(size)); if (!var) goto fail; } while (0)

static PyObject *sn_decode(PyObject *self, PyObject *args) {
    Py_buffer view, sv;
    int check_crc, skip_bad;
    if (!PyArg_ParseTuple(args, "y*y*pp", &view, &sv, &check_crc, &skip_bad)) return NULL;
    const uint8_t *a = (const uint8_t *)view.buf;
    Py_ssize_t alen = view.len;
    const int64_t *starts = (const int64_t *)sv.buf;
    Py_ssize_t n_in = sv.len / 8;
    PyObject *result = NULL;
    Rec *recs = NULL;
    int64_t *kept = NULL;
    int32_t *ks = NULL, *kl = NULL, *vs = NULL, *vl = NULL;
    PyObject *o_ints[10] = {0};
    PyObject *topic_off = 0, *topic_data = 0, *born_off = 0, *born_data = 0, *store_off = 0, *store_data = 0;
    PyObject *tk_valid[3] = {0}, *tk_off[3] = {0}, *tk_data[3] = {0};
    PyObject *map_off = 0, *mk_off = 0, *mk_data = 0, *mv_off = 0, *mv_data = 0;
    PyObject *body_off = 0, *body_data = 0, *msgid = 0, *crc_bad = 0, *kept_b = 0;

    recs = (Rec *)PyMem_Malloc(sizeof(Rec) * (size_t)(n_in ? n_in : 1));
    ks = (int32_t *)PyMem_Malloc(sizeof(int32_t) * MAX_PAIRS * 4);
    if (!recs || !ks) { PyErr_NoMemory(); goto fail; }
    kl = ks + MAX_PAIRS; vs = kl + MAX_PAIRS; vl = vs + MAX_PAIRS;
    NEWBYTES(kept_b, n_in * 8);
    kept = (int64_t *)PyBytes_AS_STRING(kept_b);

    /* pass 1: validate (as decode.record_layout), size the variable-width columns */
    Py_ssize_t n = 0, bad = -1;
    int64_t topic_sz = 0, body_sz = 0, key_sz = 0, val_sz = 0, pairs = 0, tk_sz[3] = {0, 0, 0};
    int fallback = 0;
    for (Py_ssize_t i = 0; i < n_in; i++) {
        int64_t s = starts[i];
        int ok = s >= 0 && s + 8 <= alen;
        int32_t total = 0, magic = 0, sys_flag = 0;
        if (ok) {
            total = be32(a + s); magic = be32(a + s + 4);
            ok = (magic == MAGIC_V1 || magic == MAGIC_V2) && s + (int64_t)total <= alen && total >= 0;
        }
        if (ok && s + 48 <= alen) {
            sys_flag = be32(a + s + 36);
            if (sys_flag & (BORNHOST_V6 | STOREHOST_V6)) { fallback = 1; break; }
        }
        ok = ok && total >= 88;
        int32_t body_len = 0, tl = 0, pl = 0;
        if (ok) {
            int v2 = magic == MAGIC_V2;
            int64_t rec_end = s + total, body_pos = s + 88;
            body_len = be32(a + s + 84);
            int tlw = v2 ? 2 : 1;
            ok = body_len >= 0 && body_pos + body_len + tlw <= rec_end;
            if (ok) {
                int64_t tpos = body_pos + body_len;
                tl = v2 ? be16(a + tpos) : a[tpos];
                ok = tl >= 0 && (v2 || tl <= 127);
                int64_t ppos = tpos + tlw + tl;
                ok = ok && ppos + 2 <= rec_end;
                if (ok) {
                    pl = be16(a + ppos);
                    ok = pl >= 0 && ppos + 2 + pl == rec_end;
                }
            }
        }
        if (!ok) {
            if (skip_bad) continue;
            bad = i;
            break;
        }
        Rec *r = &recs[n];
        r->start = s; r->total = total; r->body_len = body_len; r->topic_len = tl; r->props_len = pl;
        r->v2 = magic == MAGIC_V2;
        const uint8_t *topic = a + s + 88 + body_len + (magic == MAGIC_V2 ? 2 : 1);
        const uint8_t *props = topic + tl + 2;
        if (!utf8_valid(topic, tl) || !utf8_valid(props, pl)) { fallback = 1; break; }
        int np = split_props(props, pl, ks, kl, vs, vl);
        if (np < 0) { fallback = 1; break; }
        r->n_pairs = np;
        r->tags_i = r->keys_i = r->uniq_i = -1;
        for (int j = 0; j < np; j++) {
            key_sz += kl[j]; val_sz += vl[j];
            const uint8_t *k = props + ks[j];
            if (name_is(k, kl[j], "TAGS")) { r->tags_i = j; tk_sz[0] += vl[j]; }
            else if (name_is(k, kl[j], "KEYS")) { r->keys_i = j; tk_sz[1] += vl[j]; }
            else if (name_is(k, kl[j], "UNIQ_KEY")) { r->uniq_i = j; tk_sz[2] += vl[j]; }
        }
        pairs += np;
        topic_sz += tl; body_sz += body_len;
        kept[n] = i;
        n++;
    }
    if (fallback) {
        Py_INCREF(Py_None);
        result = Py_None;
        goto fail;  /* frees everything, returns None */
    }
    if (topic_sz > INT32_MAX || body_sz > INT32_MAX || key_sz > INT32_MAX || val_sz > INT32_MAX) {
        Py_INCREF(Py_None);
        result = Py_None;
        goto fail;
    }

    /* pass 2: fill */
    static const int widths[10] = {4, 8, 8, 4, 4, 4, 8, 8, 4, 8};
    for (int c = 0; c < 10; c++) NEWBYTES(o_ints[c], n * widths[c]);
    int32_t *qid = (int32_t *)PyBytes_AS_STRING(o_ints[0]);
    int64_t *qoff = (int64_t *)PyBytes_AS_STRING(o_ints[1]);
    int64_t *phys = (int64_t *)PyBytes_AS_STRING(o_ints[2]);
    int32_t *tot = (int32_t *)PyBytes_AS_STRING(o_ints[3]);
    int32_t *sysf = (int32_t *)PyBytes_AS_STRING(o_ints[4]);
    int32_t *flag = (int32_t *)PyBytes_AS_STRING(o_ints[5]);
    int64_t *born_us = (int64_t *)PyBytes_AS_STRING(o_ints[6]);
    int64_t *store_us = (int64_t *)PyBytes_AS_STRING(o_ints[7]);
    int32_t *recon = (int32_t *)PyBytes_AS_STRING(o_ints[8]);
    int64_t *prep = (int64_t *)PyBytes_AS_STRING(o_ints[9]);
    NEWBYTES(topic_off, (n + 1) * 4); NEWBYTES(topic_data, topic_sz);
    NEWBYTES(body_off, (n + 1) * 4); NEWBYTES(body_data, body_sz);
    NEWBYTES(born_off, (n + 1) * 4); NEWBYTES(born_data, n * 28 + 1);
    NEWBYTES(store_off, (n + 1) * 4); NEWBYTES(store_data, n * 28 + 1);
    NEWBYTES(map_off, (n + 1) * 4);
    NEWBYTES(mk_off, (pairs + 1) * 4); NEWBYTES(mk_data, key_sz);
    NEWBYTES(mv_off, (pairs + 1) * 4); NEWBYTES(mv_data, val_sz);
    NEWBYTES(msgid, n * 32);
    for (int t = 0; t < 3; t++) {
        NEWBYTES(tk_valid[t], (n + 7) / 8);
        memset(PyBytes_AS_STRING(tk_valid[t]), 0, (size_t)((n + 7) / 8));
        NEWBYTES(tk_off[t], (n + 1) * 4);
        NEWBYTES(tk_data[t], tk_sz[t]);
    }
    crc_bad = PyList_New(0);
    if (!crc_bad) goto fail;
    {
        int32_t *to = (int32_t *)PyBytes_AS_STRING(topic_off), *bo = (int32_t *)PyBytes_AS_STRING(body_off);
        int32_t *ho = (int32_t *)PyBytes_AS_STRING(born_off), *so = (int32_t *)PyBytes_AS_STRING(store_off);
        int32_t *mo = (int32_t *)PyBytes_AS_STRING(map_off);
        int32_t *mko = (int32_t *)PyBytes_AS_STRING(mk_off), *mvo = (int32_t *)PyBytes_AS_STRING(mv_off);
        char *td = PyBytes_AS_STRING(topic_data), *bd = PyBytes_AS_STRING(body_data);
        char *hd = PyBytes_AS_STRING(born_data), *sd = PyBytes_AS_STRING(store_data);
        char *mkd = PyBytes_AS_STRING(mk_data), *mvd = PyBytes_AS_STRING(mv_data), *mid = PyBytes_AS_STRING(msgid);
        uint8_t *tv[3]; int32_t *tko[3]; char *tkd[3]; int32_t tpos_[3] = {0, 0, 0};
        for (int t = 0; t < 3; t++) {
            tv[t] = (uint8_t *)PyBytes_AS_STRING(tk_valid[t]);
            tko[t] = (int32_t *)PyBytes_AS_STRING(tk_off[t]);
            tkd[t] = PyBytes_AS_STRING(tk_data[t]);
            tko[t][0] = 0;
        }
        HostCache born_c = {{0}, 0, 0, {0}}, store_c = {{0}, 0, 0, {0}};
        int32_t tp = 0, bp = 0, hp = 0, sp = 0, pp = 0, kp = 0, vp = 0;
        to[0] = bo[0] = ho[0] = so[0] = mo[0] = mko[0] = mvo[0] = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            const Rec *r = &recs[i];
            const uint8_t *h = a + r->start;
            int v2 = r->v2;  /* every length and position below is pass 1's: the buffer may be a live file */
            qid[i] = be32(h + 12);
            flag[i] = be32(h + 16);
            qoff[i] = be64(h + 20);
            phys[i] = be64(h + 28);
            sysf[i] = be32(h + 36);
            born_us[i] = (int64_t)((uint64_t)be64(h + 40) * 1000u);
            store_us[i] = (int64_t)((uint64_t)be64(h + 56) * 1000u);
            recon[i] = be32(h + 72);
            prep[i] = be64(h + 76);
            tot[i] = r->total;
            hp += host_text(hd + hp, h + 48, &born_c); ho[i + 1] = hp;
            sp += host_text(sd + sp, h + 64, &store_c); so[i + 1] = sp;
            char *m = mid + 32 * i;
            for (int j = 0; j < 8; j++) { m[2 * j] = HEXU[h[64 + j] >> 4]; m[2 * j + 1] = HEXU[h[64 + j] & 15]; }
            for (int j = 0; j < 8; j++) { m[16 + 2 * j] = HEXU[h[28 + j] >> 4]; m[17 + 2 * j] = HEXU[h[28 + j] & 15]; }
            const uint8_t *body = h + 88;
            memcpy(bd + bp, body, (size_t)r->body_len); bp += r->body_len; bo[i + 1] = bp;
            if (check_crc && r->body_len) {
                uint32_t c = crc32_bytes(body, r->body_len) & 0x7FFFFFFFu;
                if ((int32_t)c != be32(h + 8)) {
                    PyObject *v = PyLong_FromLongLong(r->start);
                    if (!v || PyList_Append(crc_bad, v) < 0) { Py_XDECREF(v); goto fail; }
                    Py_DECREF(v);
                }
            }
            const uint8_t *topic = body + r->body_len + (v2 ? 2 : 1);
            memcpy(td + tp, topic, (size_t)r->topic_len); tp += r->topic_len; to[i + 1] = tp;
            const uint8_t *props = topic + r->topic_len + 2;
            int np = r->n_pairs ? split_props(props, r->props_len, ks, kl, vs, vl) : 0;
            if (np != r->n_pairs) goto changed;
            for (int j = 0; j < np; j++) {
                if (kp + (int64_t)kl[j] > key_sz || vp + (int64_t)vl[j] > val_sz) goto changed;
                memcpy(mkd + kp, props + ks[j], (size_t)kl[j]); kp += kl[j]; mko[pp + j + 1] = kp;
                memcpy(mvd + vp, props + vs[j], (size_t)vl[j]); vp += vl[j]; mvo[pp + j + 1] = vp;
            }
            pp += np; mo[i + 1] = pp;
            int32_t idx[3] = {r->tags_i, r->keys_i, r->uniq_i};
            for (int t = 0; t < 3; t++) {
                if (idx[t] >= 0) {
                    int j = idx[t];
                    if (tpos_[t] + (int64_t)vl[j] > tk_sz[t]) goto changed;
                    memcpy(tkd[t] + tpos_[t], props + vs[j], (size_t)vl[j]);
                    tpos_[t] += vl[j];
                    tv[t][i >> 3] |= (uint8_t)(1u << (i & 7));
                }
                tko[t][i + 1] = tpos_[t];
            }
        }
        if (_PyBytes_Resize(&born_data, hp) < 0 || _PyBytes_Resize(&store_data, sp) < 0) goto fail;
    }
    if (_PyBytes_Resize(&kept_b, n * 8) < 0) goto fail;
    if (0) {
    changed:
        PyErr_SetString(PyExc_RuntimeError, "commitlog bytes changed while the batch was being decoded");
        goto fail;
    }
    result = Py_BuildValue(
        "nn(NNNNNNNNNN)(NN)(NN)(NN)(NNN)(NNN)(NNN)(NNNNN)(NN)NNN",
        n, bad,
        o_ints[0], o_ints[1], o_ints[2], o_ints[3], o_ints[4], o_ints[5], o_ints[6], o_ints[7], o_ints[8],
        o_ints[9],
        topic_off, topic_data, born_off, born_data, store_off, store_data,
        tk_valid[0], tk_off[0], tk_data[0], tk_valid[1], tk_off[1], tk_data[1], tk_valid[2], tk_off[2],
        tk_data[2], map_off, mk_off, mk_data, mv_off, mv_data, body_off, body_data, msgid, crc_bad, kept_b);
    /* Py_BuildValue's N stole every reference (also on failure) */
    PyMem_Free(recs);
    PyMem_Free(ks);
    PyBuffer_Release(&view);
    PyBuffer_Release(&sv);
    return result;

fail:
    for (int c = 0; c < 10; c++) Py_XDECREF(o_ints[c]);
    Py_XDECREF(topic_off); Py_XDECREF(topic_data); Py_XDECREF(born_off); Py_XDECREF(born_data);
    Py_XDECREF(store_off); Py_XDECREF(store_data);
    for (int t = 0; t < 3; t++) { Py_XDECREF(tk_valid[t]); Py_XDECREF(tk_off[t]); Py_XDECREF(tk_data[t]); }
    Py_XDECREF(map_off); Py_XDECREF(mk_off); Py_XDECREF(mk_data); Py_XDECREF(mv_off); Py_XDECREF(mv_data);
    Py_XDECREF(body_off); Py_XDECREF(body_data); Py_XDECREF(msgid); Py_XDECREF(crc_bad); Py_XDECREF(kept_b);
    PyMem_Free(recs);
    PyMem_Free(ks);
    PyBuffer_Release(&view);
    PyBuffer_Release(&sv);
    return result;  /* None for a fallback, NULL with an exception set otherwise */
}

static PyMethodDef methods[] = {
    {"walk", sn_walk, METH_VARARGS, "Record starts of a commitlog range: (starts int64 bytes, pos, reason, detail)."},
    {"decode", sn_decode, METH_VARARGS, "Arrow buffers of the Spark columns of the records at `starts`, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_spark_native",
                                    "The Spark source's commitlog scan in C (see rmq_eventstore.spark.decode).",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__spark_native(void) { return PyModule_Create(&moddef); }
