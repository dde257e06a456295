/* The TFRecord framer's hot loop in C: follow the length fields of a buffer and check both CRCs.
 *
 * Optional at install (setup.py builds it where a C compiler is; sagemaker_dist.runtime.framing.tfrecord
 * falls back to numpy and the crc32c package without it). In Python, records of varying length cost a
 * loop step each plus one crc32c call each; here a record costs its bytes through the CPU's CRC32C
 * instruction (SSE 4.2 on x86-64, the CRC extension on ARMv8), or a table where neither is there.
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

#define MASK_DELTA 0xa282ead8u
#define API 2 /* scan() takes max_length (tfrecord.py does not use a build from before) */
#define MAX_LENGTH_CEILING (1ull << 62)

static uint32_t table[8][256];
static uint32_t (*crc_update)(uint32_t, const unsigned char *, size_t);

static void make_table(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
}

static uint32_t crc_table(uint32_t crc, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= crc;
        crc = table[7][v & 0xff] ^ table[6][(v >> 8) & 0xff] ^ table[5][(v >> 16) & 0xff] ^
              table[4][(v >> 24) & 0xff] ^ table[3][(v >> 32) & 0xff] ^ table[2][(v >> 40) & 0xff] ^
              table[1][(v >> 48) & 0xff] ^ table[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

/* The CPU's CRC32C instructions: 8 bytes, then 1 byte at a time; one loop (crc_hw) serves both CPUs. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define CRC_TARGET __attribute__((target("sse4.2")))
#define CRC_8_BYTES(crc, v) ((uint32_t)_mm_crc32_u64((crc), (v)))
#define CRC_1_BYTE(crc, b) _mm_crc32_u8((crc), (b))
static int have_hw(void) { return __builtin_cpu_supports("sse4.2") != 0; }
#elif defined(__aarch64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_acle.h>
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif
#define CRC_TARGET __attribute__((target("+crc")))
#define CRC_8_BYTES(crc, v) __crc32cd((crc), (v))
#define CRC_1_BYTE(crc, b) __crc32cb((crc), (b))
static int have_hw(void) { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
#endif

#ifdef CRC_TARGET
CRC_TARGET static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        crc = CRC_8_BYTES(crc, v);
        p += 8;
        n -= 8;
    }
    while (n--) crc = CRC_1_BYTE(crc, *p++);
    return crc;
}
#else
static uint32_t crc_hw(uint32_t crc, const unsigned char *p, size_t n) { return crc_table(crc, p, n); }
static int have_hw(void) { return 0; }
#endif

static inline uint32_t masked_crc(const unsigned char *p, size_t n) {
    uint32_t crc = ~crc_update(0xffffffffu, p, n);
    return ((crc >> 15) | (crc << 17)) + MASK_DELTA;
}

static inline uint64_t load_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* TFRecord is little endian, as are the CPUs this builds for */
}

static inline uint32_t load_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

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
    if (max_length < 1 || max_length > MAX_LENGTH_CEILING)
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
        uint64_t n = load_u64(p + at);
        if (n > max_length) break; /* before any arithmetic on it: n + 16 wraps for n near 2**64 */
        if (n != cached_n) {
            cached_n = n;
            cached_header_crc = masked_crc(p + at, 8);
        }
        int header_ok = load_u32(p + at + 8) == cached_header_crc;
        if (n + 16 > limit - at) { /* no wrap: n <= 2**62, at <= limit */
            if (header_ok) need = n + 16;
            break;
        }
        positions[count] = (int64_t)at;
        lengths[count] = (int64_t)n;
        oks[count] = !header_ok ? 2 : load_u32(p + at + 12 + n) == masked_crc(p + at + 12, n);
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
    make_table();
    crc_update = have_hw() ? crc_hw : crc_table;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddIntConstant(m, "HARDWARE_CRC", have_hw()) < 0 || PyModule_AddIntConstant(m, "API", API) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
