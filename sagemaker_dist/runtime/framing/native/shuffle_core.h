/* The readers' shuffle window: the order in which a window of a stream's records comes out.
 *
 * Header only, C99 and C++17, like record_core.h: the PyTorch batch reader (framing/_record_reader.c) and
 * the TensorFlow op (tensorflow/data/native/pipe_dataset_op.cc) include it, and framing/shuffle.py is the same
 * arithmetic in Python (the fallback, and the reference its tests compare with), so every reader puts
 * one stream's records in the same order.
 *
 * A stream's records are cut into windows, in the order they come. A window's record count is fixed when
 * it starts (sd_window_records): the byte bound's worth of records of the last window's mean size (the
 * first window: of its first record's), at most `size`. It closes after that many records, or where its
 * record bytes reach the cap first (sd_window_cap: the byte bound and an eighth), or at the stream's end.
 * Each window's records come out in an order that depends only on the window's key:
 *
 *   stream key  (seed, rank, channel), made in Python (framing/shuffle.py: stream_key)
 *   epoch key   sd_epoch_key(stream key, epoch)
 *   window key  sd_window_key(epoch key, the window's index in the epoch, from 0)
 *   order       Q, a Fisher-Yates permutation of 0 .. size-1 drawn from the window key (draw i is
 *               sd_mix64(window key + GOLDEN * i), taken below i + 1 by a multiply-high); the window's
 *               n records come out as the entries of Q below n, in Q's order.
 *
 * A window of fewer than `size` records (the byte bound, the stream's end) takes the same Q: its records
 * come out in the order the full window would give them. So a reader that knows n before the records
 * come (records of one size) can put each record straight where it goes, and one that learns n only
 * at the stream's end keeps those places (sorted) for the records that came.
 */
#ifndef SAGEMAKER_DIST_SHUFFLE_CORE_H_
#define SAGEMAKER_DIST_SHUFFLE_CORE_H_

#include <stddef.h>
#include <stdint.h>

#define SD_GOLDEN 0x9E3779B97F4A7C15ull

/* splitmix64's finaliser: a bijection of 64 bits whose every output bit depends on every input bit */
static inline uint64_t sd_mix64(uint64_t z) {
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t sd_epoch_key(uint64_t stream, uint64_t epoch) {
    return sd_mix64(stream + SD_GOLDEN * (epoch + 1));
}

static inline uint64_t sd_window_key(uint64_t epoch_key, uint64_t window) {
    return sd_mix64(epoch_key ^ sd_mix64(SD_GOLDEN * (window + 1)));
}

/* The record count of a window after one of `count` records and `nbytes` bytes (the first window: its
 * first record, count 1): `bytes` of records of that mean size (rounded down, at least 1), at most `size`. */
static inline uint64_t sd_window_records(uint64_t size, uint64_t bytes, uint64_t count, uint64_t nbytes) {
    uint64_t mean = nbytes / (count ? count : 1);
    if (mean == 0) mean = 1;
    uint64_t n = bytes / mean + (bytes % mean != 0);
    return n < size ? n : size;
}

/* The record bytes that close a window before its count. */
static inline uint64_t sd_window_cap(uint64_t bytes) { return bytes + bytes / 8; }

/* floor(r * n / 2**64): a draw below n (n < 2**32 here) */
static inline uint64_t sd_below(uint64_t r, uint64_t n) {
    uint64_t hi = (r >> 32) * n, lo = (r & 0xFFFFFFFFull) * n;
    return (hi + (lo >> 32)) >> 32;
}

/* Q for a window of `size` records into `q` (size entries). */
static inline void sd_window_permutation(uint64_t window_key, uint64_t size, int64_t *q) {
    for (uint64_t i = 0; i < size; i++) q[i] = (int64_t)i;
    for (uint64_t i = size; i-- > 1;) {
        uint64_t j = sd_below(sd_mix64(window_key + SD_GOLDEN * i), i + 1);
        int64_t t = q[i];
        q[i] = q[j];
        q[j] = t;
    }
}

/* The order of a window's n records (n <= size): into `out`, the entries of Q below n; `q` is scratch of
 * `size` entries (it may not be `out`). Returns n. */
static inline uint64_t sd_window_order(uint64_t window_key, uint64_t size, uint64_t n, int64_t *out, int64_t *q) {
    sd_window_permutation(window_key, size, q);
    uint64_t k = 0;
    for (uint64_t i = 0; i < size && k < n; i++)
        if ((uint64_t)q[i] < n) out[k++] = q[i];
    return k;
}

/* A window's records go to (or come from) places in random order, each a few cache lines, tens of MiB
 * apart: out of the caches' reach, and out of the hardware prefetcher's, which follows runs. A reader
 * fetches the place of the record SD_PLACE_AHEAD on while it frames and copies this one, so the misses
 * overlap that work instead of stalling the copy (at 1 KB, the CPU time of a second epoch unshuffled over
 * shuffled: records of one size 0.90 without, 1.09 with; PipeModeDataset 0.85 and 0.98). Places over
 * SD_PLACE_PREFETCH_MAX bytes are left to the hardware prefetcher, which streams them once their first
 * lines are touched. */
#define SD_PLACE_AHEAD 2
#define SD_PLACE_PREFETCH_MAX 4096

static inline void sd_prefetch_place(const void *place, uint64_t nbytes) {
    if (nbytes > SD_PLACE_PREFETCH_MAX) return;
    const unsigned char *p = (const unsigned char *)place;
    for (uint64_t at = 0; at < nbytes; at += 64) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
        __asm__ volatile("prefetcht0 %0" : : "m"(p[at])); /* GCC drops a loop of __builtin_prefetch alone */
#elif defined(__GNUC__)
        __asm__ volatile("" : : "r"(p + at)); /* keeps the loop, as above */
        __builtin_prefetch(p + at, 1, 3);
#endif
    }
}

/* A stream's head: the digest of its first SD_HEAD_RECORDS records (fewer where it has fewer), folded in
 * stream order from each record's CRC32C and length. A resumed job compares the head of the FIFO it
 * replays with the stopped attempt's: equal heads say the FIFO carries the same records again. */
#define SD_HEAD_RECORDS 16

static inline uint64_t sd_head_fold(uint64_t head, uint32_t crc, uint64_t length) {
    return sd_mix64(head ^ (((uint64_t)crc << 32) | (length & 0xFFFFFFFFull)));
}

#endif /* SAGEMAKER_DIST_SHUFFLE_CORE_H_ */
