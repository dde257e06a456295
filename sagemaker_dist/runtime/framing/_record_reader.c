/* The batch reader in C: reads a file descriptor (a Pipe-mode FIFO or a file) and frames its records
 * straight into a caller's buffer, with the GIL released while it reads, frames and checks CRCs.
 *
 * Optional at install, like _tfrecord_scan (setup.py builds it where a C compiler is; framing/batch_fill.py
 * falls back to the Python framers without it). The frame rules and CRC32C are native/record_core.h's,
 * shared with the TFRecord scan and the TensorFlow op.
 *
 * Reader(fd, record_format, max_record_bytes): one stream. The caller owns fd (and closes it).
 * fill(data, offsets, count, nbytes, batch, record_bytes) -> (status, count, nbytes, offset, a, b)
 *   data: a writable buffer of bytes; records are copied into it one after another, from data[nbytes];
 *   offsets: a writable int64 buffer of at least batch + 1 entries; record i is data[offsets[i]:offsets[i+1]]
 *   (offsets[0] is the caller's); count: records in the batch so far; record_bytes: 0, or the one length
 *   every record must have. Fills until `batch` records are there, the stream ends, or a record needs
 *   something the caller must do:
 *   FULL: batch records; END: the stream ended cleanly (count may be below batch);
 *   ROOM: data is too small: make it at least `a` bytes, keeping its first `b` (a record in progress),
 *   and call again;
 *   CORRUPT: a TFRecord whose data CRC does not match, at stream offset `offset`, `a` bytes long; it
 *   was consumed: skip it (call again) or fail;
 *   the others are errors at `offset`: BAD_HEADER (TFRecord length CRC; a: the length field),
 *   TOO_LONG (a: the length, b: 1 when it is at least that), BAD_MAGIC (a: the magic), BAD_FLAG
 *   (a: the flag, b: 1 when it was to start a record), TRUNCATED (a: bytes after the last complete
 *   record, b: the frame's size when known, else 0), WRONG_SIZE (a: the record's length);
 *   FALLBACK (WebDataset): an entry native/tar_core.h's walk does not take (an error among them, or valid
 *   tar it leaves out, as base-256 sizes): take() the bytes read, and frame them and the rest of the
 *   descriptor with framing/tar.py, which names what is wrong.
 * WebDataset: a record is a sample (its members' bytes as in the stream); the walk frames a buffer of
 * samples at once, each then copied once into data.
 * Lengths are checked against max_record_bytes before any arithmetic on them or any allocation; the
 * internal buffer (1 MiB) grows only as bytes come (to at most twice what came, or READ_STEP), and a
 * ROOM request asks for no more than the bytes that came plus READ_STEP of a record's claimed length.
 * TFRecords of LARGE_RECORD bytes or more are read by the kernel straight into data, with their CRC
 * and the next header in the same read: their bytes are copied once. So are WebDataset samples of
 * LARGE_RECORD bytes or more (batches of any size, no rows): the bytes buffered go into data, the rest is
 * read there and walked there (tar_large).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "native/record_core.h"
#include "native/shuffle_core.h"
#include "native/tar_core.h"

#define API 3
#define BUFFER_BYTES ((size_t)1 << 20) /* the internal buffer at first, and so the largest read */
#define LARGE_RECORD ((uint64_t)32 << 10) /* framing/base.py's LARGE_RECORD_BYTES */
#define READ_STEP ((uint64_t)64 << 20)    /* framing/base.py's READ_STEP */

enum { FMT_TFRECORD, FMT_RECORDIO, FMT_TEXTLINE, FMT_WEBDATASET };

enum {
    ST_FULL = 0,
    ST_END = 1,
    ST_ROOM = 2,
    ST_CORRUPT = 3,
    ST_BAD_HEADER = 4,
    ST_TOO_LONG = 5,
    ST_BAD_MAGIC = 6,
    ST_BAD_FLAG = 7,
    ST_TRUNCATED = 8,
    ST_WRONG_SIZE = 9,
    ST_FALLBACK = 10, /* WebDataset: an entry the walk leaves to framing/tar.py (take() its bytes) */
    /* inside this file only */
    ST_NEXT = 100, /* a record was added */
    ST_OS_ERROR,
    ST_NO_MEMORY,
    ST_SIGNAL,
    ST_AGAIN, /* WebDataset: tar_large read past its bytes, no sample among them: walk on */
};

typedef struct {
    PyObject_HEAD int fd, format, busy, eof, err;
    uint64_t max_record;
    unsigned char *buf;
    size_t cap, begin, end; /* buf[begin:end] holds the stream's next bytes */
    uint64_t offset;        /* the stream offset of buf[begin] */
    uint64_t records;       /* complete records handed out */
    uint64_t header_cache[2];
    /* the record in progress (TFRecord read straight into data, RecordIO parts): its bytes so far are in
     * data at the fill call's nbytes */
    int active;
    uint64_t rec_at, rec_n, rec_got;
    size_t scanned; /* TextLine: bytes of the line at buf[begin] already searched for its newline */
    uint64_t e_offset, e_a, e_b;
    /* WebDataset: the last walk of buf[begin:end] (walked), its samples (tar_starts, tar_lengths, from
     * begin; the next to hand out tar_next), what it consumed and needs next */
    int64_t *tar_starts, *tar_lengths;
    size_t tar_room;
    int tar_walked;
    int64_t tar_count, tar_next, tar_consumed, tar_need;
} Reader;

typedef struct {
    unsigned char *data;
    uint64_t cap, nbytes, fixed;
    int64_t *offsets;
    Py_ssize_t count;
    const int64_t *rows; /* records of one size (fixed): record i goes to row rows[i] of data; else NULL */
    Py_ssize_t limit;    /* the records data takes: rows[0:limit] */
} Batch;

