/* The TFRecord framer's hot loop in C: follow the length fields of a buffer and check both CRCs.
 *
 * Optional at install (setup.py builds it where a C compiler is; sagemaker_dist.runtime.framing.tfrecord
 * falls back to numpy and the crc32c package without it). In Python, records of varying length cost a
 * loop step each plus one crc32c call each; here a record costs its bytes through the CPU's CRC32C
 * instruction (SSE 4.2 on x86-64, the CRC extension on ARMv8), or a table where neither is there: the
 * CRC and the frame rules are native/record_core.h's, shared with the other compiled readers.
 * The GIL is released while it runs, so the reader thread's scan overlaps TensorFlow's work.
 *
 * scan(buf, end, positions, lengths, ok, max_length) -> (count, need)
 *   buf: the bytes (any buffer); end: how many of them to look at;
 *   positions, lengths: writable int64 buffers, ok: writable uint8 buffer, each with room for
 *   end // 16 + 1 entries (a TFRecord frame is at least 16 bytes);
 *   max_length: the longest record accepted (1 to 2**62, so no frame size wraps 64 bits);
 *   count: complete frames found from offset 0; positions[i] is frame i's offset, lengths[i] its data
 *   length, ok[i] 1 when both its CRCs match, 0 when its data CRC does not, 2 when its length CRC
 *   does not;
 *   need: the size of the first frame that does not fit in buf[:end] (0 when none was started).
 * The scan stops at a frame whose length CRC is wrong (what follows it cannot be trusted) and before
 * a length field over max_length (need 0: the caller looks at that field and names the error).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "native/record_core.h"

#define API 2 /* scan() takes max_length (tfrecord.py does not use a build from before) */

static inline uint32_t masked_crc(const unsigned char *p, size_t n) { return sd_masked_crc32c(p, n); }

static int writable(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t need, const char *name) {
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->len < need * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes; it needs %zd", name, view->len, need * itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    PyObject *buf_obj, *pos_obj, *len_obj, *ok_obj, *max_obj;
    Py_ssize_t end;
    if (!PyArg_ParseTuple(args, "OnOOOO", &buf_obj, &end, &pos_obj, &len_obj, &ok_obj, &max_obj)) return NULL;
    unsigned long long max_length = PyLong_AsUnsignedLongLong(max_obj); /* OverflowError when negative */
    if (max_length == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (max_length < 1 || max_length > SD_MAX_RECORD_CEILING)
        return PyErr_Format(PyExc_ValueError, "max_length %llu is not from 1 to 2**62", max_length);
    Py_buffer buf, pos, len, ok;
    if (PyObject_GetBuffer(buf_obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    if (end < 0 || end > buf.len) {
        PyBuffer_Release(&buf);
        return PyErr_Format(PyExc_ValueError, "end %zd is outside the buffer of %zd bytes", end, buf.len);
    }
    Py_ssize_t room = end / 16 + 1;
    if (writable(pos_obj, &pos, 8, room, "positions") < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (writable(len_obj, &len, 8, room, "lengths") < 0) {
        PyBuffer_Release(&buf);
        PyBuffer_Release(&pos);
        return NULL;
    }
    if (writable(ok_obj, &ok, 1, room, "ok") < 0) {
        PyBuffer_Release(&buf);
        PyBuffer_Release(&pos);
        PyBuffer_Release(&len);
        return NULL;
    }
    const unsigned char *p = buf.buf;
    int64_t *positions = pos.buf, *lengths = len.buf;
    uint8_t *oks = ok.buf;
    Py_ssize_t count = 0;
    uint64_t need = 0, at = 0, limit = (uint64_t)end;
    Py_BEGIN_ALLOW_THREADS;
    uint64_t cached_n = UINT64_MAX;
    uint32_t cached_header_crc = 0;
    while (limit - at >= 12) {
        uint64_t n = sd_load_u64(p + at);
        if (n > max_length) break; /* before any arithmetic on it: n + 16 wraps for n near 2**64 */
        if (n != cached_n) {
            cached_n = n;
            cached_header_crc = masked_crc(p + at, 8);
        }
        int header_ok = sd_load_u32(p + at + 8) == cached_header_crc;
        if (n + 16 > limit - at) { /* no wrap: n <= 2**62, at <= limit */
            if (header_ok) need = n + 16;
            break;
        }
        positions[count] = (int64_t)at;
        lengths[count] = (int64_t)n;
        oks[count] = !header_ok ? 2 : sd_load_u32(p + at + 12 + n) == masked_crc(p + at + 12, n);
        count++;
        if (!header_ok) break;
        at += n + 16;
    }
    Py_END_ALLOW_THREADS;
    PyBuffer_Release(&buf);
    PyBuffer_Release(&pos);
    PyBuffer_Release(&len);
    PyBuffer_Release(&ok);
    return Py_BuildValue("nK", count, (unsigned long long)need);
}

static PyObject *masked_crc32c(PyObject *self, PyObject *arg) {
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t value = masked_crc(data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(value);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buf, end, positions, lengths, ok, max_length) -> (count, need): TFRecord frames."},
    {"masked_crc32c", masked_crc32c, METH_O, "The masked CRC32C TFRecord stores, of a buffer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tfrecord_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tfrecord_scan(void) {
    int hardware = sd_crc32c_init();
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "HARDWARE_CRC", hardware) < 0 || PyModule_AddIntConstant(m, "API", API) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
