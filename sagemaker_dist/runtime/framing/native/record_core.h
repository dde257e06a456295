/* The record framing core every compiled reader shares: CRC32C and the frame rules of TFRecord,
 * SageMaker RecordIO (RecordWrapperType RecordIO), text lines, and the header checks of tar (WebDataset
 * shards).
 *
 * Header only, C99 and C++17: the TFRecord scan (framing/_tfrecord_scan.c), the PyTorch batch reader
 * (framing/_record_reader.c) and the TensorFlow op (tensorflow/data/native/pipe_dataset_op.cc) include it, so the
 * three check the same CRCs and refuse the same frames. Each holds its own copy of the tables (static);
 * call sd_crc32c_init() once before the first CRC (it may be called again, from any thread).
 *
 * CRC32C: on x86-64 with SSE 4.2, the CPU's CRC32C instruction in three lanes. It takes 3 cycles and
 * can start one a cycle, so one stream of it runs at a third of its speed; three lanes of a block run
 * at once, and their CRCs are joined by shifting the running one past the next lane (a linear map,
 * applied with 4 tables made by one carry-less multiplication an entry). Where the CPU also has
 * AVX-512 and VPCLMULQDQ (Ice Lake and later, Zen 4), runs of 256 bytes or more are first folded
 * 256 bytes a step with carry-less multiplications (sd_crc32c_fold), which the CRC32C instruction
 * then reduces (SAGEMAKER_DIST_CRC32C=lanes in the environment leaves the folding out). On ARMv8 with
 * the CRC extension, its instructions in one lane; elsewhere slicing-by-8 tables.
 *
 * A length field is only the stream's claim: every check here compares it with the caller's limit
 * (at most SD_MAX_RECORD_CEILING, so a length plus a frame's few bytes never wraps 64 bits) before
 * any arithmetic on it.
 */
#ifndef SAGEMAKER_DIST_RECORD_CORE_H_
#define SAGEMAKER_DIST_RECORD_CORE_H_

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define SD_MASK_DELTA 0xa282ead8u
#define SD_CRC_POLY 0x82f63b78u /* CRC32C (Castagnoli), bit-reflected */
#define SD_MAX_RECORD_CEILING (((uint64_t)1) << 62)
#define SD_TFRECORD_HEADER 12   /* uint64 length, uint32 masked CRC32C of it */
#define SD_TFRECORD_OVERHEAD 16 /* the header and the data's masked CRC32C */
#define SD_RECORDIO_MAGIC 0xced7230au
#define SD_RECORDIO_HEADER 8 /* magic, then 29-bit length and 3-bit multipart flag */
#define SD_RECORDIO_LENGTH_BITS 29
#define SD_RECORDIO_WHOLE 0u
#define SD_RECORDIO_START 1u
#define SD_RECORDIO_MIDDLE 2u
#define SD_RECORDIO_END 3u

/* What a header check found. */
enum sd_frame_status {
    SD_FRAME_OK = 0,
    SD_FRAME_BAD_HEADER = 1, /* TFRecord: the length's CRC does not match */
    SD_FRAME_TOO_LONG = 2,   /* the length is over the caller's limit */
    SD_FRAME_BAD_MAGIC = 3,  /* RecordIO: not the magic number */
    SD_FRAME_BAD_FLAG = 4,   /* RecordIO: a multipart flag out of sequence */
};

static inline uint64_t sd_load_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v; /* the formats are little endian, as are the CPUs this builds for */
}

static inline uint32_t sd_load_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* ---- CRC32C ---- */

static uint32_t sd_crc_table[8][256];
static int sd_crc_hw;
static pthread_once_t sd_crc_once = PTHREAD_ONCE_INIT;

