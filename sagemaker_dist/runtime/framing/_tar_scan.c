/* The tar framer's walk in C: the samples of a buffer of WebDataset shards (framing/tar.py's TarFramer).
 *
 * Optional at install, like _tfrecord_scan (setup.py builds it where a C compiler is; framing/tar.py walks
 * in Python without it). The walk is TarFramer._walk's, for the usual case: ustar, GNU and v7 headers,
 * GNU long names and pax path/size records, folders and links read past, files grouped into samples by
 * key, end-of-archive blocks. Anything else it leaves to the Python walk, which also names every error:
 * it stops with FALLBACK at the first entry it does not take (a checksum that does not match, a field that
 * is not octal, base-256 sizes, sparse files, a name with a newline or a non-ASCII extension, a size over
 * the limit, a repeated extension), and the caller walks the buffer again in Python. So the two agree by
 * construction: C hands out what Python would, and Python says what is wrong. The GIL is released.
 *
 * sample(record) -> (key, [(extension, start, size), ...]) or None: framing/tar.py's parse_sample for the
 *   usual record (None: anything else, every error included, for the Python parse to take and name).
 *
 * scan(buf, end, starts, lengths, max_record) -> (count, consumed, need, cut, status)
 *   buf: the bytes; end: how many of them to look at; starts, lengths: writable int64 buffers with room
 *   for end // 512 + 1 entries; max_record: the longest member and sample accepted;
 *   count: the complete samples, starts[i] and lengths[i] their place in buf; consumed: the bytes the
 *   caller may drop; need: the buffer size (from consumed) the next step needs, 0 if none; cut: where the
 *   entry cut short starts; status: 0, or 1 (FALLBACK: walk buf in Python, these results aside).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "native/record_core.h"

#define API 2 /* sample() */
#define FALLBACK 1
#define MAX_METADATA ((uint64_t)1 << 20) /* contract.tar_format.MAX_METADATA_BYTES */
#define MAX_EXTS 32                      /* files a sample may have here; more: the Python walk */
#define EXT_BYTES 1024                   /* their extensions' bytes, all told */

typedef struct {
    const unsigned char *p; /* the name: in buf, or in `own` (a ustar prefix and name joined) */
    size_t len;
    unsigned char own[256 + 1 + 100];
} Name;

/* The value of pax record `key` in the records at p (n bytes): 1 and *value, *len; 0 if absent; -1 where
 * the records are not well formed or hold a sparse file's (left to the Python walk). */
static int pax_find(const unsigned char *p, uint64_t n, const char *key, const unsigned char **value, size_t *len) {
    size_t klen = strlen(key);
    int found = 0;
    uint64_t at = 0;
    while (at < n) {
        if (p[at] == 0) { /* zeros after the records, and nothing else */
            for (uint64_t i = at; i < n; i++)
                if (p[i]) return -1;
            return found;
        }
        uint64_t length = 0, digits = 0;
        while (at + digits < n && p[at + digits] >= '0' && p[at + digits] <= '9' && digits < 20) {
            length = length * 10 + (uint64_t)(p[at + digits] - '0');
            digits++;
        }
        if (!digits || at + digits >= n || p[at + digits] != ' ' || length <= digits + 1 || length > n - at ||
            p[at + length - 1] != '\n')
            return -1;
        const unsigned char *rec = p + at + digits + 1, *stop = p + at + length - 1;
        const unsigned char *eq = memchr(rec, '=', (size_t)(stop - rec));
        if (eq == NULL) return -1;
        size_t keylen = (size_t)(eq - rec);
        if (keylen >= 11 && memcmp(rec, "GNU.sparse.", 11) == 0) return -1;
        if (keylen == klen && memcmp(rec, key, klen) == 0) { /* the last one wins, as dict.update */
            *value = eq + 1;
            *len = (size_t)(stop - eq - 1);
            found = 1;
        }
        at += length;
    }
    return found;
}

/* What the metadata headers before an entry said: a GNU long name, pax path and size records. */
typedef struct {
    const unsigned char *long_name, *pax_path, *pax_size;
    size_t long_len, pax_path_len, pax_size_len;
} Meta;

/* Take the data of a metadata member ('L', 'K', 'x', 'g'): 0, or -1 where the Python walk must (pax
 * records not well formed, a sparse file's, a global header that sets a path or size). */
static int read_meta(Meta *m, unsigned char type, const unsigned char *data, uint64_t size) {
    if (type == 'L') {
        const unsigned char *nul = memchr(data, 0, (size_t)size);
        m->long_name = data;
        m->long_len = nul ? (size_t)(nul - data) : (size_t)size;
    } else if (type == 'x') {
        if (pax_find(data, size, "path", &m->pax_path, &m->pax_path_len) < 0) return -1;
        if (pax_find(data, size, "size", &m->pax_size, &m->pax_size_len) < 0) return -1;
    } else if (type == 'g') {
        const unsigned char *v;
        size_t vlen;
        if (pax_find(data, size, "path", &v, &vlen) != 0 || pax_find(data, size, "size", &v, &vlen) != 0) return -1;
    }
    return 0;
}