/* Record k + SD_PLACE_AHEAD's row, fetched while record k is framed and copied (shuffle_core.h). */
static inline void prefetch_row(const Batch *b) {
    Py_ssize_t k = b->count + SD_PLACE_AHEAD;
    if (b->rows != NULL && k < b->limit) sd_prefetch_place(b->data + (uint64_t)b->rows[k] * b->fixed, b->fixed);
}

/* Where the next record's bytes go: after the ones before it, or its row. */
static inline unsigned char *dest(const Batch *b) {
    return b->rows ? b->data + (uint64_t)b->rows[b->count] * b->fixed : b->data + b->nbytes;
}

static int fail(Reader *r, int status, uint64_t offset, uint64_t a, uint64_t b) {
    r->e_offset = offset;
    r->e_a = a;
    r->e_b = b;
    return status;
}

static int room(Reader *r, uint64_t need, uint64_t keep) { return fail(r, ST_ROOM, 0, need, keep); }

static inline void consume(Reader *r, size_t n) {
    r->begin += n;
    r->offset += n;
}

static inline void add_record(Reader *r, Batch *b, uint64_t n) {
    b->nbytes += n;
    b->count++;
    b->offsets[b->count] = (int64_t)b->nbytes;
    r->records++;
}

/* One read into `parts`: 0 at the end of the stream, else the bytes read; -1 with r->err on a failure,
 * -2 on EINTR (the caller looks at Python's signals). */
static ssize_t read_some(Reader *r, struct iovec *parts, int count) {
    for (;;) {
        ssize_t got = count == 1 ? read(r->fd, parts[0].iov_base, parts[0].iov_len) : readv(r->fd, parts, count);
        if (got >= 0) return got;
        if (errno == EINTR) return -2;
        if (errno == EAGAIN || errno == EWOULDBLOCK) { /* a non-blocking descriptor: wait for bytes */
            struct pollfd p = {r->fd, POLLIN, 0};
            if (poll(&p, 1, -1) < 0 && errno == EINTR) return -2;
            continue;
        }
        r->err = errno;
        return -1;
    }
}

/* At least `need` bytes in buf[begin:end], fewer only at the end of the stream; reads take what the
 * buffer has room for. The buffer grows to at most twice the bytes in it, or READ_STEP: `need` may be a
 * length the stream only claims. */
static int fill(Reader *r, uint64_t need) {
    while (r->end - r->begin < need && !r->eof) {
        size_t have = r->end - r->begin;
        if (r->cap - r->begin < need || r->end == r->cap) {
            memmove(r->buf, r->buf + r->begin, have);
            r->begin = 0;
            r->end = have;
            if (r->cap < need) {
                uint64_t size = need > 2 * (uint64_t)r->cap ? need : 2 * (uint64_t)r->cap;
                uint64_t bound = 2 * (uint64_t)have > READ_STEP ? 2 * (uint64_t)have : READ_STEP;
                if (size > bound) size = bound;
                if (size > r->cap) {
                    unsigned char *bigger = realloc(r->buf, (size_t)size);
                    if (bigger == NULL) return ST_NO_MEMORY;
                    r->buf = bigger;
                    r->cap = (size_t)size;
                }
            }
        }
        struct iovec part = {r->buf + r->end, r->cap - r->end};
        ssize_t got = read_some(r, &part, 1);
        if (got == -1) return ST_OS_ERROR;
        if (got == -2) return ST_SIGNAL;
        if (got == 0) r->eof = 1;
        r->end += (size_t)got;
    }
    return 0;
}

/* The end of the stream inside a record: `so_far` bytes after the last complete one, of a `frame`-byte
 * frame (0: not known). */
static int truncated(Reader *r, uint64_t at, uint64_t so_far, uint64_t frame) {
    return fail(r, ST_TRUNCATED, at, so_far, frame);
}

/* ---- TFRecord ---- */

/* The rest of a large record, read straight into data, then its CRC. */
static int tfrecord_large(Reader *r, Batch *b) {
    while (r->rec_got < r->rec_n) { /* the buffer is empty: its bytes went into data */
        uint64_t left = b->cap - b->nbytes - r->rec_got;
        uint64_t rest = r->rec_n - r->rec_got;
        if (left == 0) {
            uint64_t step = r->rec_got > READ_STEP ? r->rec_got : READ_STEP;
            return room(r, b->nbytes + r->rec_got + (rest < step ? rest : step), b->nbytes + r->rec_got);
        }
        uint64_t want = rest < left ? rest : left;
        struct iovec parts[2] = {{dest(b) + r->rec_got, (size_t)want}, {r->buf, 16}};
        ssize_t got = read_some(r, parts, want == rest ? 2 : 1); /* the CRC and the next header too */
        if (got == -1) return ST_OS_ERROR;
        if (got == -2) return ST_SIGNAL;
        if (got == 0) {
            r->eof = 1;
            return truncated(r, r->rec_at, SD_TFRECORD_HEADER + r->rec_got, r->rec_n + SD_TFRECORD_OVERHEAD);
        }
        uint64_t into = (uint64_t)got < want ? (uint64_t)got : want;
        r->rec_got += into;
        r->offset += into;
        r->begin = 0;
        r->end = (size_t)((uint64_t)got - into);
    }
    int s = fill(r, 4);
    if (s) return s;
    size_t have = r->end - r->begin;
    if (have < 4) return truncated(r, r->rec_at, SD_TFRECORD_HEADER + r->rec_n + have, r->rec_n + 16);
    uint32_t stored = sd_load_u32(r->buf + r->begin);
    consume(r, 4);
    r->active = 0;
    if (stored != sd_masked_crc32c(dest(b), (size_t)r->rec_n)) return fail(r, ST_CORRUPT, r->rec_at, r->rec_n, 0);
    add_record(r, b, r->rec_n);
    return ST_NEXT;
}