static uint32_t sd_crc32c_sw(uint32_t crc, const unsigned char *p, size_t n) {
    while (n >= 8) {
        uint64_t v = sd_load_u64(p) ^ crc;
        crc = sd_crc_table[7][v & 0xff] ^ sd_crc_table[6][(v >> 8) & 0xff] ^ sd_crc_table[5][(v >> 16) & 0xff] ^
              sd_crc_table[4][(v >> 24) & 0xff] ^ sd_crc_table[3][(v >> 32) & 0xff] ^
              sd_crc_table[2][(v >> 40) & 0xff] ^ sd_crc_table[1][(v >> 48) & 0xff] ^ sd_crc_table[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = sd_crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define SD_CRC_X86 1
#define SD_LANE_LONG 4096
#define SD_LANE_SHORT 256

/* t[k][v]: the register v << 8k after a lane of zero bytes, i.e. (v << 8k) * x^(8 lane). */
static uint32_t sd_shift_long[4][256], sd_shift_short[4][256];

/* a * b modulo the CRC32C polynomial, bit-reflected as the register holds it (bit 31 is x^0). */
static uint32_t sd_multiply_mod_p(uint32_t a, uint32_t b) {
    uint32_t product = 0;
    for (uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
        if (a & bit) product ^= b;
        b = (b & 1) ? (b >> 1) ^ SD_CRC_POLY : b >> 1; /* b * x */
    }
    return product;
}

__attribute__((target("sse4.2"))) static void sd_make_shift(uint32_t t[4][256], size_t lane) {
    uint64_t power = 1u << 31; /* x^0, then x^(8 lane): the register after `lane` zero bytes */
    for (size_t i = 0; i < lane; i += 8) power = _mm_crc32_u64(power, 0);
    for (int k = 0; k < 4; k++)
        for (uint32_t v = 0; v < 256; v++) t[k][v] = sd_multiply_mod_p(v << (8 * k), (uint32_t)power);
}

static inline uint32_t sd_shift(uint32_t t[4][256], uint32_t c) {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
}

__attribute__((target("sse4.2"))) static inline uint64_t sd_crc_lanes(uint64_t c, const unsigned char **pp,
                                                                        size_t *np, size_t lane,
                                                                        uint32_t t[4][256]) {
    const unsigned char *p = *pp;
    size_t n = *np;
    while (n >= 3 * lane) {
        uint64_t c1 = 0, c2 = 0;
        for (size_t i = 0; i < lane; i += 8) {
            c = _mm_crc32_u64(c, sd_load_u64(p + i));
            c1 = _mm_crc32_u64(c1, sd_load_u64(p + lane + i));
            c2 = _mm_crc32_u64(c2, sd_load_u64(p + 2 * lane + i));
        }
        uint32_t joined = sd_shift(t, (uint32_t)c) ^ (uint32_t)c1;
        c = sd_shift(t, joined) ^ (uint32_t)c2;
        p += 3 * lane;
        n -= 3 * lane;
    }
    *pp = p;
    *np = n;
    return c;
}

/* Folding (sd_crc32c_fold). A block of 16 bytes, loaded as two little-endian words (lo: its first 8
 * bytes), is the polynomial lo * x^64 + hi, its bit k the coefficient of x^(127-k); moving it d bits
 * further down the message is multiplying by x^d. A carry-less product of a word (bit i: x^(63-i)) and
 * a 32-bit constant held reflected (bit j: x^(31-j)) has bit m: x^(94-m), which read as a block is the
 * product times x^33. So lo * (x^(d+64-33) mod P) + hi * (x^(d-33) mod P) is the block moved d bits
 * down, modulo P, in 95 bits of a block: it is added (xor) to the block d bits on, and the last block's
 * CRC32C (the instruction over its 16 bytes, from 0) is the CRC of all the bytes folded into it. */
#if (defined(__clang__) && __clang_major__ >= 8 && !defined(__apple_build_version__)) || \
    (!defined(__clang__) && __GNUC__ >= 9)
#define SD_CRC_FOLD 1 /* compilers that know the vpclmulqdq target and CPU feature */
#include <immintrin.h>
#define SD_FOLD_MIN 256

static int sd_crc_fold;
static uint64_t sd_fold_256[2], sd_fold_64[2], sd_fold_blocks[8]; /* {lo, hi} constants per distance */

/* x^n mod P, held as the register holds it (bit 31 is x^0). */
static uint32_t sd_xpow_mod_p(unsigned n) {
    uint32_t v = 1u << 31;
    while (n--) v = (v & 1) ? (v >> 1) ^ SD_CRC_POLY : v >> 1;
    return v;
}

/* The constants that move a block `bits` further down the message (held as the register holds them,
 * which is the word's form above). */
static void sd_fold_constants(uint64_t k[2], unsigned bits) {
    k[0] = sd_xpow_mod_p(bits + 31);
    k[1] = sd_xpow_mod_p(bits - 33);
}

__attribute__((target("avx512f,vpclmulqdq"))) static inline __m512i sd_fold(__m512i x, __m512i k, __m512i next) {
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11),
                                     next, 0x96);
}

/* The register after the first n - n % 64 bytes at *pp (n >= 256), and *pp, *np past them. */
__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) static uint32_t sd_crc32c_fold(uint32_t crc,
                                                                                     const unsigned char **pp,
                                                                                     size_t *np) {
    const unsigned char *p = *pp;
    size_t n = *np;
    __m512i first = _mm512_inserti32x4(_mm512_setzero_si512(), _mm_cvtsi32_si128((int)crc), 0); /* the register */
    __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), first);
    __m512i x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
    p += 256;
    n -= 256;
    __m512i k = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)sd_fold_256[1], (long long)sd_fold_256[0]));
    while (n >= 256) {
        x0 = sd_fold(x0, k, _mm512_loadu_si512(p));
        x1 = sd_fold(x1, k, _mm512_loadu_si512(p + 64));
        x2 = sd_fold(x2, k, _mm512_loadu_si512(p + 128));
        x3 = sd_fold(x3, k, _mm512_loadu_si512(p + 192));
        p += 256;
        n -= 256;
    }
    k = _mm512_broadcast_i32x4(_mm_set_epi64x((long long)sd_fold_64[1], (long long)sd_fold_64[0]));
    __m512i x = sd_fold(sd_fold(sd_fold(x0, k, x1), k, x2), k, x3);
    while (n >= 64) { /* the rest, 64 bytes a step */
        x = sd_fold(x, k, _mm512_loadu_si512(p));
        p += 64;
        n -= 64;
    }
    /* its four blocks into the last: the first moved 384 bits, the second 256, the third 128 */
    __m512i blocks = _mm512_loadu_si512(sd_fold_blocks);
    __m512i moved = _mm512_xor_si512(_mm512_clmulepi64_epi128(x, blocks, 0x00),
                                     _mm512_clmulepi64_epi128(x, blocks, 0x11));
    __m128i last = _mm_xor_si128(
        _mm_xor_si128(_mm512_castsi512_si128(moved), _mm512_extracti32x4_epi32(moved, 1)),
        _mm_xor_si128(_mm512_extracti32x4_epi32(moved, 2), _mm512_extracti32x4_epi32(x, 3)));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(last));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(last, 1));
    *pp = p;
    *np = n;
    return (uint32_t)c;
}
#endif

