/* The tar framer's walk in C: the samples of a buffer of WebDataset shards (framing/tar.py's TarFramer).
 *
 * Optional at install, like _tfrecord_scan (setup.py builds it where a C compiler is; framing/tar.py walks
 * in Python without it). The walk is native/tar_core.h's, the one the batch reader (_record_reader.c)
 * frames a FIFO with: TarFramer._walk's for the usual case. At the first entry it does not take (every
 * error among them) it stops with FALLBACK, and the caller walks the buffer again in Python. So the two
 * agree by construction: C hands out what Python would, and Python says what is wrong. The GIL is released.
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

#include "native/tar_core.h"

#define API 2 /* sample() */

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
    unsigned char key_own[sizeof(((SdTarName *)0)->own)], seen[SD_TAR_EXT_BYTES];
    size_t seen_len = 0;
    SdTarName name;
    if (members == NULL) goto error;
    while (pos < end) {
        SdTarMeta meta = {NULL, NULL, NULL, 0, 0, 0};
        const unsigned char *h = NULL;
        uint64_t size = 0;
        for (;;) {
            if (pos > end || end - pos < SD_TAR_BLOCK) goto fallback; /* (a padded metadata member may end past it) */
            h = buf + pos;
            if (sd_tar_is_zero(h) || !sd_tar_header_ok(h) || !sd_tar_octal(h + 124, 12, &size)) goto fallback;
            unsigned char type = h[156];
            if (type != 'L' && type != 'K' && type != 'x' && type != 'g') break;
            if (size > SD_TAR_MAX_METADATA || size > end - pos - SD_TAR_BLOCK) goto fallback;
            if (sd_tar_read_meta(&meta, type, h + SD_TAR_BLOCK, size) < 0) goto fallback;
            pos += SD_TAR_BLOCK + size + (SD_TAR_BLOCK - size % SD_TAR_BLOCK) % SD_TAR_BLOCK;
        }
        unsigned char type = h[156];
        if (type == 'S' || type == 'M' || meta.pax_size != NULL) goto fallback;
        if (size > end - pos - SD_TAR_BLOCK) goto fallback;
        uint64_t data = pos + SD_TAR_BLOCK;
        uint64_t stop = data + size + (SD_TAR_BLOCK - size % SD_TAR_BLOCK) % SD_TAR_BLOCK;
        if (stop > end) goto fallback;
        if (type == '0' || type == 0 || type == '7') {
            sd_tar_entry_name(&name, h, &meta);
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
                if (elen + 1 > SD_TAR_EXT_BYTES - seen_len) goto fallback;
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
    SdTarWalk r;
    Py_BEGIN_ALLOW_THREADS;
    r = sd_tar_walk((const unsigned char *)buf.buf, (uint64_t)end, (int64_t *)st.buf, (int64_t *)ln.buf, max_record, 0);
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
    if (m && (PyModule_AddIntConstant(m, "API", API) < 0 || PyModule_AddIntConstant(m, "FALLBACK", SD_TAR_FALLBACK) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