static int tfrecord_next(Reader *r, Batch *b) {
    if (r->active) return tfrecord_large(r, b);
    int s = fill(r, SD_TFRECORD_HEADER);
    if (s) return s;
    size_t have = r->end - r->begin;
    if (have < SD_TFRECORD_HEADER) return have ? truncated(r, r->offset, have, 0) : ST_END;
    uint64_t n;
    switch (sd_tfrecord_header(r->buf + r->begin, r->max_record, &n, r->header_cache)) {
    case SD_FRAME_BAD_HEADER:
        return fail(r, ST_BAD_HEADER, r->offset, n, 0);
    case SD_FRAME_TOO_LONG:
        return fail(r, ST_TOO_LONG, r->offset, n, 0);
    }
    /* n <= max_record <= 2**62: no sum below wraps */
    if (b->fixed && n != b->fixed) return fail(r, ST_WRONG_SIZE, r->offset, n, 0);
    if (have < n + SD_TFRECORD_OVERHEAD && n >= LARGE_RECORD) { /* the kernel's copy is the record's */
        uint64_t buffered = have - SD_TFRECORD_HEADER < n ? have - SD_TFRECORD_HEADER : n;
        uint64_t first = buffered > READ_STEP ? buffered : READ_STEP;
        if (first > n) first = n;
        if (b->cap - b->nbytes < first) return room(r, b->nbytes + first, b->nbytes);
        r->active = 1;
        r->rec_at = r->offset;
        r->rec_n = n;
        consume(r, SD_TFRECORD_HEADER);
        memcpy(dest(b), r->buf + r->begin, (size_t)buffered);
        consume(r, (size_t)buffered);
        r->rec_got = buffered;
        return tfrecord_large(r, b);
    }
    if ((s = fill(r, n + SD_TFRECORD_OVERHEAD))) return s;
    have = r->end - r->begin;
    if (have < n + SD_TFRECORD_OVERHEAD) return truncated(r, r->offset, have, n + SD_TFRECORD_OVERHEAD);
    const unsigned char *data = r->buf + r->begin + SD_TFRECORD_HEADER;
    if (!sd_tfrecord_data_ok(data, n)) {
        uint64_t at = r->offset;
        consume(r, (size_t)(n + SD_TFRECORD_OVERHEAD));
        return fail(r, ST_CORRUPT, at, n, 0);
    }
    if (b->cap - b->nbytes < n) return room(r, b->nbytes + n, b->nbytes);
    memcpy(dest(b), data, (size_t)n);
    consume(r, (size_t)(n + SD_TFRECORD_OVERHEAD));
    add_record(r, b, n);
    return ST_NEXT;
}

/* ---- RecordIO: a record's parts are copied into data as they come ---- */

static int recordio_next(Reader *r, Batch *b) {
    for (;;) {
        int s = fill(r, SD_RECORDIO_HEADER);
        if (s) return s;
        size_t have = r->end - r->begin;
        uint64_t start = r->active ? r->rec_at : r->offset;
        uint64_t before = r->offset - start; /* the record's bytes already consumed (its parts so far) */
        if (have < SD_RECORDIO_HEADER) {
            if (!have && !r->active) return ST_END;
            return truncated(r, start, before + have, r->active ? before + SD_RECORDIO_HEADER : 0);
        }
        uint32_t magic, flag, n;
        switch (sd_recordio_header(r->buf + r->begin, !r->active, &magic, &flag, &n)) {
        case SD_FRAME_BAD_MAGIC:
            return fail(r, ST_BAD_MAGIC, r->offset, magic, 0);
        case SD_FRAME_BAD_FLAG:
            return fail(r, ST_BAD_FLAG, r->offset, flag, !r->active);
        }
        uint64_t size = r->rec_got + n; /* the parts so far: the record is at least this long */
        if (size > r->max_record)
            return fail(r, ST_TOO_LONG, start, size, r->active || flag != SD_RECORDIO_WHOLE);
        if (b->fixed && size > b->fixed) return fail(r, ST_WRONG_SIZE, start, size, 0);
        uint64_t frame = sd_recordio_frame(n);
        if ((s = fill(r, frame))) return s;
        have = r->end - r->begin;
        if (have < frame) return truncated(r, start, before + have, before + frame);
        if (b->cap - b->nbytes < size) return room(r, b->nbytes + size, b->nbytes + r->rec_got);
        memcpy(dest(b) + r->rec_got, r->buf + r->begin + SD_RECORDIO_HEADER, n);
        if (!r->active) {
            r->active = 1;
            r->rec_at = r->offset;
        }
        r->rec_got = size;
        consume(r, (size_t)frame);
        if (sd_recordio_last(flag)) {
            r->active = 0;
            r->rec_got = 0;
            if (b->fixed && size != b->fixed) return fail(r, ST_WRONG_SIZE, start, size, 0);
            add_record(r, b, size);
            return ST_NEXT;
        }
    }
}

/* ---- text lines ---- */

static int line_out(Reader *r, Batch *b, size_t len, size_t used) {
    size_t line = sd_line_length(r->buf + r->begin, len);
    if (line > r->max_record) return fail(r, ST_TOO_LONG, r->offset, line, 0);
    if (b->fixed && line != b->fixed) return fail(r, ST_WRONG_SIZE, r->offset, line, 0);
    if (b->cap - b->nbytes < line) return room(r, b->nbytes + line, b->nbytes);
    memcpy(dest(b), r->buf + r->begin, line);
    consume(r, used);
    r->scanned = 0;
    add_record(r, b, line);
    return ST_NEXT;
}

static int textline_next(Reader *r, Batch *b) {
    for (;;) {
        const unsigned char *start = r->buf + r->begin;
        size_t have = r->end - r->begin;
        const unsigned char *nl =
            have > r->scanned ? memchr(start + r->scanned, '\n', have - r->scanned) : NULL;
        if (nl != NULL) return line_out(r, b, (size_t)(nl - start), (size_t)(nl - start) + 1);
        if (r->eof) return have ? line_out(r, b, have, have) : ST_END;
        size_t so_far = sd_line_length(start, have); /* less a '\r' that a newline may follow */
        if (so_far > r->max_record) return fail(r, ST_TOO_LONG, r->offset, so_far, 1);
        r->scanned = have;
        int s = fill(r, (uint64_t)have + 1);
        if (s) return s;
    }
}