__attribute__((target("sse4.2"))) static uint32_t sd_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) {
#ifdef SD_CRC_FOLD
    if (sd_crc_fold && n >= SD_FOLD_MIN) crc = sd_crc32c_fold(crc, &p, &n);
#endif
    uint64_t c = crc;
    c = sd_crc_lanes(c, &p, &n, SD_LANE_LONG, sd_shift_long);
    c = sd_crc_lanes(c, &p, &n, SD_LANE_SHORT, sd_shift_short);
    while (n >= 8) {
        c = _mm_crc32_u64(c, sd_load_u64(p));
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return c32;
}

static int sd_have_hw(void) { return __builtin_cpu_supports("sse4.2") != 0; }

#elif defined(__aarch64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <arm_acle.h>
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7)
#endif

__attribute__((target("+crc"))) static uint32_t sd_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) {
    while (n >= 8) {
        crc = __crc32cd(crc, sd_load_u64(p));
        p += 8;
        n -= 8;
    }
    while (n--) crc = __crc32cb(crc, *p++);
    return crc;
}

static int sd_have_hw(void) { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }

#else
static uint32_t sd_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) { return sd_crc32c_sw(crc, p, n); }
static int sd_have_hw(void) { return 0; }
#endif

static void sd_crc32c_make(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ SD_CRC_POLY : c >> 1;
        sd_crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            sd_crc_table[t][i] = (sd_crc_table[t - 1][i] >> 8) ^ sd_crc_table[0][sd_crc_table[t - 1][i] & 0xff];
    sd_crc_hw = sd_have_hw();
#ifdef SD_CRC_X86
    if (sd_crc_hw) { /* about 20 us each */
        sd_make_shift(sd_shift_long, SD_LANE_LONG);
        sd_make_shift(sd_shift_short, SD_LANE_SHORT);
#ifdef SD_CRC_FOLD
        sd_fold_constants(sd_fold_256, 2048);
        sd_fold_constants(sd_fold_64, 512);
        for (int block = 0; block < 3; block++) sd_fold_constants(sd_fold_blocks + 2 * block, 128 * (3 - block));
        const char *path = getenv("SAGEMAKER_DIST_CRC32C"); /* "lanes": no folding (the other path's tests) */
        sd_crc_fold = !(path && strcmp(path, "lanes") == 0) && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("vpclmulqdq");
#endif
    }
#endif
}

