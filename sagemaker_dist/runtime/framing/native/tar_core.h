/* The tar walk every compiled WebDataset reader shares: the samples of a buffer of tar shards.
 *
 * Header only, C99, on record_core.h's tar checks: the tar scan (framing/_tar_scan.c, TarFramer's walk)
 * and the PyTorch batch reader (framing/_record_reader.c, which frames a FIFO's samples straight into a
 * batch) include it, so the two hand out the same samples. The walk is framing/tar.py's
 * TarFramer._walk for the usual case: ustar, GNU and v7 headers, GNU long names and pax path/size
 * records, folders and links read past, files grouped into samples by key, end-of-archive blocks.
 * Anything else it leaves to the Python walk, which also names every error: it stops with
 * SD_TAR_FALLBACK at the first entry it does not take (a checksum that does not match, a field that is
 * not octal, base-256 sizes, sparse files, a name with a newline or a non-ASCII extension, a size over
 * the limit, a repeated extension), and the caller hands the bytes to the Python walk.
 */
#ifndef SAGEMAKER_DIST_TAR_CORE_H_
#define SAGEMAKER_DIST_TAR_CORE_H_

#include "record_core.h"

#define SD_TAR_FALLBACK 1
#define SD_TAR_MAX_METADATA ((uint64_t)1 << 20) /* contract.tar_format.MAX_METADATA_BYTES */
#define SD_TAR_MAX_EXTS 32                      /* files a sample may have here; more: the Python walk */
#define SD_TAR_EXT_BYTES 1024                   /* their extensions' bytes, all told */

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* The sum of the 512 bytes of a header: 16 bytes a step (psadbw) where SSE2 is, else a plain loop. */
static inline uint32_t sd_tar_byte_sum(const unsigned char *h) {
#if defined(__SSE2__)
    __m128i acc = _mm_setzero_si128(), zero = _mm_setzero_si128();
    for (int i = 0; i < SD_TAR_BLOCK; i += 16)
        acc = _mm_add_epi64(acc, _mm_sad_epu8(_mm_loadu_si128((const __m128i *)(h + i)), zero));
    return (uint32_t)_mm_cvtsi128_si32(acc) + (uint32_t)_mm_cvtsi128_si32(_mm_unpackhi_epi64(acc, acc));
#else
    uint32_t sum = 0;
    for (int i = 0; i < SD_TAR_BLOCK; i++) sum += h[i];
    return sum;
#endif
}

/* Whether the 512 bytes at h are all zero (an end-of-archive block): a header's first 8 bytes (its name)
 * are not, so a header is told apart at its first load. */
static inline int sd_tar_is_zero(const unsigned char *h) { return sd_load_u64(h) == 0 && sd_tar_zero(h); }

/* Whether the header's stored checksum is the sum of its bytes, the checksum field read as spaces
 * (unsigned, or signed as some old writers summed them): the unsigned sum first (the usual case), the
 * signed one only where that does not match. */
static inline int sd_tar_header_ok(const unsigned char *h) {
    uint64_t stored;
    if (!sd_tar_octal(h + 148, 8, &stored)) return 0;
    uint32_t sum = 8 * ' ' + sd_tar_byte_sum(h), field = 0;
    for (int i = 148; i < 156; i++) field += h[i];
    sum -= field;
    if (stored == sum) return 1;
    uint32_t high = 0;
    for (int i = 0; i < SD_TAR_BLOCK; i++) high += h[i] >> 7;
    for (int i = 148; i < 156; i++) high -= h[i] >> 7;
    return stored + 256 * (uint64_t)high == sum;
}

typedef struct {
    const unsigned char *p; /* the name: in buf, or in `own` (a ustar prefix and name joined) */
    size_t len;
    unsigned char own[256 + 1 + 100];
} SdTarName;

/* The value of pax record `key` in the records at p (n bytes): 1 and *value, *len; 0 if absent; -1 where
 * the records are not well formed or hold a sparse file's (left to the Python walk). */
static inline int sd_tar_pax_find(const unsigned char *p, uint64_t n, const char *key, const unsigned char **value, size_t *len) {
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
} SdTarMeta;

/* Take the data of a metadata member ('L', 'K', 'x', 'g'): 0, or -1 where the Python walk must (pax
 * records not well formed, a sparse file's, a global header that sets a path or size). */