/* ---- WebDataset (tar): native/tar_core.h's walk over the buffer, each sample copied once into data ---- */

/* Room for `slots` samples in tar_starts and tar_lengths. */
static int tar_slots(Reader *r, size_t slots) {
    if (slots <= r->tar_room) return 0;
    size_t grown = slots > 2 * r->tar_room ? slots : 2 * r->tar_room;
    int64_t *starts = realloc(r->tar_starts, grown * sizeof(int64_t));
    if (starts == NULL) return ST_NO_MEMORY;
    r->tar_starts = starts;
    int64_t *lengths = realloc(r->tar_lengths, grown * sizeof(int64_t));
    if (lengths == NULL) return ST_NO_MEMORY;
    r->tar_lengths = lengths;
    r->tar_room = grown;
    return 0;
}

/* A sample of LARGE_RECORD bytes or more read by the kernel straight into data: its bytes so far (rec_got,
 * at dest) were the buffer's, the rest up to what the walk needs (rec_n) is read there, then walked there.
 * The sample stays; what follows it goes back to the empty buffer. Where the walk does not take the bytes
 * (FALLBACK), or the stream ends inside them, they all go back to the buffer for framing/tar.py. r->offset
 * stays the stream offset of dest's first byte until the sample is added. */
static int tar_large(Reader *r, Batch *b) {
    for (;;) {
        while (r->rec_got < r->rec_n && !r->eof) {
            uint64_t left = b->cap - b->nbytes - r->rec_got, rest = r->rec_n - r->rec_got;
            if (left == 0) { /* no more than the bytes that came, or READ_STEP, ahead of them */
                uint64_t step = r->rec_got > READ_STEP ? r->rec_got : READ_STEP;
                return room(r, b->nbytes + r->rec_got + (rest < step ? rest : step), b->nbytes + r->rec_got);
            }
            struct iovec part = {dest(b) + r->rec_got, (size_t)(rest < left ? rest : left)};
            ssize_t got = read_some(r, &part, 1);
            if (got == -1) return ST_OS_ERROR;
            if (got == -2) return ST_SIGNAL;
            if (got == 0) r->eof = 1;
            r->rec_got += (uint64_t)got;
        }
        int s = tar_slots(r, (size_t)(r->rec_got / SD_TAR_BLOCK + 1));
        if (s) return s;
        SdTarWalk w = sd_tar_walk(dest(b), r->rec_got, r->tar_starts, r->tar_lengths, r->max_record, r->eof);
        uint64_t keep = 0, n = 0, skip = 0;
        if (!w.status && !w.count && !w.need && (uint64_t)w.consumed == r->rec_got) { /* all read past */
            r->offset += r->rec_got;
            r->active = 0;
            r->rec_got = r->rec_n = 0;
            r->tar_walked = 0;
            return ST_AGAIN;
        }
        if (!w.status && w.count) { /* the sample: entries read past before it (skip) are dropped */
            skip = (uint64_t)r->tar_starts[0];
            n = (uint64_t)r->tar_lengths[0];
            keep = skip + n;
        } else if (!w.status && !r->eof && w.need) {
            if (w.consumed) { /* entries read past, before the sample */
                memmove(dest(b), dest(b) + w.consumed, (size_t)(r->rec_got - (uint64_t)w.consumed));
                r->rec_got -= (uint64_t)w.consumed;
                r->offset += (uint64_t)w.consumed;
            }
            /* another member of the sample, or the header after it: read on, a header's block at least
             * where the walk's need is in already (an entry of no sample, a directory, after the sample) */
            r->rec_n = (uint64_t)w.need > r->rec_got ? (uint64_t)w.need : r->rec_got + SD_TAR_BLOCK;
            continue;
        }
        uint64_t back = r->rec_got - keep; /* to the buffer: what follows the sample, or everything */
        if (back > r->cap) {
            unsigned char *bigger = realloc(r->buf, (size_t)back);
            if (bigger == NULL) return ST_NO_MEMORY;
            r->buf = bigger;
            r->cap = (size_t)back;
        }
        memcpy(r->buf, dest(b) + keep, (size_t)back);
        r->begin = 0;
        r->end = (size_t)back;
        r->active = 0;
        r->rec_got = r->rec_n = 0;
        r->tar_walked = 0;
        if (!keep) return fail(r, ST_FALLBACK, r->offset, 0, 0);
        if (skip) memmove(dest(b), dest(b) + skip, (size_t)n);
        r->offset += keep;
        add_record(r, b, n);
        return ST_NEXT;
    }
}

/* Hand out the next sample of the last walk; else drop what it consumed, read what it needs and walk
 * again. The walk takes the usual entries only: at any other (an error among them) the reader stops with
 * FALLBACK and the caller frames the rest (take()) with framing/tar.py, which names what is wrong. */