/* Makes the tables once; returns 0 for tables, 1 for the CPU's CRC32C instructions, 2 for those after
 * carry-less folding. */
static inline int sd_crc32c_init(void) {
    pthread_once(&sd_crc_once, sd_crc32c_make);
#ifdef SD_CRC_FOLD
    if (sd_crc_fold) return 2;
#endif
    return sd_crc_hw;
}

/* The CRC32C of n bytes (sd_crc32c_init() first). */
static inline uint32_t sd_crc32c(const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    return ~(sd_crc_hw ? sd_crc32c_hw(0xffffffffu, p, n) : sd_crc32c_sw(0xffffffffu, p, n));
}

/* The masked CRC32C TFRecord stores. */
static inline uint32_t sd_masked_crc32c(const void *data, size_t n) {
    uint32_t crc = sd_crc32c(data, n);
    return ((crc >> 15) | (crc << 17)) + SD_MASK_DELTA;
}

/* ---- TFRecord: uint64 length, masked CRC32C of it, data, masked CRC32C of the data ---- */

/* The header at h (12 bytes): its length in *n; BAD_HEADER before TOO_LONG (a length whose CRC is
 * wrong is no length at all), TOO_LONG when over max_record. `cache` holds the last length and its CRC
 * (bit 32 set once it holds one): pass a pair initialised to {0, 0}, or NULL. */
static inline int sd_tfrecord_header(const unsigned char *h, uint64_t max_record, uint64_t *n,
                                     uint64_t cache[2]) {
    uint64_t length = sd_load_u64(h);
    uint32_t expected;
    if (cache != NULL && (cache[1] >> 32) && cache[0] == length) {
        expected = (uint32_t)cache[1];
    } else {
        expected = sd_masked_crc32c(h, 8);
        if (cache != NULL) {
            cache[0] = length;
            cache[1] = expected | ((uint64_t)1 << 32);
        }
    }
    *n = length;
    if (sd_load_u32(h + 8) != expected) return SD_FRAME_BAD_HEADER;
    if (length > max_record) return SD_FRAME_TOO_LONG;
    return SD_FRAME_OK;
}

/* Whether n bytes of data match the masked CRC stored after them (at data + n). */
static inline int sd_tfrecord_data_ok(const unsigned char *data, uint64_t n) {
    return sd_load_u32(data + n) == sd_masked_crc32c(data, (size_t)n);
}

/* ---- RecordIO: magic, 29-bit length + 3-bit multipart flag, payload, padding to 4 bytes ---- */

/* The part header at h (8 bytes): *flag and *n; `first` says whether it starts a record. */
static inline int sd_recordio_header(const unsigned char *h, int first, uint32_t *magic, uint32_t *flag,
                                     uint32_t *n) {
    uint32_t word = sd_load_u32(h + 4);
    *magic = sd_load_u32(h);
    *flag = word >> SD_RECORDIO_LENGTH_BITS;
    *n = word & ((1u << SD_RECORDIO_LENGTH_BITS) - 1);
    if (*magic != SD_RECORDIO_MAGIC) return SD_FRAME_BAD_MAGIC;
    if (*flag > SD_RECORDIO_END || (*flag <= SD_RECORDIO_START) != (first != 0)) return SD_FRAME_BAD_FLAG;
    return SD_FRAME_OK;
}