static inline int sd_tar_read_meta(SdTarMeta *m, unsigned char type, const unsigned char *data, uint64_t size) {
    if (type == 'L') {
        const unsigned char *nul = memchr(data, 0, (size_t)size);
        m->long_name = data;
        m->long_len = nul ? (size_t)(nul - data) : (size_t)size;
    } else if (type == 'x') {
        if (sd_tar_pax_find(data, size, "path", &m->pax_path, &m->pax_path_len) < 0) return -1;
        if (sd_tar_pax_find(data, size, "size", &m->pax_size, &m->pax_size_len) < 0) return -1;
    } else if (type == 'g') {
        const unsigned char *v;
        size_t vlen;
        if (sd_tar_pax_find(data, size, "path", &v, &vlen) != 0 || sd_tar_pax_find(data, size, "size", &v, &vlen) != 0) return -1;
    }
    return 0;
}

/* A regular file's name: a pax path, else a GNU long name, else the header's (a ustar prefix, a slash and
 * the name field; or the name field alone), as framing/tar.py's read_entry takes it. */
static inline void sd_tar_entry_name(SdTarName *name, const unsigned char *h, const SdTarMeta *m) {
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

static inline int sd_tar_ext_equal(const unsigned char *a, size_t alen, const unsigned char *b, size_t blen) {
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
} SdTarWalk;

/* The complete samples of buf[:end]: starts[i] and lengths[i] (room for end / 512 + 1 entries) of
 * `count` samples; `consumed`: the bytes the caller may drop; `need`: the buffer size (from consumed) the
 * next step needs, 0 if none; `cut`: where the entry cut short starts; `status`: 0 or SD_TAR_FALLBACK.
 * `at_end`: buf holds the stream's last bytes, so an open sample ends with them (TarFramer.finish). */
static inline SdTarWalk sd_tar_walk(const unsigned char *buf, uint64_t end, int64_t *starts, int64_t *lengths,
                                    uint64_t max_record, int at_end) {
    SdTarWalk r = {0, 0, 0, 0, 0};
    uint64_t pos = 0, consumed = 0, need = 0;
    int64_t open_start = -1;
    uint64_t open_end = 0;
    const unsigned char *key = NULL; /* the open sample's key (in buf, or in key_own) */
    size_t key_len = 0;
    unsigned char key_own[sizeof(((SdTarName *)0)->own)];
    unsigned char ext_store[SD_TAR_EXT_BYTES]; /* the open sample's extensions, one after another */
    size_t ext_at_store[SD_TAR_MAX_EXTS], ext_lens[SD_TAR_MAX_EXTS], stored = 0;
    int n_exts = 0;
    SdTarName name;
    while (pos < end) {
        uint64_t start = pos; /* the entry's first header (metadata headers before its own included) */
        SdTarMeta meta = {NULL, NULL, NULL, 0, 0, 0};
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
            if (sd_tar_is_zero(h)) {
                if (pos != start) goto fallback; /* metadata, then the end of the archive */
                zero = 1;
                break;
            }
            if (!sd_tar_header_ok(h) || !sd_tar_octal(h + 124, 12, &size)) goto fallback;
            unsigned char type = h[156];
            if (type == 'L' || type == 'K' || type == 'x' || type == 'g') {
                if (size > SD_TAR_MAX_METADATA) goto fallback;
                uint64_t stop = pos + SD_TAR_BLOCK + size + (SD_TAR_BLOCK - size % SD_TAR_BLOCK) % SD_TAR_BLOCK;
                if (stop > end) {
                    cut = 1;
                    need = stop;
                    break;
                }
                if (sd_tar_read_meta(&meta, type, h + SD_TAR_BLOCK, size) < 0) goto fallback;
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
            sd_tar_entry_name(&name, h, &meta);
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
                    if (sd_tar_ext_equal(ext_store + ext_at_store[i], ext_lens[i], ext, elen)) goto fallback;
            }
            if (n_exts == SD_TAR_MAX_EXTS || elen > SD_TAR_EXT_BYTES - stored) goto fallback;
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
    if (open_start >= 0 && at_end && !need) { /* the last sample ends with the stream */
        starts[r.count] = open_start;
        lengths[r.count++] = (int64_t)(open_end - (uint64_t)open_start);
        consumed = end;
    } else if (open_start >= 0) {
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
    r.status = SD_TAR_FALLBACK;
    return r;
}

#endif /* SAGEMAKER_DIST_TAR_CORE_H_ */