static int tar_next(Reader *r, Batch *b) {
    if (r->active) {
        int s = tar_large(r, b);
        if (s != ST_AGAIN) return s;
    }
    for (;;) {
        if (r->tar_walked) {
            if (r->tar_next < r->tar_count) {
                uint64_t start = (uint64_t)r->tar_starts[r->tar_next], n = (uint64_t)r->tar_lengths[r->tar_next];
                if (b->fixed && n != b->fixed) return fail(r, ST_WRONG_SIZE, r->offset + start, n, 0);
                if (b->cap - b->nbytes < n) return room(r, b->nbytes + n, b->nbytes);
                memcpy(dest(b), r->buf + r->begin + start, (size_t)n);
                r->tar_next++;
                add_record(r, b, n);
                return ST_NEXT;
            }
            consume(r, (size_t)r->tar_consumed);
            r->tar_walked = 0;
            size_t have = r->end - r->begin;
            if (r->eof) { /* walked as the stream's last bytes: all consumed */
                if (have) return fail(r, ST_FALLBACK, r->offset, 0, 0);
                return ST_END;
            }
            uint64_t want = (uint64_t)r->tar_need > have ? (uint64_t)r->tar_need : (uint64_t)have + 1;
            if ((uint64_t)r->tar_need > have && want >= LARGE_RECORD && have && !b->fixed && !b->rows) {
                /* a large sample: into data, the rest read there (tar_large) */
                uint64_t first = want < have + READ_STEP ? want : have + READ_STEP;
                if (b->cap - b->nbytes < first) return room(r, b->nbytes + first, b->nbytes);
                memcpy(dest(b), r->buf + r->begin, have);
                r->begin = r->end = 0; /* (r->offset stays the sample's until it is added) */
                r->active = 1;
                r->rec_got = have;
                r->rec_n = want;
                int s = tar_large(r, b);
                if (s != ST_AGAIN) return s;
                continue;
            }
            int s = fill(r, want); /* what is left is a sample or an entry in progress: more bytes first */
            if (s) return s;
        } else if (r->begin == r->end && !r->eof) {
            int s = fill(r, 1);
            if (s) return s;
        }
        size_t have = r->end - r->begin;
        if (!have && r->eof) return ST_END;
        int s = tar_slots(r, have / SD_TAR_BLOCK + 1);
        if (s) return s;
        SdTarWalk w = sd_tar_walk(r->buf + r->begin, have, r->tar_starts, r->tar_lengths, r->max_record, r->eof);
        if (w.status || (r->eof && w.need)) return fail(r, ST_FALLBACK, r->offset, 0, 0);
        r->tar_walked = 1;
        r->tar_count = w.count;
        r->tar_next = 0;
        r->tar_consumed = w.consumed;
        r->tar_need = w.need;
    }
}

/* ---- the Python type ---- */

static int Reader_init(Reader *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"fd", "record_format", "max_record_bytes", NULL};
    int fd;
    const char *format;
    unsigned long long max_record;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "isK", names, &fd, &format, &max_record)) return -1;
    if (max_record < 1 || max_record > SD_MAX_RECORD_CEILING) {
        PyErr_Format(PyExc_ValueError, "max_record_bytes %llu is not from 1 to 2**62", max_record);
        return -1;
    }
    if (strcmp(format, "TFRecord") == 0) {
        self->format = FMT_TFRECORD;
    } else if (strcmp(format, "RecordIO") == 0) {
        self->format = FMT_RECORDIO;
    } else if (strcmp(format, "TextLine") == 0) {
        self->format = FMT_TEXTLINE;
    } else if (strcmp(format, "WebDataset") == 0) {
        self->format = FMT_WEBDATASET;
    } else {
        PyErr_Format(PyExc_ValueError, "record_format %s is not one of TFRecord, RecordIO, TextLine, WebDataset",
                     format);
        return -1;
    }
    if (fd < 0) {
        PyErr_SetString(PyExc_ValueError, "fd is negative");
        return -1;
    }
    free(self->buf);
    self->buf = malloc(BUFFER_BYTES);
    if (self->buf == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->fd = fd;
    self->max_record = max_record;
    self->cap = BUFFER_BYTES;
    self->begin = self->end = 0;
    self->eof = self->busy = self->active = 0;
    self->offset = self->records = self->rec_at = self->rec_n = self->rec_got = 0;
    self->scanned = 0;
    self->header_cache[0] = self->header_cache[1] = 0;
    self->tar_walked = 0;
    self->tar_count = self->tar_next = self->tar_consumed = self->tar_need = 0;
    return 0;
}