/* A part's frame: its header, payload and padding to a multiple of 4. */
static inline uint64_t sd_recordio_frame(uint32_t n) { return SD_RECORDIO_HEADER + (uint64_t)n + ((4 - n % 4) % 4); }

static inline int sd_recordio_last(uint32_t flag) { return flag == SD_RECORDIO_WHOLE || flag == SD_RECORDIO_END; }

/* ---- text lines: one record per b"\n"; a trailing b"\r" is not part of the line ---- */

/* The length of the line of `len` bytes at p (its newline excluded), less a trailing '\r'. */
static inline size_t sd_line_length(const unsigned char *p, size_t len) {
    return len > 0 && p[len - 1] == '\r' ? len - 1 : len;
}

/* ---- tar (WebDataset shards): 512-byte headers, octal numbers, a checksum, names as key + extension ----
 * contract/tar_format.py and framing/tar.py hold the rules; these are the checks the compiled tar scan
 * (framing/_tar_scan.c) makes on its way through the headers. */

#define SD_TAR_BLOCK 512

/* Whether the 512 bytes at h are all zero (an end-of-archive block). */
static inline int sd_tar_zero(const unsigned char *h) {
    uint64_t any = 0;
    for (int i = 0; i < SD_TAR_BLOCK; i += 8) any |= sd_load_u64(h + i);
    return any == 0;
}

/* A numeric header field of `len` bytes as framing/tar.py reads it: the text up to its first NUL, spaces
 * around it dropped, octal digits only (empty: 0). 1 and *value, or 0 where it is anything else (GNU's
 * base-256 included: the caller leaves such a header to the Python walk). */
static inline int sd_tar_octal(const unsigned char *p, int len, uint64_t *value) {
    int end = 0;
    while (end < len && p[end] != 0) end++;
    int start = 0;
    while (start < end && p[start] == ' ') start++;
    while (end > start && p[end - 1] == ' ') end--;
    uint64_t v = 0;
    for (int i = start; i < end; i++) {
        if (p[i] < '0' || p[i] > '7' || v >> 60) return 0;
        v = v * 8 + (uint64_t)(p[i] - '0');
    }
    *value = v;
    return 1;
}

/* The name of `len` bytes split as WebDataset splits it (contract.tar_format.key_and_extension): 1 with
 * the key's length in *key_len and the extension's start in *ext_at; 0 where it belongs to no sample (no
 * dot in its last component, or WebDataset's metadata "__x__" as its first component); -1 where the
 * caller must ask the Python rule (a newline, a non-ASCII extension). */
static inline int sd_tar_key(const unsigned char *name, size_t len, size_t *key_len, size_t *ext_at) {
    size_t last = len, first_slash = len;
    for (size_t i = 0; i < len; i++) {
        if (name[i] == '\n') return -1;
        if (name[i] == '/') {
            last = i;
            if (first_slash == len) first_slash = i;
        }
    }
    if (first_slash >= 4 && name[0] == '_' && name[1] == '_' && name[first_slash - 1] == '_' &&
        name[first_slash - 2] == '_')
        return 0; /* WebDataset's metadata */
    size_t base = last == len ? 0 : last + 1, dot = len;
    for (size_t i = base; i < len; i++)
        if (name[i] == '.') {
            dot = i;
            break;
        }
    if (dot == len) return 0;
    if (dot == base) { /* ".x": the regex splits before the slash if the component before has no dot */
        if (last == len) return 0;
        size_t prev = last;
        while (prev > 0 && name[prev - 1] != '/') prev--;
        for (size_t i = prev; i < last; i++)
            if (name[i] == '.') return 0;
        dot = last + 1; /* key ends with the slash: "a/" of "a/.x" */
    }
    for (size_t i = dot + 1; i < len; i++)
        if (name[i] >= 128) return -1;
    *key_len = dot;
    *ext_at = dot + 1;
    return 1;
}

#endif /* SAGEMAKER_DIST_RECORD_CORE_H_ */