/* A regular file's name: a pax path, else a GNU long name, else the header's (a ustar prefix, a slash and
 * the name field; or the name field alone), as framing/tar.py's read_entry takes it. */
static void entry_name(Name *name, const unsigned char *h, const Meta *m) {
    if (m->pax_path != NULL) {
        name->p = m->pax_path;
        name->len = m->pax_path_len;
        return;
    }
    if (m->long_name != NULL) {
        name->p = m->long_name;
        name->len = m->long_len;
        return;
    }
    const unsigned char *nul = memchr(h, 0, 100);
    size_t n = nul ? (size_t)(nul - h) : 100;
    if (memcmp(h + 257, "ustar\0" "00", 8) == 0 && h[345] != 0) {
        const unsigned char *pnul = memchr(h + 345, 0, 155);
        size_t plen = pnul ? (size_t)(pnul - (h + 345)) : 155;
        memcpy(name->own, h + 345, plen);
        name->own[plen] = '/';
        memcpy(name->own + plen + 1, h, n);
        name->p = name->own;
        name->len = plen + 1 + n;
    } else {
        name->p = h;
        name->len = n;
    }
}

static int ext_equal(const unsigned char *a, size_t alen, const unsigned char *b, size_t blen) {
    if (alen != blen) return 0;
    for (size_t i = 0; i < alen; i++) {
        unsigned char x = a[i], y = b[i];
        if (x >= 'A' && x <= 'Z') x += 32;
        if (y >= 'A' && y <= 'Z') y += 32;
        if (x != y) return 0;
    }
    return 1;
}

typedef struct {
    int64_t count, consumed, need, cut, status;
} Result;