static void Reader_dealloc(Reader *self) {
    free(self->buf);
    free(self->tar_starts);
    free(self->tar_lengths);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The next record of the reader's format, into b. */
static int next_record(Reader *r, Batch *b) {
    return r->format == FMT_TFRECORD     ? tfrecord_next(r, b)
           : r->format == FMT_RECORDIO   ? recordio_next(r, b)
           : r->format == FMT_WEBDATASET ? tar_next(r, b)
                                         : textline_next(r, b);
}

/* Whether a run with the GIL released (save: Py_BEGIN_ALLOW_THREADS's thread state) stops at status s:
 * at anything but a signal, or at a signal whose Python handler raised (*raised set); at another signal
 * it goes on. */
static int run_stops(int s, PyThreadState **save, int *raised) {
    if (s != ST_SIGNAL) return 1;
    PyEval_RestoreThread(*save);
    *raised = PyErr_CheckSignals() < 0;
    *save = PyEval_SaveThread();
    return *raised;
}

/* fill()'s and place()'s answer after a run that ended with status s: (status, count, nbytes, offset, a,
 * b), or the OS error or MemoryError. */
static PyObject *answer(Reader *r, int s, Py_ssize_t count, uint64_t nbytes) {
    if (s == ST_OS_ERROR) {
        errno = r->err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    if (s == ST_NO_MEMORY) return PyErr_NoMemory();
    return Py_BuildValue("inKKKK", s, count, (unsigned long long)nbytes, (unsigned long long)r->e_offset,
                         (unsigned long long)r->e_a, (unsigned long long)r->e_b);
}

static PyObject *Reader_fill(Reader *self, PyObject *args) {
    PyObject *data_obj, *offsets_obj, *rows_obj = Py_None;
    Py_ssize_t count, batch;
    unsigned long long nbytes, fixed, stop_bytes = 0;
    if (!PyArg_ParseTuple(args, "OOnKnK|OK", &data_obj, &offsets_obj, &count, &nbytes, &batch, &fixed, &rows_obj,
                          &stop_bytes))
        return NULL;
    if (self->buf == NULL) return PyErr_Format(PyExc_RuntimeError, "Reader.__init__ was not called");
    if (batch < 1 || count < 0 || count > batch)
        return PyErr_Format(PyExc_ValueError, "count %zd and batch %zd: need 0 <= count <= batch, 1 <= batch", count,
                            batch);
    Py_buffer data, offsets;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(offsets_obj, &offsets, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (offsets.len < (batch + 1) * 8 || nbytes > (unsigned long long)data.len) {
        PyBuffer_Release(&data);
        PyBuffer_Release(&offsets);
        return PyErr_Format(PyExc_ValueError,
                            "offsets holds %zd bytes for %zd entries, data %zd bytes from byte %llu", offsets.len,
                            batch + 1, data.len, nbytes);
    }
    if (self->active && (unsigned long long)data.len - nbytes < self->rec_got) {
        /* a record read straight into data (a long record or sample under way) goes on at data[nbytes] */
        unsigned long long got = self->rec_got;
        Py_ssize_t len = data.len;
        PyBuffer_Release(&data);
        PyBuffer_Release(&offsets);
        return PyErr_Format(PyExc_ValueError,
                            "a record under way holds %llu bytes at byte %llu of data, which has %zd: pass the "
                            "batch it was read into",
                            got, nbytes, len);
    }
    Py_buffer rows = {0};
    if (rows_obj != Py_None) {
        if (PyObject_GetBuffer(rows_obj, &rows, PyBUF_C_CONTIGUOUS) < 0) {
            PyBuffer_Release(&data);
            PyBuffer_Release(&offsets);
            return NULL;
        }
        const char *problem = NULL;
        if (fixed == 0) problem = "rows need record_bytes";
        else if (rows.len < batch * 8) problem = "rows holds fewer than batch entries";
        for (Py_ssize_t i = count; problem == NULL && i < batch; i++) {
            int64_t row = ((const int64_t *)rows.buf)[i];
            if (row < 0 || (uint64_t)row >= (uint64_t)data.len / fixed) problem = "a row lies outside data";
        }
        if (problem != NULL) {
            PyBuffer_Release(&rows);
            PyBuffer_Release(&data);
            PyBuffer_Release(&offsets);
            return PyErr_Format(PyExc_ValueError, "%s", problem);
        }
    }
    if (self->busy) {
        if (rows.obj != NULL) PyBuffer_Release(&rows);
        PyBuffer_Release(&data);
        PyBuffer_Release(&offsets);
        return PyErr_Format(PyExc_RuntimeError, "Reader.fill is running in another thread");
    }
    self->busy = 1;
    Batch b = {data.buf, (uint64_t)data.len, nbytes, fixed, offsets.buf, count, rows.obj != NULL ? rows.buf : NULL,
               batch};
    int s = ST_FULL, raised = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (;;) {
        s = ST_FULL;
        while (b.count < batch && !(stop_bytes && b.nbytes >= stop_bytes)) {
            prefetch_row(&b);
            s = next_record(self, &b);
            if (s != ST_NEXT) break;
            s = ST_FULL;
        }
        if (run_stops(s, &_save, &raised)) break;
    }
    Py_END_ALLOW_THREADS;
    self->busy = 0;
    if (rows.obj != NULL) PyBuffer_Release(&rows);
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    return raised ? NULL : answer(self, s, b.count, b.nbytes);
}

/* place(data, carry, spans, slots, bounds, state, limit, stop_bytes) -> (status, count, nbytes, offset, a, b):
 * a shuffle window read with each record straight into the region of its batch (records of any size;
 * TFRecord, RecordIO, TextLine). Record i goes to region slots[i], after the records there before it;
 * region r is bounds[3r] (0: data, 1: carry, the buffer of the batch carried into the window),
 * bounds[3r + 1] its next free byte (moved on), bounds[3r + 2] its end. spans[2i], spans[2i + 1]: where
 * record i went. state: [records placed, their bytes, the start of the record under way or -1] (kept
 * between calls). Fills until `limit` records are placed, their bytes reach stop_bytes, the stream ends,
 * or a record needs something the caller must do: fill()'s statuses, ROOM meaning the record does not fit
 * its region (a: the end it needs, b: the end of its bytes so far, from state[2]): the caller reads the
 * rest of the window the usual way (fill()), after the records placed and the record's bytes so far. */
static PyObject *Reader_place(Reader *self, PyObject *args) {
    PyObject *objs[6];
    Py_ssize_t limit;
    unsigned long long stop_bytes;
    if (!PyArg_ParseTuple(args, "OOOOOOnK", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &limit,
                          &stop_bytes))
        return NULL;
    if (self->buf == NULL) return PyErr_Format(PyExc_RuntimeError, "Reader.__init__ was not called");
    if (self->format == FMT_WEBDATASET) return PyErr_Format(PyExc_ValueError, "place() takes no WebDataset");
    Py_buffer v[6];
    int got = 0;
    for (; got < 6; got++) {
        if (got == 1 && objs[1] == Py_None) {
            v[1].obj = NULL;
            v[1].buf = NULL;
            v[1].len = 0;
            continue;
        }
        int flags = got == 3 ? PyBUF_C_CONTIGUOUS : PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS;
        if (PyObject_GetBuffer(objs[got], &v[got], flags) < 0) break;
    }
    PyObject *result = NULL;
    const char *problem = NULL;
    int64_t *spans = v[2].buf, *bounds = v[4].buf, *state = v[5].buf;
    const int64_t *slots = v[3].buf;
    Py_ssize_t regions = got == 6 ? v[4].len / 24 : 0;
    if (got < 6) goto done;
    if (limit < 0 || v[2].len < limit * 16 || v[3].len < limit * 8 || v[5].len < 24) problem = "spans, slots or state is too short";
    else if (state[0] < 0 || state[0] > limit || state[1] < 0) problem = "state is not a placement's";
    for (Py_ssize_t r = 0; problem == NULL && r < regions; r++) {
        int64_t which = bounds[3 * r], at = bounds[3 * r + 1], end = bounds[3 * r + 2];
        Py_ssize_t len = which == 1 ? v[1].len : v[0].len;
        if ((which != 0 && which != 1) || (which == 1 && v[1].obj == NULL) || at < 0 || at > end || end > len)
            problem = "a region lies outside its buffer";
    }
    for (Py_ssize_t i = state[0]; problem == NULL && i < limit; i++)
        if (slots[i] < 0 || slots[i] >= regions) problem = "a slot names no region";
    if (problem == NULL && state[2] >= 0) {
        const int64_t *region = bounds + 3 * slots[state[0]];
        if (state[0] == limit || state[2] != region[1]) problem = "the record under way is not at its region's end";
    }
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        goto done;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Reader.fill is running in another thread");
        goto done;
    }
    self->busy = 1;
    int s = ST_FULL, raised = 0;
    Py_BEGIN_ALLOW_THREADS;
    for (;;) {
        s = ST_FULL;
        while (state[0] < limit && !(stop_bytes && (uint64_t)state[1] >= stop_bytes)) {
            int64_t *region = bounds + 3 * slots[state[0]];
            unsigned char *base = region[0] == 1 ? v[1].buf : v[0].buf;
            int64_t end_at[2];
            /* the record's batch: from its region's next free byte to its end (add_record sets end_at[1]) */
            Batch b = {base, (uint64_t)region[2], (uint64_t)region[1], 0, end_at, 0, NULL, 1};
            state[2] = region[1];
            s = next_record(self, &b); /* not WebDataset (refused above) */
            if (s != ST_NEXT) {
                if (s != ST_ROOM && s != ST_SIGNAL) state[2] = -1; /* consumed (CORRUPT), ended, or failed */
                break;
            }
            spans[2 * state[0]] = region[1];
            spans[2 * state[0] + 1] = (int64_t)b.nbytes;
            state[1] += (int64_t)b.nbytes - region[1];
            region[1] = (int64_t)b.nbytes;
            state[0]++;
            state[2] = -1;
            s = ST_FULL;
        }
        if (run_stops(s, &_save, &raised)) break;
    }
    Py_END_ALLOW_THREADS;
    self->busy = 0;
    if (!raised) result = answer(self, s, (Py_ssize_t)state[0], (uint64_t)state[1]);
done:
    for (int k = 0; k < got; k++)
        if (v[k].obj != NULL) PyBuffer_Release(&v[k]);
    return result;
}

/* take() -> bytes: the stream's bytes read but not handed out (after FALLBACK: for framing/tar.py to frame
 * them, then the rest of the descriptor); the reader moves past them. */
static PyObject *Reader_take(Reader *self, PyObject *unused) {
    if (self->busy) return PyErr_Format(PyExc_RuntimeError, "Reader.fill is running in another thread");
    if (self->buf == NULL) return PyErr_Format(PyExc_RuntimeError, "Reader.__init__ was not called");
    PyObject *out = PyBytes_FromStringAndSize((const char *)self->buf + self->begin, (Py_ssize_t)(self->end - self->begin));
    if (out == NULL) return NULL;
    consume(self, self->end - self->begin);
    self->tar_walked = 0;
    return out;
}

static PyObject *Reader_get_records(Reader *self, void *closure) { return PyLong_FromUnsignedLongLong(self->records); }
static PyObject *Reader_get_offset(Reader *self, void *closure) { return PyLong_FromUnsignedLongLong(self->offset); }

static PyMethodDef Reader_methods[] = {
    {"fill", (PyCFunction)Reader_fill, METH_VARARGS,
     "fill(data, offsets, count, nbytes, batch, record_bytes, rows=None, stop_bytes=0) -> (status, count, nbytes, "
     "offset, a, b)"},
    {"place", (PyCFunction)Reader_place, METH_VARARGS,
     "place(data, carry, spans, slots, bounds, state, limit, stop_bytes) -> (status, count, nbytes, offset, a, b)"},
    {"take", (PyCFunction)Reader_take, METH_NOARGS, "take() -> bytes read but not handed out; the reader moves past them"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Reader_getset[] = {
    {"records", (getter)Reader_get_records, NULL, "complete records handed out", NULL},
    {"offset", (getter)Reader_get_offset, NULL, "the stream offset of the next unread byte", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sagemaker_dist.runtime.framing._record_reader.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(fd, record_format, max_record_bytes): batches of records from a file descriptor",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
    .tp_getset = Reader_getset,
};

static PyObject *masked_crc32c(PyObject *self, PyObject *arg) {
    Py_buffer data;
    if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) < 0) return NULL;
    uint32_t value = sd_masked_crc32c(data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(value);
}

/* window_order(window_key, size, n, out, scratch): shuffle_core.h's order of a window's n records into the
 * int64 buffer out (n entries), with scratch (size entries). */
static PyObject *window_order(PyObject *self, PyObject *args) {
    unsigned long long key, size, n;
    PyObject *out_obj, *scratch_obj;
    if (!PyArg_ParseTuple(args, "KKKOO", &key, &size, &n, &out_obj, &scratch_obj)) return NULL;
    if (n > size || size >= ((unsigned long long)1 << 31))
        return PyErr_Format(PyExc_ValueError, "n %llu, size %llu: need n <= size < 2**31", n, size);
    Py_buffer out, scratch;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(scratch_obj, &scratch, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    PyObject *result = NULL;
    if ((unsigned long long)out.len < 8 * n || (unsigned long long)scratch.len < 8 * size || out.buf == scratch.buf) {
        PyErr_SetString(PyExc_ValueError, "out needs n int64 entries and scratch size, apart");
    } else {
        Py_BEGIN_ALLOW_THREADS;
        sd_window_order(key, size, n, out.buf, scratch.buf);
        Py_END_ALLOW_THREADS;
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&out);
    PyBuffer_Release(&scratch);
    return result;
}

/* Records from STREAM_COPY_MIN bytes are gathered with streaming (non-temporal) stores: a group of
 * batches is tens of MB, past the caches, and a plain store first reads each destination line in. 150 KB
 * records in a window's order, on the 2-core VM: 0.08-0.12 s/GB streamed against 0.14-0.15 with memcpy
 * (the gather in-process on pooled buffers). At 1 KB streaming was slower (0.42 against 0.17 s/GB in a C
 * loop: a record's partial lines at each end flush the write-combining buffers). */
#define STREAM_COPY_MIN 4096

#if defined(__SSE2__)
#include <emmintrin.h>
static void stream_copy(unsigned char *dst, const unsigned char *src, uint64_t n) {
    size_t head = (size_t)(-(uintptr_t)dst & 63); /* up to dst's first cache line: whole lines streamed */
    memcpy(dst, src, head);
    dst += head, src += head, n -= head;
    for (; n >= 64; n -= 64, dst += 64, src += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src), b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32)), d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
    memcpy(dst, src, n);
}
#define STREAM_FENCE() _mm_sfence() /* streamed stores are weakly ordered: done before another thread reads */
#else
#define stream_copy(dst, src, n) memcpy(dst, src, n)
#define STREAM_FENCE() ((void)0)
#endif

/* gather(dst, dst_offsets, count, nbytes, src, src_offsets, order) -> (count, nbytes): the records of src
 * (record i is src[src_offsets[i]:src_offsets[i + 1]]) named by the int64 order, appended to dst after its
 * count records (nbytes bytes), their offsets to dst_offsets. dst must have room for them. */
static PyObject *gather(PyObject *self, PyObject *args) {
    PyObject *objs[5];
    Py_ssize_t count;
    unsigned long long nbytes;
    if (!PyArg_ParseTuple(args, "OOnKOOO", &objs[0], &objs[1], &count, &nbytes, &objs[2], &objs[3], &objs[4]))
        return NULL;
    Py_buffer v[5];
    int got = 0;
    for (; got < 5; got++) {
        int flags = got < 2 ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS : PyBUF_C_CONTIGUOUS;
        if (PyObject_GetBuffer(objs[got], &v[got], flags) < 0) break;
    }
    PyObject *result = NULL;
    if (got == 5) {
        unsigned char *dst = v[0].buf;
        int64_t *dst_offsets = v[1].buf;
        const unsigned char *src = v[2].buf;
        const int64_t *src_offsets = v[3].buf, *order = v[4].buf;
        Py_ssize_t n = v[4].len / 8, records = v[3].len / 8 - 1;
        uint64_t need = nbytes;
        const char *problem = count < 0 || (count + n + 1) * 8 > v[1].len ? "dst_offsets is too short" : NULL;
        for (Py_ssize_t k = 0; problem == NULL && k < n; k++) {
            int64_t i = order[k];
            if (i < 0 || i >= records || src_offsets[i] < 0 || src_offsets[i] > src_offsets[i + 1] ||
                (uint64_t)src_offsets[i + 1] > (uint64_t)v[2].len)
                problem = "order names a record outside src";
            else
                need += (uint64_t)(src_offsets[i + 1] - src_offsets[i]);
        }
        if (problem == NULL && need > (uint64_t)v[0].len) problem = "dst is too small for the records";
        if (problem != NULL) {
            PyErr_SetString(PyExc_ValueError, problem);
        } else {
            Py_BEGIN_ALLOW_THREADS;
            uint64_t at = nbytes;
            dst_offsets[count] = (int64_t)at;
            for (Py_ssize_t k = 0; k < n; k++) {
                int64_t i = order[k];
                uint64_t len = (uint64_t)(src_offsets[i + 1] - src_offsets[i]);
                if (k + SD_PLACE_AHEAD < n) { /* the source of a record a few on (shuffle_core.h) */
                    const int64_t *ahead = src_offsets + order[k + SD_PLACE_AHEAD];
                    sd_prefetch_place(src + ahead[0], (uint64_t)(ahead[1] - ahead[0]));
                }
                if (len >= STREAM_COPY_MIN)
                    stream_copy(dst + at, src + src_offsets[i], len);
                else
                    memcpy(dst + at, src + src_offsets[i], len);
                at += len;
                dst_offsets[count + k + 1] = (int64_t)at;
            }
            STREAM_FENCE();
            Py_END_ALLOW_THREADS;
            result = Py_BuildValue("nK", count + n, (unsigned long long)need);
        }
    }
    for (int k = 0; k < got; k++) PyBuffer_Release(&v[k]);
    return result;
}

static PyMethodDef methods[] = {
    {"masked_crc32c", masked_crc32c, METH_O, "The masked CRC32C TFRecord stores, of a buffer."},
    {"window_order", window_order, METH_VARARGS,
     "window_order(window_key, size, n, out, scratch): the shuffle window's order of n records into out"},
    {"gather", gather, METH_VARARGS,
     "gather(dst, dst_offsets, count, nbytes, src, src_offsets, order) -> (count, nbytes)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_record_reader", NULL, -1, methods};

PyMODINIT_FUNC PyInit__record_reader(void) {
    int hardware = sd_crc32c_init();
    if (PyType_Ready(&ReaderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&ReaderType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0) {
        Py_DECREF(&ReaderType);
        Py_DECREF(m);
        return NULL;
    }
    static const struct {
        const char *name;
        int value;
    } constants[] = {
        {"API", API},           {"FULL", ST_FULL},
        {"END", ST_END},        {"ROOM", ST_ROOM},        {"CORRUPT", ST_CORRUPT},
        {"BAD_HEADER", ST_BAD_HEADER}, {"TOO_LONG", ST_TOO_LONG}, {"BAD_MAGIC", ST_BAD_MAGIC},
        {"BAD_FLAG", ST_BAD_FLAG}, {"TRUNCATED", ST_TRUNCATED}, {"WRONG_SIZE", ST_WRONG_SIZE},
        {"FALLBACK", ST_FALLBACK},
    };
    for (size_t i = 0; i < sizeof(constants) / sizeof(constants[0]); i++) {
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    if (PyModule_AddIntConstant(m, "HARDWARE_CRC", hardware) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