static Result walk(const unsigned char *buf, uint64_t end, int64_t *starts, int64_t *lengths, uint64_t max_record) {
    Result r = {0, 0, 0, 0, 0};
    uint64_t pos = 0, consumed = 0, need = 0;
    int64_t open_start = -1;
    uint64_t open_end = 0;
    const unsigned char *key = NULL; /* the open sample's key (in buf, or in key_own) */
    size_t key_len = 0;
    unsigned char key_own[sizeof(((Name *)0)->own)];
    unsigned char ext_store[EXT_BYTES]; /* the open sample's extensions, one after another */
    size_t ext_at_store[MAX_EXTS], ext_lens[MAX_EXTS], stored = 0;
    int n_exts = 0;
    Name name;
    while (pos < end) {
        uint64_t start = pos; /* the entry's first header (metadata headers before its own included) */
        Meta meta = {NULL, NULL, NULL, 0, 0, 0};
        int zero = 0, cut = 0;
        const unsigned char *h = NULL;
        uint64_t size = 0;
        for (;;) { /* metadata headers, then the entry's own */
            if (end - pos < SD_TAR_BLOCK) {
                cut = 1;
                need = pos + SD_TAR_BLOCK;
                break;
            }
            h = buf + pos;
            if (sd_tar_zero(h)) {
                if (pos != start) goto fallback; /* metadata, then the end of the archive */
                zero = 1;
                break;
            }
            if (!sd_tar_checksum_ok(h) || !sd_tar_octal(h + 124, 12, &size)) goto fallback;
            unsigned char type = h[156];
            if (type == 'L' || type == 'K' || type == 'x' || type == 'g') {
                if (size > MAX_METADATA) goto fallback;
                uint64_t stop = pos + SD_TAR_BLOCK + size + (SD_TAR_BLOCK - size % SD_TAR_BLOCK) % SD_TAR_BLOCK;
                if (stop > end) {
                    cut = 1;
                    need = stop;
                    break;
                }
                if (read_meta(&meta, type, h + SD_TAR_BLOCK, size) < 0) goto fallback;
                pos = stop;
                continue;
            }
            if (type == 'S' || type == 'M') goto fallback;
            break;
        }
        if (cut) {
            r.cut = (int64_t)start;
            break;
        }
        if (zero) { /* the archive ended, and so did its open sample */
            if (open_start >= 0) {
                starts[r.count] = open_start;
                lengths[r.count++] = (int64_t)(open_end - (uint64_t)open_start);
                open_start = -1;
            }
            pos += SD_TAR_BLOCK;
            consumed = pos;
            continue;
        }
        if (meta.pax_size != NULL) { /* a decimal size, as int() reads it: digits only here */
            uint64_t v = 0;
            if (!meta.pax_size_len || meta.pax_size_len > 18) goto fallback;
            for (size_t i = 0; i < meta.pax_size_len; i++) {
                if (meta.pax_size[i] < '0' || meta.pax_size[i] > '9') goto fallback;
                v = v * 10 + (uint64_t)(meta.pax_size[i] - '0');
            }
            size = v;
        }
        if (size > max_record) goto fallback;
        uint64_t data = pos + SD_TAR_BLOCK;
        uint64_t stop = data + size + (SD_TAR_BLOCK - size % SD_TAR_BLOCK) % SD_TAR_BLOCK;
        if (stop > end) { /* its data is not all here yet */
            need = stop + SD_TAR_BLOCK;
            r.cut = (int64_t)start;
            break;
        }
        unsigned char type = h[156];
        int regular = type == '0' || type == 0 || type == '7';
        int kept = 0;
        size_t klen = 0, ext_at = 0;
        if (regular) {
            entry_name(&name, h, &meta);
            int k = sd_tar_key(name.p, name.len, &klen, &ext_at);
            if (k < 0) goto fallback;
            kept = k == 1;
        }
        if (kept) {
            const unsigned char *ext = name.p + ext_at;
            size_t elen = name.len - ext_at;
            if (open_start < 0 || klen != key_len || memcmp(name.p, key, klen) != 0) {
                if (open_start >= 0) {
                    starts[r.count] = open_start;
                    lengths[r.count++] = (int64_t)(open_end - (uint64_t)open_start);
                }
                open_start = (int64_t)start;
                consumed = start;
                n_exts = 0;
                if (name.p == name.own) { /* the key must outlive `name` */
                    memcpy(key_own, name.p, klen);
                    key = key_own;
                } else {
                    key = name.p;
                }
                key_len = klen;
                stored = 0;
            } else {
                for (int i = 0; i < n_exts; i++) /* a repeated extension */
                    if (ext_equal(ext_store + ext_at_store[i], ext_lens[i], ext, elen)) goto fallback;
            }
            if (n_exts == MAX_EXTS || elen > EXT_BYTES - stored) goto fallback;
            memcpy(ext_store + stored, ext, elen);
            ext_at_store[n_exts] = stored;
            ext_lens[n_exts++] = elen;
            stored += elen;
            open_end = stop;
            if (open_end - (uint64_t)open_start > max_record) goto fallback;
        } else if (open_start < 0) {
            consumed = stop; /* read past, between samples */
        }
        pos = stop;
    }
    if (open_start >= 0) {
        if (!need) r.cut = (int64_t)open_end;
        consumed = (uint64_t)open_start;
        if (open_end + SD_TAR_BLOCK > need) need = open_end + SD_TAR_BLOCK;
    } else if (!need) {
        consumed = pos;
    }
    r.consumed = (int64_t)consumed;
    r.need = need ? (int64_t)(need - consumed) : 0;
    return r;
fallback:
    r.status = FALLBACK;
    return r;
}

/* One sample record (TarFramer's: the sample's members, nothing else) -> (key, [(extension, start, size)])
 * with extensions lower-cased; None where the Python parse must look (anything unusual, every error). */
static PyObject *sample(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    const unsigned char *buf = (const unsigned char *)view.buf;
    uint64_t end = (uint64_t)view.len, pos = 0;
    PyObject *members = PyList_New(0), *key_obj = NULL;
    const unsigned char *key = NULL;
    size_t key_len = 0;
    unsigned char key_own[sizeof(((Name *)0)->own)], seen[EXT_BYTES];
    size_t seen_len = 0;
    Name name;
    if (members == NULL) goto error;
    while (pos < end) {
        Meta meta = {NULL, NULL, NULL, 0, 0, 0};
        const unsigned char *h = NULL;
        uint64_t size = 0;
        for (;;) {
            if (pos > end || end - pos < SD_TAR_BLOCK) goto fallback; /* (a padded metadata member may end past it) */
            h = buf + pos;
            if (sd_tar_zero(h) || !sd_tar_checksum_ok(h) || !sd_tar_octal(h + 124, 12, &size)) goto fallback;
            unsigned char type = h[156];
            if (type != 'L' && type != 'K' && type != 'x' && type != 'g') break;
            if (size > MAX_METADATA || size > end - pos - SD_TAR_BLOCK) goto fallback;
            if (read_meta(&meta, type, h + SD_TAR_BLOCK, size) < 0) goto fallback;
            pos += SD_TAR_BLOCK + size + (SD_TAR_BLOCK - size % SD_TAR_BLOCK) % SD_TAR_BLOCK;
        }
        unsigned char type = h[156];
        if (type == 'S' || type == 'M' || meta.pax_size != NULL) goto fallback;
        if (size > end - pos - SD_TAR_BLOCK) goto fallback;
        uint64_t data = pos + SD_TAR_BLOCK;
        uint64_t stop = data + size + (SD_TAR_BLOCK - size % SD_TAR_BLOCK) % SD_TAR_BLOCK;
        if (stop > end) goto fallback;
        if (type == '0' || type == 0 || type == '7') {
            entry_name(&name, h, &meta);
            size_t klen, ext_at;
            int k = sd_tar_key(name.p, name.len, &klen, &ext_at);
            if (k < 0) goto fallback;
            if (k == 1) {
                if (key == NULL) {
                    if (name.p == name.own) {
                        memcpy(key_own, name.p, klen);
                        key = key_own;
                    } else {
                        key = name.p;
                    }
                    key_len = klen;
                } else if (klen != key_len || memcmp(name.p, key, klen) != 0) {
                    goto fallback; /* two samples: the Python parse names them */
                }
                size_t elen = name.len - ext_at;
                if (elen + 1 > EXT_BYTES - seen_len) goto fallback;
                unsigned char *ext = seen + seen_len;
                for (size_t i = 0; i < elen; i++) {
                    unsigned char c = name.p[ext_at + i];
                    ext[i] = c >= 'A' && c <= 'Z' ? c + 32 : c;
                }
                for (size_t at = 0; at < seen_len;) { /* a repeated extension: the Python parse names it */
                    size_t len = strlen((const char *)seen + at);
                    if (len == elen && memcmp(seen + at, ext, elen) == 0) goto fallback;
                    at += len + 1;
                }
                if (memchr(ext, 0, elen) != NULL) goto fallback;
                ext[elen] = 0;
                seen_len += elen + 1;
                PyObject *item = Py_BuildValue("(y#KK)", (const char *)ext, (Py_ssize_t)elen,
                                               (unsigned long long)data, (unsigned long long)size);
                if (item == NULL || PyList_Append(members, item) < 0) {
                    Py_XDECREF(item);
                    goto error;
                }
                Py_DECREF(item);
            }
        }
        pos = stop;
    }
    if (key == NULL) goto fallback;
    key_obj = PyBytes_FromStringAndSize((const char *)key, (Py_ssize_t)key_len);
    if (key_obj == NULL) goto error;
    PyBuffer_Release(&view);
    PyObject *result = PyTuple_Pack(2, key_obj, members);
    Py_DECREF(key_obj);
    Py_DECREF(members);
    return result;
fallback:
    PyBuffer_Release(&view);
    Py_XDECREF(members);
    Py_RETURN_NONE;
error:
    PyBuffer_Release(&view);
    Py_XDECREF(members);
    return NULL;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *starts_obj, *lengths_obj;
    Py_ssize_t end;
    unsigned long long max_record;
    if (!PyArg_ParseTuple(args, "OnOOK", &buf_obj, &end, &starts_obj, &lengths_obj, &max_record)) return NULL;
    if (max_record < 1 || max_record > SD_MAX_RECORD_CEILING)
        return PyErr_Format(PyExc_ValueError, "max_record %llu is not from 1 to 2**62", max_record);
    Py_buffer buf, st, ln;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (end < 0 || end > buf.len) {
        PyBuffer_Release(&buf);
        return PyErr_Format(PyExc_ValueError, "end %zd is outside the buffer of %zd bytes", end, buf.len);
    }
    Py_ssize_t room = end / SD_TAR_BLOCK + 1;
    if (PyObject_GetBuffer(starts_obj, &st, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (PyObject_GetBuffer(lengths_obj, &ln, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&buf);
        PyBuffer_Release(&st);
        return NULL;
    }
    if (st.len < room * 8 || ln.len < room * 8) {
        PyBuffer_Release(&buf);
        PyBuffer_Release(&st);
        PyBuffer_Release(&ln);
        return PyErr_Format(PyExc_ValueError, "starts and lengths need room for %zd entries", room);
    }
    Result r;
    Py_BEGIN_ALLOW_THREADS;
    r = walk((const unsigned char *)buf.buf, (uint64_t)end, (int64_t *)st.buf, (int64_t *)ln.buf, max_record);
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&buf);
    PyBuffer_Release(&st);
    PyBuffer_Release(&ln);
    return Py_BuildValue("LLLLL", (long long)r.count, (long long)r.consumed, (long long)r.need, (long long)r.cut,
                         (long long)r.status);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buf, end, starts, lengths, max_record) -> (count, consumed, need, cut, status): WebDataset samples."},
    {"sample", sample, METH_O,
     "sample(record) -> (key, [(extension, start, size)]) or None: one sample record's files."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tar_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tar_scan(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "API", API) < 0 || PyModule_AddIntConstant(m, "FALLBACK", FALLBACK) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
