/*
 * The data path's inner loops, run without the GIL.
 *
 * The event loop holds the GIL most of the time under load, so every step a
 * worker thread takes with the GIL, and every GIL round trip between numpy
 * calls, is paid twice: once in CPU, once waiting. These are single passes with
 * the GIL released (above a size, see RELEASE_BYTES).
 *
 * whiten: IEEE 1619 XTS is E(P ^ T) ^ T with T = E_k2(iv) * x^j for block j of a
 * data unit. The cipher calls are OpenSSL ECB over the whole request (pyca); what
 * is left is this XOR with the tweak sequence, recomputed block by block. In
 * numpy it took about a dozen passes over a tweak array.
 *
 * xts: the whole of AES-XTS for a request in one call, with OpenSSL's ECB from C,
 * L1-sized chunk by chunk: each chunk's tweaks are computed once into a small
 * buffer, XORed in, encrypted in place, XORed again. Through pyca it was five
 * calls (tweak ECB, whiten, two data ECB, whiten), each a GIL round trip, over
 * 1 MiB buffers that left the cache between passes: 530 µs per MiB against 300.
 * On CPUs with AES instructions, AES-128/256-XTS runs on them instead (the paths below).
 * XtsKey: a key whose AES schedules are expanded once; xts_plain64 takes it in place of the raw
 * key, so a 4 KiB request does not expand and cleanse two schedules each time.
 *
 * cbc_encrypt: AES-CBC encryption of a request, data units in parallel lanes. OpenSSL encrypts
 * one CBC chain at the latency of its rounds, about 1 GB/s here, and the numpy column-by-column
 * path reached 1.5-2 GB/s; a unit's chain is serial, units are not.
 * cbc_decrypt: the same for decryption, one pass instead of ECB then numpy XORs.
 * cbc_essiv: either of them with dm-crypt's essiv IVs made in C chunk by chunk, one call per
 * request instead of an IV pass through OpenSSL and Python per 2 MiB chunk. EssivKey: its key's
 * and salt's schedules expanded once, as XtsKey's.
 *
 * pwritev_chunks, preadv_into: a request's segments written in pieces of a given size (or
 * read) under one release of the GIL, neighbours in memory merged into one iovec entry
 * (crypt's outputs are slices of one buffer), instead of Python building and advancing
 * iovec lists, and one GIL round trip per piece, around each os.pwritev/os.preadv.
 *
 * Below RELEASE_BYTES the work keeps the GIL. Releasing it costs more than it
 * frees when the work takes a few microseconds: the event loop takes the GIL at
 * once, and the worker waits for it to come back (up to the 5 ms switch
 * interval when the loop is busy). These calls are pure computation, bounded by
 * their size; system calls, which can block, always release it (os.pwritev).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <errno.h>
#include <stdint.h>
#include <limits.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define RELEASE_BYTES (64 * 1024)

/* busy: NULL, or a key object's count of the calls running on its schedules without the GIL,
 * changed with the GIL held, which the key's wipe() waits to see drop to 0. */
#define RUN_RELEASING_ABOVE(bytes, busy, statement)                                            \
    do {                                                                                       \
        int *busy_ = (busy);                                                                   \
        if ((bytes) >= RELEASE_BYTES) {                                                        \
            if (busy_ != NULL)                                                                 \
                ++*busy_;                                                                      \
            Py_BEGIN_ALLOW_THREADS statement;                                                  \
            Py_END_ALLOW_THREADS                                                               \
            if (busy_ != NULL)                                                                 \
                --*busy_;                                                                      \
        } else {                                                                               \
            statement;                                                                         \
        }                                                                                      \
    } while (0)

/* Returns once no call runs on a key's schedules (*busy is 0), the GIL released meanwhile so
 * that they can take it back to end. wipe() waits rather than raising: a wipe must not fail
 * (callers wipe several keys in a row, or while unwinding), and a call's wait is bounded by
 * the computation of one request. */
static void wait_until_idle(const int *busy)
{
    while (*busy > 0) {
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000}, NULL);
        Py_END_ALLOW_THREADS
    }
}

static inline uint64_t load_le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if PY_BIG_ENDIAN
    v = __builtin_bswap64(v);
#endif
    return v;
}

static inline void store_le64(uint8_t *p, uint64_t v)
{
#if PY_BIG_ENDIAN
    v = __builtin_bswap64(v);
#endif
    memcpy(p, &v, 8);
}

/* The next block's tweak: multiply by x in GF(2^128), IEEE 1619's little-endian order. */
static inline void mul_x(uint64_t *lo, uint64_t *hi)
{
    uint64_t carry = *hi >> 63;
    *hi = *hi << 1 | *lo >> 63;
    *lo = *lo << 1 ^ (0x87 & (0 - carry));
}

static void whiten(uint8_t *dst, const uint8_t *src, const uint8_t *first, Py_ssize_t units,
                   Py_ssize_t blocks)
{
    for (Py_ssize_t u = 0; u < units; u++) {
        uint64_t lo = load_le64(first + 16 * u), hi = load_le64(first + 16 * u + 8);
        for (Py_ssize_t j = 0; j < blocks; j++) {
            store_le64(dst, load_le64(src) ^ lo);
            store_le64(dst + 8, load_le64(src + 8) ^ hi);
            src += 16;
            dst += 16;
            mul_x(&lo, &hi);
        }
    }
}

PyDoc_STRVAR(whiten_doc,
             "whiten(dst, src, first_tweaks, unit_bytes)\n--\n\n"
             "dst[u][j] = src[u][j] ^ first_tweaks[u] * x^j, per 16-byte block j of data unit u\n"
             "(GF(2^128), IEEE 1619 order). dst may be src.");

static PyObject *native_whiten(PyObject *module, PyObject *args)
{
    Py_buffer dst, src, first;
    Py_ssize_t unit_bytes;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "w*y*y*n:whiten", &dst, &src, &first, &unit_bytes))
        return NULL;
    if (unit_bytes <= 0 || unit_bytes % 16) {
        PyErr_SetString(PyExc_ValueError, "unit_bytes must be a positive multiple of 16");
    } else if (dst.len != src.len || src.len % unit_bytes) {
        PyErr_SetString(PyExc_ValueError, "dst and src must be the same whole number of units");
    } else if (first.len < 16 * (src.len / unit_bytes)) {
        PyErr_SetString(PyExc_ValueError, "first_tweaks needs 16 bytes per data unit");
    } else {
        RUN_RELEASING_ABOVE(src.len, NULL,
                            whiten(dst.buf, src.buf, first.buf, src.len / unit_bytes,
                                   unit_bytes / 16));
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    PyBuffer_Release(&first);
    return result;
}

/* Tweaks of a chunk: block j of unit u gets first[u] * x^j. */
static void fill_tweaks(uint8_t *tweaks, const uint8_t *first, Py_ssize_t units,
                        Py_ssize_t blocks)
{
    for (Py_ssize_t u = 0; u < units; u++) {
        uint64_t lo = load_le64(first + 16 * u), hi = load_le64(first + 16 * u + 8);
        for (Py_ssize_t j = 0; j < blocks; j++) {
            store_le64(tweaks, lo);
            store_le64(tweaks + 8, hi);
            tweaks += 16;
            mul_x(&lo, &hi);
        }
    }
}

static void xor_into(uint8_t *dst, const uint8_t *a, const uint8_t *b, Py_ssize_t len)
{
    for (Py_ssize_t i = 0; i < len; i += 8) {
        uint64_t x, y;
        memcpy(&x, a + i, 8);
        memcpy(&y, b + i, 8);
        x ^= y;
        memcpy(dst + i, &x, 8);
    }
}

#define XTS_CHUNK (8 * 1024)

typedef struct {
    EVP_CIPHER_CTX *data, *tweak;
    uint8_t *tweaks, *first;
    Py_ssize_t chunk, first_bytes;
} XtsJob;

/* 0 on success, -1 if OpenSSL failed. dst may be src. */
static int xts_run(XtsJob *job, uint8_t *dst, const uint8_t *src, const uint8_t *ivs,
                   Py_ssize_t len, Py_ssize_t unit_bytes)
{
    int written;
    for (Py_ssize_t offset = 0; offset < len; offset += job->chunk) {
        Py_ssize_t size = len - offset < job->chunk ? len - offset : job->chunk;
        Py_ssize_t units = size / unit_bytes;
        if (!EVP_EncryptUpdate(job->tweak, job->first, &written, ivs + 16 * (offset / unit_bytes),
                               (int)(16 * units)))
            return -1;
        fill_tweaks(job->tweaks, job->first, units, unit_bytes / 16);
        xor_into(dst + offset, src + offset, job->tweaks, size);
        if (!EVP_CipherUpdate(job->data, dst + offset, &written, dst + offset, (int)size))
            return -1;
        xor_into(dst + offset, dst + offset, job->tweaks, size);
    }
    return 0;
}

/* The ways the AES rounds can run, slowest first (see detect_paths). */
typedef enum { PATH_OPENSSL, PATH_AESNI, PATH_AVX2, PATH_AVX512, PATH_COUNT } Path;

static const char *const path_names[PATH_COUNT] = {"openssl", "aesni", "avx2", "avx512"};
static const char *const path_needs[PATH_COUNT] = {
    "", "aes and pclmulqdq",
    "aes, pclmulqdq, avx2, vaes and vpclmulqdq, with ymm state enabled by the OS (XCR0)",
    "aes, pclmulqdq, avx512f, avx512bw, vaes and vpclmulqdq, with zmm state enabled by the OS "
    "(XCR0)"};

/* Bit p set: this CPU can run path p. current_path is the one the calls take (set_path). */
static unsigned runnable_paths;
static Path current_path;

#if defined(__x86_64__) && defined(__GNUC__)
/*
 * Paths: where the CPU has them, the AES rounds run on its own instructions instead of
 * OpenSSL's ECB from C. The key schedule is FIPS-197's, computed with AES-NI. One .so runs on
 * every x86-64 CPU: each kernel is compiled for its instruction set (target attributes) and
 * chosen at run time from CPUID and XCR0 (the OS must save the registers it uses).
 *
 * - avx512: VAES on zmm, four blocks per instruction (AVX-512F/BW, VAES and VPCLMULQDQ: Intel
 *   Ice Lake on, AMD Zen 4 on);
 * - avx2: VAES on ymm, two blocks per instruction (AVX2, VAES and VPCLMULQDQ without AVX-512:
 *   AMD Zen 3);
 * - aesni: AES-NI on xmm, one block per instruction, eight in flight (AES-NI and PCLMULQDQ:
 *   every x86-64 CPU with AES instructions);
 * - openssl: OpenSSL's ECB from C for XTS; AES-CBC falls back to the Python bulk path.
 *
 * OpenSSL 3.0 (the system library here) has no VAES path for XTS, and its per-call overhead
 * dominates 512-byte data units: 238 µs per MiB through its ECB, 325 through one EVP XTS call
 * per unit, 100 on the avx512 path.
 */
#define X86_PATHS 1
#include <cpuid.h>
#include <immintrin.h>

#define AVX512_TARGET __attribute__((target("aes,pclmul,avx2,avx512f,avx512bw,vaes,vpclmulqdq")))
#define AVX2_TARGET __attribute__((target("aes,pclmul,avx2,vaes,vpclmulqdq")))
#define AESNI_TARGET __attribute__((target("aes,pclmul")))

typedef struct {
    __m128i enc[15], dec[15];
    int rounds;
} AesSchedule;

/* FIPS-197's SubWord, from the S-box inside aeskeygenassist (its result's word 0 is SubWord of
 * the source's word 1). */
AESNI_TARGET static inline uint32_t sub_word(uint32_t w)
{
    return (uint32_t)_mm_cvtsi128_si32(_mm_aeskeygenassist_si128(_mm_set_epi32(0, 0, (int)w, 0), 0));
}

/* FIPS-197 key expansion (section 5.2) for 16-, 24- or 32-byte keys, word by word (words are
 * little-endian, so RotWord is a right rotation by 8), plus the equivalent inverse cipher's
 * schedule. */
AESNI_TARGET static void aes_schedule(AesSchedule *s, const uint8_t *key, int key_bytes)
{
    uint32_t w[60];
    int nk = key_bytes / 4, total = 4 * (nk + 7);
    uint32_t rcon = 1;
    memcpy(w, key, (size_t)key_bytes);
    for (int i = nk; i < total; i++) {
        uint32_t t = w[i - 1];
        if (i % nk == 0) {
            t = sub_word(t);
            t = (t >> 8 | t << 24) ^ rcon;
            rcon = rcon << 1 ^ (0x11b & (0 - (rcon >> 7)));
        } else if (nk > 6 && i % nk == 4) {
            t = sub_word(t);
        }
        w[i] = w[i - nk] ^ t;
    }
    s->rounds = nk + 6;
    memcpy(s->enc, w, (size_t)total * 4);
    OPENSSL_cleanse(w, sizeof w);
    s->dec[0] = s->enc[s->rounds];
    for (int i = 1; i < s->rounds; i++)
        s->dec[i] = _mm_aesimc_si128(s->enc[s->rounds - i]);
    s->dec[s->rounds] = s->enc[0];
}

/* The middle rounds 1..rounds-1 over n registers x[0..n) with round keys keys[], round by round
 * so the n blocks are in flight together. The round count of AES-128 or AES-256 is made a
 * constant: the compiler unrolls the rounds and keeps the round keys in registers (or as memory
 * operands) instead of a loop that reloads each key into a register it has to free first. */
#define MIDDLE_ROUNDS_OF(op, keys, rounds, x, n)                                               \
    do {                                                                                       \
        for (int r_ = 1; r_ < (rounds); r_++)                                                  \
            for (int i_ = 0; i_ < (n); i_++)                                                   \
                x[i_] = op(x[i_], keys[r_]);                                                   \
    } while (0)

#define MIDDLE_ROUNDS(op, keys, rounds, x, n)                                                  \
    do {                                                                                       \
        if ((rounds) == 14)                                                                    \
            MIDDLE_ROUNDS_OF(op, keys, 14, x, n);                                              \
        else if ((rounds) == 10)                                                               \
            MIDDLE_ROUNDS_OF(op, keys, 10, x, n);                                              \
        else                                                                                   \
            MIDDLE_ROUNDS_OF(op, keys, rounds, x, n);                                          \
    } while (0)

/* All the rounds over n registers x[0..n) with round keys keys[0..rounds]. */
#define ROUNDS(op, opl, xor, keys, rounds, x, n)                                               \
    do {                                                                                       \
        for (int i_ = 0; i_ < (n); i_++)                                                       \
            x[i_] = xor(x[i_], keys[0]);                                                       \
        MIDDLE_ROUNDS(op, keys, rounds, x, n);                                                 \
        for (int i_ = 0; i_ < (n); i_++)                                                       \
            x[i_] = opl(x[i_], keys[rounds]);                                                  \
    } while (0)

AESNI_TARGET static inline __m128i aes_block(const __m128i *keys, int rounds, __m128i x, int encrypt)
{
    x = _mm_xor_si128(x, keys[0]);
    for (int r = 1; r < rounds; r++)
        x = encrypt ? _mm_aesenc_si128(x, keys[r]) : _mm_aesdec_si128(x, keys[r]);
    return encrypt ? _mm_aesenclast_si128(x, keys[rounds]) : _mm_aesdeclast_si128(x, keys[rounds]);
}

/* t * x in GF(2^128), IEEE 1619 order, in a register: each 64-bit half shifted left, the bit
 * out of the low half carried into the high half, the bit out of the top reduced by 0x87. */
AESNI_TARGET static inline __m128i mul_x_block(__m128i t)
{
    __m128i tops = _mm_srai_epi32(_mm_shuffle_epi32(t, 0x13), 31);
    return _mm_xor_si128(_mm_add_epi64(t, t), _mm_and_si128(tops, _mm_set_epi32(0, 1, 0, 0x87)));
}

#define GROUP 8 /* units whose first tweaks are encrypted together; 16 and 32 ran slower */

/* The blocks of a unit past its last whole step, one at a time from tweak t. Inlined: a call
 * in a kernel's unit loop would make it keep its vector registers on the stack. */
AESNI_TARGET static inline __attribute__((always_inline)) void xts_tail(const __m128i *keys, int rounds, uint8_t *out,
                                  const uint8_t *in, size_t from, size_t blocks, __m128i t,
                                  int encrypt)
{
    for (size_t j = from; j < blocks; j++) {
        __m128i x = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(in + 16 * j)), t);
        x = aes_block(keys, rounds, x, encrypt);
        _mm_storeu_si128((__m128i *)(out + 16 * j), _mm_xor_si128(x, t));
        t = mul_x_block(t);
    }
}

/*
 * The kernels are written once over a vector width W: 128 (xmm, the aesni path: one block a
 * register), 256 (ymm, avx2: two) or 512 (zmm, avx512: four). VEC_W and LANES_W name a width's
 * type and blocks per register, the macros after them its instructions; XTS_UNIT (a unit of
 * the ymm and zmm XTS kernels), CBC_ENCRYPT_KERNEL and CBC_DECRYPT_KERNEL generate a path's code
 * from them, compiled for its target. What differs in substance between widths (a unit's
 * starting tweaks, gathering a register from separate units, how far ahead the XTS kernels make
 * their tweaks) is a function per width.
 *
 * HIGH_W is a register's last block; BEFORE_W(c, previous) the blocks before each of c's
 * within a unit: c's own moved one place up, previous's last block first.
 */
#define VEC_128 __m128i
#define LANES_128 1
#define LOADU_128(p) _mm_loadu_si128((const __m128i *)(p))
#define STOREU_128(p, v) _mm_storeu_si128((__m128i *)(p), v)
#define XOR_128 _mm_xor_si128
#define ENC_128 _mm_aesenc_si128
#define ENCLAST_128 _mm_aesenclast_si128
#define DEC_128 _mm_aesdec_si128
#define DECLAST_128 _mm_aesdeclast_si128
#define BROADCAST_128(block) (block)
#define LOW_128(v) (v)
#define HIGH_128(v) (v)
#define BEFORE_128(c, previous) (previous)

#define VEC_256 __m256i
#define LANES_256 2
#define LOADU_256(p) _mm256_loadu_si256((const __m256i *)(p))
#define STOREU_256(p, v) _mm256_storeu_si256((__m256i *)(p), v)
#define XOR_256 _mm256_xor_si256
#define ENC_256 _mm256_aesenc_epi128
#define ENCLAST_256 _mm256_aesenclast_epi128
#define DEC_256 _mm256_aesdec_epi128
#define DECLAST_256 _mm256_aesdeclast_epi128
#define BROADCAST_256 _mm256_broadcastsi128_si256
#define LOW_256 _mm256_castsi256_si128
#define HIGH_256(v) _mm256_extracti128_si256(v, 1)
#define BEFORE_256(c, previous) _mm256_permute2x128_si256(previous, c, 0x21)

#define VEC_512 __m512i
#define LANES_512 4
#define LOADU_512(p) _mm512_loadu_si512(p)
#define STOREU_512(p, v) _mm512_storeu_si512(p, v)
#define XOR_512 _mm512_xor_si512
#define ENC_512 _mm512_aesenc_epi128
#define ENCLAST_512 _mm512_aesenclast_epi128
#define DEC_512 _mm512_aesdec_epi128
#define DECLAST_512 _mm512_aesdeclast_epi128
#define BROADCAST_512 _mm512_broadcast_i32x4
#define LOW_512 _mm512_castsi512_si128
#define HIGH_512(v) _mm512_extracti32x4_epi32(v, 3)
#define BEFORE_512(c, previous) _mm512_alignr_epi64(c, previous, 6)

/* Lane i of t times x^(8 * bytes) (bytes < 8): the tweak's bytes moved up, those shifted out
 * of the top reduced by carry-less multiplication with 0x87 (x^128 = x^7 + x^2 + x + 1). Four
 * instructions, and the registers of a step advance independently. */
#define MUL_X_BYTES_256(t, bytes)                                                              \
    _mm256_xor_si256(_mm256_slli_si256(t, bytes),                                              \
                     _mm256_clmulepi64_epi128(_mm256_srli_si256(t, 16 - (bytes)),             \
                                              _mm256_set1_epi64x(0x87), 0x00))
#define MUL_X_BYTES_512(t, bytes)                                                              \
    _mm512_xor_si512(_mm512_bslli_epi128(t, bytes),                                            \
                     _mm512_clmulepi64_epi128(_mm512_bsrli_epi128(t, 16 - (bytes)),           \
                                              _mm512_set1_epi64(0x87), 0x00))

/* Lane i of t times x^bits (bits < 8): each 64-bit half shifted left, the bits out of the low
 * half carried into the high half, those out of the top reduced as in MUL_X_BYTES_256. */
#define MUL_X_BITS_256(t, bits)                                                                \
    _mm256_xor_si256(_mm256_xor_si256(_mm256_slli_epi64(t, bits),                              \
                                      _mm256_slli_si256(_mm256_srli_epi64(t, 64 - (bits)), 8)), \
                     _mm256_clmulepi64_epi128(_mm256_srli_si256(_mm256_srli_epi64(t, 64 - (bits)), 8), \
                                              _mm256_set1_epi64x(0x87), 0x00))

/* Registers in flight per step of a unit in the XTS kernels; on ymm and zmm a step is a
 * multiple of 8 blocks (each register's tweaks advance by whole bytes). Four zmm, not eight:
 * eight, with their tweaks and the 15 round keys, spill out of the 32 registers. */
#define XTS_REGS_128 8
#define XTS_REGS_256 8
#define XTS_REGS_512 4

/* The starting tweaks of a unit on each width: register i, lane l holds first * x^(LANES * i
 * + l). */
AVX2_TARGET static inline void xts_starts_256(__m128i first, __m256i *t)
{
    t[0] = _mm256_set_m128i(mul_x_block(first), first);
    t[1] = MUL_X_BITS_256(t[0], 2);
    t[2] = MUL_X_BITS_256(t[1], 2);
    t[3] = MUL_X_BITS_256(t[2], 2);
    for (int i = 4; i < XTS_REGS_256; i++)
        t[i] = MUL_X_BYTES_256(t[i - 4], 1);
}

/* Lane l of b times c's lane l, a power x^k (k < 58) in the lane's low half: both halves of
 * the lane multiplied carry-less, the high half's product moved up a half and the bits it has
 * past the top reduced by 0x87. Only carry-less multiplications and byte shifts: zmm bit
 * shifts issue on the one port that also runs the AES rounds. */
AVX512_TARGET static inline __m512i mul_x_clmul(__m512i b, __m512i c)
{
    __m512i low = _mm512_clmulepi64_epi128(b, c, 0x00), high = _mm512_clmulepi64_epi128(b, c, 0x01);
    __m512i reduce =
        _mm512_clmulepi64_epi128(_mm512_bsrli_epi128(high, 8), _mm512_set1_epi64(0x87), 0x00);
    return _mm512_ternarylogic_epi64(low, _mm512_bslli_epi128(high, 8), reduce, 0x96);
}

AVX512_TARGET static inline void xts_starts_512(__m128i first, __m512i *t)
{
    __m512i b = _mm512_broadcast_i32x4(first);
    t[0] = mul_x_clmul(b, _mm512_set_epi64(0, 8, 0, 4, 0, 2, 0, 1));
    t[1] = mul_x_clmul(b, _mm512_set_epi64(0, 128, 0, 64, 0, 32, 0, 16));
    t[2] = MUL_X_BYTES_512(t[0], 1);
    t[3] = MUL_X_BYTES_512(t[1], 1);
    for (int i = 4; i < XTS_REGS_512; i++)
        t[i] = MUL_X_BYTES_512(t[i - 4], 2);
}

/* A step's tweaks to the next step's: every lane times x^(blocks per step), each register by
 * x^16. */
AVX2_TARGET static inline void xts_advance_256(__m256i *t)
{
    for (int i = 0; i < XTS_REGS_256; i++)
        t[i] = MUL_X_BYTES_256(t[i], LANES_256 * XTS_REGS_256 / 8);
}

AVX512_TARGET static inline void xts_advance_512(__m512i *t)
{
    for (int i = 0; i < XTS_REGS_512; i++)
        t[i] = MUL_X_BYTES_512(t[i], LANES_512 * XTS_REGS_512 / 8);
}

/*
 * AES-XTS of len bytes, whole units of unit_bytes (a multiple of 16); dst may be src: the ymm
 * and zmm kernels (xts_aesni, below, makes its tweaks in general-purpose registers). A step
 * takes XTS_REGS_W registers of a unit through the rounds together, each register's tweaks
 * advanced by x^(blocks per step) before the next (not after a unit's last step). E(P ^ T) ^ T
 * is AESENCLAST(rounds(P ^ (T ^ K0)), K_last ^ T): the tweak stays off the blocks' chain of
 * dependent instructions.
 *
 * XTS_UNIT is one unit from its starting tweaks t (advanced in place), with the caller's REGS
 * and STEP (blocks a step) and x, REGS registers of scratch. Where prefetch is true, each step
 * prefetches the input and output lines XTS_PREFETCH bytes on: on zmm 3-13 % faster at either
 * unit size on Sapphire Rapids, where the hardware prefetchers alone left the rounds waiting on
 * lines. Not measured on ymm, which does not prefetch.
 */
#define XTS_PREFETCH 4096
#define XTS_UNIT(W, dk, dkeys, rounds, in, out, blocks, t, x, encrypt, prefetch)               \
    do {                                                                                       \
        size_t j = 0;                                                                          \
        for (; j + STEP <= (blocks); j += STEP) {                                              \
            if (j)                                                                             \
                xts_advance_##W(t);                                                            \
            for (int i = 0; i < REGS; i++) {                                                   \
                x[i] = XOR_##W(LOADU_##W(in + 16 * (j + LANES_##W * i)), XOR_##W(t[i], dk[0])); \
                if (prefetch) {                                                                \
                    size_t ahead_ = 16 * (j + LANES_##W * i) + XTS_PREFETCH;                   \
                    _mm_prefetch((const char *)(in + ahead_), _MM_HINT_T0);                    \
                    _mm_prefetch((const char *)(out + ahead_), _MM_HINT_T0);                   \
                }                                                                              \
            }                                                                                  \
            if (encrypt) {                                                                     \
                MIDDLE_ROUNDS(ENC_##W, dk, rounds, x, REGS);                                   \
                for (int i = 0; i < REGS; i++)                                                 \
                    x[i] = ENCLAST_##W(x[i], XOR_##W(dk[rounds], t[i]));                       \
            } else {                                                                           \
                MIDDLE_ROUNDS(DEC_##W, dk, rounds, x, REGS);                                   \
                for (int i = 0; i < REGS; i++)                                                 \
                    x[i] = DECLAST_##W(x[i], XOR_##W(dk[rounds], t[i]));                       \
            }                                                                                  \
            for (int i = 0; i < REGS; i++)                                                     \
                STOREU_##W(out + 16 * (j + LANES_##W * i), x[i]);                              \
        }                                                                                      \
        if (j < (blocks)) {                                                                    \
            if (j)                                                                             \
                xts_advance_##W(t);                                                            \
            xts_tail(dkeys, rounds, out, in, j, blocks, LOW_##W(t[0]), encrypt);               \
        }                                                                                      \
    } while (0)

/*
 * The ymm kernel: the first tweaks of GROUP units are encrypted in one pass and their starting
 * tweaks all computed before the units' rounds: made unit by unit, they stalled the rounds.
 * Past the last unit the IVs are zeros (a copy: ivs is not read past its end).
 */
AVX2_TARGET static void xts_avx2(const AesSchedule *data, const AesSchedule *tweak, uint8_t *dst,
                                 const uint8_t *src, const uint8_t *ivs, size_t len,
                                 size_t unit_bytes, int encrypt)
{
    enum { REGS = XTS_REGS_256, STEP = LANES_256 * REGS, FIRST = GROUP / LANES_256 };
    enum { AT_ONCE = FIRST < REGS ? FIRST : REGS };
    __m256i dk[15], tk[15], first[FIRST], starts[GROUP][REGS];
    uint8_t padded[16 * GROUP];
    const __m128i *dkeys = encrypt ? data->enc : data->dec;
    int rounds = data->rounds;
    for (int r = 0; r <= rounds; r++) {
        dk[r] = BROADCAST_256(dkeys[r]);
        tk[r] = BROADCAST_256(tweak->enc[r]);
    }
    size_t units = len / unit_bytes, blocks = unit_bytes / 16;
    for (size_t u0 = 0; u0 < units; u0 += GROUP) {
        size_t n = units - u0 < GROUP ? units - u0 : GROUP;
        const uint8_t *iv = ivs + 16 * u0;
        if (n < GROUP) {
            memset(padded, 0, sizeof padded);
            memcpy(padded, iv, 16 * n);
            iv = padded;
        }
        for (int g = 0; g < FIRST; g++)
            first[g] = LOADU_256(iv + 16 * LANES_256 * g);
        for (int g = 0; g < FIRST; g += AT_ONCE) {
            __m256i *f = first + g;
            ROUNDS(ENC_256, ENCLAST_256, XOR_256, tk, rounds, f, AT_ONCE);
        }
        for (size_t u = 0; u < n; u++)
            xts_starts_256(((const __m128i *)first)[u], starts[u]);
        for (size_t u = 0; u < n; u++) {
            const uint8_t *in = src + (u0 + u) * unit_bytes;
            uint8_t *out = dst + (u0 + u) * unit_bytes;
            __m256i t[REGS], x[REGS];
            memcpy(t, starts[u], sizeof t);
            XTS_UNIT(256, dk, dkeys, rounds, in, out, blocks, t, x, encrypt, 0);
        }
    }
    OPENSSL_cleanse(dk, sizeof dk);
    OPENSSL_cleanse(tk, sizeof tk);
    OPENSSL_cleanse(first, sizeof first);
    OPENSSL_cleanse(starts, sizeof starts);
}

/* Units whose first tweaks the zmm kernel encrypts together: eight registers, whose rounds
 * interleave; two registers (GROUP, eight units) left the units' rounds waiting on theirs. */
#define XTS_GROUP_512 32

/* The first tweaks of units u0 .. u0 + XTS_GROUP_512 - 1 into first[], two registers at a time
 * and only as many as there are units; IVs past the last unit are zeros (a copy: ivs is not read
 * past its end). */
AVX512_TARGET static inline __attribute__((always_inline)) void xts_first_tweaks_512(
    const __m512i *tk, int rounds, const uint8_t *ivs, size_t u0, size_t units, __m128i *first)
{
    enum { AT_ONCE = 2 };
    uint8_t padded[16 * XTS_GROUP_512];
    const uint8_t *iv = ivs + 16 * u0;
    size_t n = units - u0 < XTS_GROUP_512 ? units - u0 : XTS_GROUP_512;
    if (n < XTS_GROUP_512) {
        memset(padded, 0, sizeof padded);
        memcpy(padded, iv, 16 * n);
        iv = padded;
    }
    for (size_t g = 0; LANES_512 * g < n; g += AT_ONCE) {
        __m512i f[AT_ONCE];
        for (int i = 0; i < AT_ONCE; i++)
            f[i] = LOADU_512(iv + 16 * LANES_512 * (g + i));
        ROUNDS(ENC_512, ENCLAST_512, XOR_512, tk, rounds, f, AT_ONCE);
        for (int i = 0; i < AT_ONCE; i++)
            STOREU_512(first + LANES_512 * (g + i), f[i]);
    }
}

/*
 * The zmm kernel. Its rounds keep the one port that runs zmm AES instructions busy, so what
 * else a unit needs is made ahead, where it overlaps rounds instead of holding them up: each
 * unit's starting tweaks while the unit before it runs, each group's first tweaks while the
 * group before it runs (first[] holds two groups, the current and the next).
 */
AVX512_TARGET static void xts_avx512(const AesSchedule *data, const AesSchedule *tweak,
                                     uint8_t *dst, const uint8_t *src, const uint8_t *ivs,
                                     size_t len, size_t unit_bytes, int encrypt)
{
    enum { REGS = XTS_REGS_512, STEP = LANES_512 * REGS, SLOTS = 2 * XTS_GROUP_512 };
    __m512i dk[15], tk[15], next[REGS];
    __m128i first[SLOTS];
    const __m128i *dkeys = encrypt ? data->enc : data->dec;
    int rounds = data->rounds;
    for (int r = 0; r <= rounds; r++) {
        dk[r] = BROADCAST_512(dkeys[r]);
        tk[r] = BROADCAST_512(tweak->enc[r]);
    }
    size_t units = len / unit_bytes, blocks = unit_bytes / 16;
    if (units) {
        xts_first_tweaks_512(tk, rounds, ivs, 0, units, first);
        xts_starts_512(first[0], next);
    }
    for (size_t u = 0; u < units; u++) {
        const uint8_t *in = src + u * unit_bytes;
        uint8_t *out = dst + u * unit_bytes;
        __m512i t[REGS], x[REGS];
        memcpy(t, next, sizeof t);
        if (u % XTS_GROUP_512 == 0 && u + XTS_GROUP_512 < units)
            xts_first_tweaks_512(tk, rounds, ivs, u + XTS_GROUP_512, units,
                                 first + (u + XTS_GROUP_512) % SLOTS);
        if (u + 1 < units)
            xts_starts_512(first[(u + 1) % SLOTS], next);
        /* No prefetch reaches past the request: the units in its last 4 KiB go without. */
        int prefetch = (u + 1) * unit_bytes + XTS_PREFETCH <= len;
        XTS_UNIT(512, dk, dkeys, rounds, in, out, blocks, t, x, encrypt, prefetch);
    }
    OPENSSL_cleanse(dk, sizeof dk);
    OPENSSL_cleanse(tk, sizeof tk);
    OPENSSL_cleanse(first, sizeof first);
    OPENSSL_cleanse(next, sizeof next);
}

/* The first tweaks of units u0 .. u0 + GROUP - 1, encrypted together, as (lo, hi) pairs; IVs
 * past the last unit are zeros (a copy: ivs is not read past its end). */
AESNI_TARGET static inline __attribute__((always_inline)) void xts_first_tweaks_128(
    const __m128i *tk, int rounds, const uint8_t *ivs, size_t u0, size_t units,
    uint64_t (*first)[2])
{
    __m128i x[GROUP];
    uint8_t padded[16 * GROUP];
    const uint8_t *iv = ivs + 16 * u0;
    if (units - u0 < GROUP) {
        memset(padded, 0, sizeof padded);
        memcpy(padded, iv, 16 * (units - u0));
        iv = padded;
    }
    for (int g = 0; g < GROUP; g++)
        x[g] = _mm_loadu_si128((const __m128i *)(iv + 16 * g));
    ROUNDS(_mm_aesenc_si128, _mm_aesenclast_si128, _mm_xor_si128, tk, rounds, x, GROUP);
    memcpy(first, x, sizeof x);
    OPENSSL_cleanse(x, sizeof x);
}

/*
 * The aesni XTS kernel: a step takes XTS_REGS_128 blocks of a unit through the rounds together.
 * Each block's tweak t = (lo, hi) is doubled in general-purpose registers (the vector pipes are
 * the AES units' own) and XORed there with the first round's key, then moved into a register
 * whole: x = P ^ (t ^ K0), and the last round's key is (t ^ K0) ^ (K0 ^ K_last), so the tweak
 * stays off the blocks' chain of dependent instructions. No tweak is stored as two 64-bit halves
 * and loaded as one 128-bit value (AMD cores do not forward such a load from the stores); a
 * step stores only its output and, where the registers run out, its last round's keys, whole.
 * The doubling depends on nothing else, so the core runs it ahead of the rounds. Units whose
 * blocks are not whole steps end one block at a time.
 */
AESNI_TARGET static void xts_aesni(const AesSchedule *data, const AesSchedule *tweak, uint8_t *dst,
                                   const uint8_t *src, const uint8_t *ivs, size_t len,
                                   size_t unit_bytes, int encrypt)
{
    enum { STEP = XTS_REGS_128 };
    __m128i dk[15], tk[15];
    __m128i last[STEP];
    uint64_t first[GROUP][2], k0[2];
    const __m128i *dkeys = encrypt ? data->enc : data->dec;
    int rounds = data->rounds;
    for (int r = 0; r <= rounds; r++) {
        dk[r] = dkeys[r];
        tk[r] = tweak->enc[r];
    }
    memcpy(k0, &dk[0], 16);
    __m128i k0_last = _mm_xor_si128(dk[0], dk[rounds]);
    size_t units = len / unit_bytes, blocks = unit_bytes / 16;
    for (size_t u = 0; u < units; u++) {
        const uint8_t *in = src + u * unit_bytes;
        uint8_t *out = dst + u * unit_bytes;
        if (u % GROUP == 0)
            xts_first_tweaks_128(tk, rounds, ivs, u, units, first);
        uint64_t lo = first[u % GROUP][0], hi = first[u % GROUP][1];
        size_t j = 0;
        for (; j + STEP <= blocks; j += STEP) {
            __m128i x[STEP];
            for (int i = 0; i < STEP; i++) {
                __m128i white = _mm_set_epi64x((long long)(hi ^ k0[1]), (long long)(lo ^ k0[0]));
                x[i] = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(in + 16 * (j + i))), white);
                last[i] = _mm_xor_si128(white, k0_last);
                uint64_t carry = hi >> 63;
                hi = hi << 1 | lo >> 63;
                lo = lo << 1 ^ (0x87 & (0 - carry));
            }
            if (encrypt) {
                MIDDLE_ROUNDS(_mm_aesenc_si128, dk, rounds, x, STEP);
                for (int i = 0; i < STEP; i++)
                    x[i] = _mm_aesenclast_si128(x[i], last[i]);
            } else {
                MIDDLE_ROUNDS(_mm_aesdec_si128, dk, rounds, x, STEP);
                for (int i = 0; i < STEP; i++)
                    x[i] = _mm_aesdeclast_si128(x[i], last[i]);
            }
            for (int i = 0; i < STEP; i++)
                _mm_storeu_si128((__m128i *)(out + 16 * (j + i)), x[i]);
        }
        if (j < blocks)
            xts_tail(dkeys, rounds, out, in, j, blocks, _mm_set_epi64x((long long)hi, (long long)lo),
                     encrypt);
    }
    OPENSSL_cleanse(dk, sizeof dk);
    OPENSSL_cleanse(tk, sizeof tk);
    OPENSSL_cleanse(first, sizeof first);
    OPENSSL_cleanse(k0, sizeof k0);
    OPENSSL_cleanse(last, sizeof last);
}

/*
 * Multi-lane CBC encryption. CBC is serial inside a data unit (each block waits for the
 * previous one's ciphertext) but data units are independent: lane l carries unit u0 + l, and
 * block j of every lane goes through the rounds together, so the AES units see a group's lanes
 * (16 on zmm and ymm, 8 on xmm) as independent blocks per round instead of one chain's latency.
 * A zmm register holds four lanes, a ymm two, an xmm one. The lanes of a whole group are a
 * stride of one unit apart, so a step addresses them from one pointer; with 512-byte units the
 * stride is a constant and every lane's address an offset in the instruction. In the last
 * group, lanes past the last unit repeat it: they read its plaintext with the lane they copy,
 * before either stores, and store the same ciphertext.
 */

/* A register of LANES_W lanes' blocks at p + off[0], p + off[1], ..., lane 0 lowest, and
 * back. */
AESNI_TARGET static inline __m128i load_lanes_128(const uint8_t *p, const size_t *off)
{
    return _mm_loadu_si128((const __m128i *)(p + off[0]));
}

AESNI_TARGET static inline void store_lanes_128(uint8_t *p, const size_t *off, __m128i v)
{
    _mm_storeu_si128((__m128i *)(p + off[0]), v);
}

AVX2_TARGET static inline __m256i load_lanes_256(const uint8_t *p, const size_t *off)
{
    return _mm256_loadu2_m128i((const __m128i *)(p + off[1]), (const __m128i *)(p + off[0]));
}

AVX2_TARGET static inline void store_lanes_256(uint8_t *p, const size_t *off, __m256i v)
{
    _mm256_storeu2_m128i((__m128i *)(p + off[1]), (__m128i *)(p + off[0]), v);
}

AVX512_TARGET static inline __m512i load_lanes_512(const uint8_t *p, const size_t *off)
{
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p + off[0])));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + off[1])), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + off[2])), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(p + off[3])), 3);
}

AVX512_TARGET static inline void store_lanes_512(uint8_t *p, const size_t *off, __m512i v)
{
    _mm_storeu_si128((__m128i *)(p + off[0]), _mm512_castsi512_si128(v));
    _mm_storeu_si128((__m128i *)(p + off[1]), _mm512_extracti32x4_epi32(v, 1));
    _mm_storeu_si128((__m128i *)(p + off[2]), _mm512_extracti32x4_epi32(v, 2));
    _mm_storeu_si128((__m128i *)(p + off[3]), _mm512_extracti32x4_epi32(v, 3));
}

/* LANES_W blocks of each of LANES_W lanes, x[k] holding block k of every lane (lane 0
 * lowest): one load of a lane's LANES_W blocks, then a transpose of the LANES_W by LANES_W
 * square of blocks; the transpose is its own inverse, and storing transposes back. A lane's
 * cache line is read (and written) whole at once: with 4096-byte units the 16 lanes share an
 * L1 set, which evicts lines between single-block steps. */
AESNI_TARGET static inline void load_square_128(const uint8_t *p, size_t stride, __m128i *x)
{
    (void)stride;
    x[0] = _mm_loadu_si128((const __m128i *)p);
}

AESNI_TARGET static inline void store_square_128(uint8_t *p, size_t stride, const __m128i *x)
{
    (void)stride;
    _mm_storeu_si128((__m128i *)p, x[0]);
}

AVX2_TARGET static inline void transpose_256(__m256i *x)
{
    __m256i a = x[0], b = x[1];
    x[0] = _mm256_permute2x128_si256(a, b, 0x20);
    x[1] = _mm256_permute2x128_si256(a, b, 0x31);
}

AVX2_TARGET static inline void load_square_256(const uint8_t *p, size_t stride, __m256i *x)
{
    x[0] = _mm256_loadu_si256((const __m256i *)p);
    x[1] = _mm256_loadu_si256((const __m256i *)(p + stride));
    transpose_256(x);
}

AVX2_TARGET static inline void store_square_256(uint8_t *p, size_t stride, const __m256i *x)
{
    __m256i t[2] = {x[0], x[1]};
    transpose_256(t);
    _mm256_storeu_si256((__m256i *)p, t[0]);
    _mm256_storeu_si256((__m256i *)(p + stride), t[1]);
}

AVX512_TARGET static inline void transpose_512(__m512i *x)
{
    __m512i t0 = _mm512_shuffle_i64x2(x[0], x[1], 0x44);
    __m512i t1 = _mm512_shuffle_i64x2(x[0], x[1], 0xee);
    __m512i t2 = _mm512_shuffle_i64x2(x[2], x[3], 0x44);
    __m512i t3 = _mm512_shuffle_i64x2(x[2], x[3], 0xee);
    x[0] = _mm512_shuffle_i64x2(t0, t2, 0x88);
    x[1] = _mm512_shuffle_i64x2(t0, t2, 0xdd);
    x[2] = _mm512_shuffle_i64x2(t1, t3, 0x88);
    x[3] = _mm512_shuffle_i64x2(t1, t3, 0xdd);
}

AVX512_TARGET static inline void load_square_512(const uint8_t *p, size_t stride, __m512i *x)
{
    for (int l = 0; l < 4; l++)
        x[l] = _mm512_loadu_si512(p + l * stride);
    transpose_512(x);
}

AVX512_TARGET static inline void store_square_512(uint8_t *p, size_t stride, const __m512i *x)
{
    __m512i t[4] = {x[0], x[1], x[2], x[3]};
    transpose_512(t);
    for (int l = 0; l < 4; l++)
        _mm512_storeu_si512(p + l * stride, t[l]);
}

#define PRAGMA_TEXT(text) #text
#define UNROLL(n) _Pragma(PRAGMA_TEXT(GCC unroll n))

/* How far the CBC encryption kernels unroll a square's blocks. Rolled, GCC kept the lanes' CBC
 * state in memory between a square's blocks (a store and reload on every lane's chain);
 * unrolled it stays in registers. */
#define SQUARE_UNROLL_128 1
#define SQUARE_UNROLL_256 2
#define SQUARE_UNROLL_512 4

/* Whether a CBC encryption step also prefetches the next group's output lines: lanes' stores
 * a unit apart missing the cache wait on their lines one by one, which the hardware
 * prefetchers do not fetch ahead. */
#define PREFETCH_DST_128 1
#define PREFETCH_DST_256 1
#define PREFETCH_DST_512 1

/* The L1 data cache the CBC encryption kernels plan for: 32 KiB on Zen 3, Zen 4 and Skylake
 * (48 KiB from Ice Lake on). */
#define L1_BYTES (32 * 1024)

/* The next group's bytes a CBC encryption step reads (and, PREFETCH_DST_W, writes), `bytes`
 * from `ahead`, no further than the request's `size`: into L1, or into L2 where to_l2. */
#define CBC_PREFETCH(W, src, dst, ahead, bytes, size, to_l2)                                   \
    do {                                                                                       \
        for (size_t b_ = (ahead); b_ < (ahead) + (bytes) && b_ < (size); b_ += 64) {           \
            if (to_l2) {                                                                       \
                _mm_prefetch((const char *)((src) + b_), _MM_HINT_T2);                         \
                if (PREFETCH_DST_##W)                                                          \
                    _mm_prefetch((const char *)((dst) + b_), _MM_HINT_T2);                     \
            } else {                                                                           \
                _mm_prefetch((const char *)((src) + b_), _MM_HINT_T0);                         \
                if (PREFETCH_DST_##W)                                                          \
                    _mm_prefetch((const char *)((dst) + b_), _MM_HINT_T0);                     \
            }                                                                                  \
        }                                                                                      \
    } while (0)

/* CBC encryption of units in groups of LANES_W * REGS lanes. Inlined into each kernel, so a
 * constant unit_bytes stays one. Each step of a whole group prefetches as many bytes of the
 * next group as it reads: lanes a unit apart are no stream the hardware prefetchers follow
 * (one sequence of lines per 4 KiB page). The prefetches go to L2 where the group's and the
 * next group's input and output would fill L1, so they do not evict lines the group still
 * reads. A whole group goes LANES_W blocks at a time in squares, which read and write a
 * lane's line whole (with 4096-byte units the lanes share an L1 set); 512-byte units, whose
 * lanes spread over 8 L1 sets, one block at a time, which streamed from DRAM faster. The
 * blocks past the last square, and the last group if it is not whole, one step at a time.
 * The lanes' chains (state) end as ciphertext and are not wiped: taking their address for a
 * wipe kept them in memory, a store and reload on every block's chain. */
#define CBC_ENCRYPT_GROUPS(name, TARGET, W, REGS)                                              \
    TARGET static inline __attribute__((always_inline)) void name(                             \
        const AesSchedule *s, uint8_t *dst, const uint8_t *src, const uint8_t *ivs,            \
        size_t units, size_t unit_bytes)                                                       \
    {                                                                                          \
        enum { LANES = LANES_##W * (REGS), SQUARE_BYTES = 16 * LANES * LANES_##W };           \
        VEC_##W rk[15];                                                                        \
        __m128i lane_ivs[LANES];                                                               \
        size_t off[LANES];                                                                     \
        int rounds = s->rounds;                                                                \
        size_t blocks = unit_bytes / 16, size = units * unit_bytes;                            \
        size_t squares = LANES_##W == 1 || unit_bytes > 512 ? blocks : 0;                      \
        int to_l2 = 4 * LANES * unit_bytes >= L1_BYTES;                                        \
        for (int r = 0; r <= rounds; r++)                                                      \
            rk[r] = BROADCAST_##W(s->enc[r]);                                                  \
        for (size_t u0 = 0; u0 < units; u0 += LANES) {                                         \
            size_t n = units - u0 < LANES ? units - u0 : LANES;                                \
            const uint8_t *in = src + u0 * unit_bytes;                                         \
            uint8_t *out = dst + u0 * unit_bytes;                                              \
            size_t next = (u0 + LANES) * unit_bytes;                                           \
            VEC_##W state[REGS];                                                               \
            for (size_t l = 0; l < LANES; l++) {                                               \
                size_t u = l < n ? l : n - 1;                                                  \
                off[l] = u * unit_bytes;                                                       \
                lane_ivs[l] = _mm_loadu_si128((const __m128i *)(ivs + 16 * (u0 + u)));         \
            }                                                                                  \
            for (int r = 0; r < (REGS); r++)                                                   \
                state[r] = LOADU_##W(lane_ivs + LANES_##W * r);                                \
            size_t j = 0;                                                                      \
            for (; n == LANES && j + LANES_##W <= squares; j += LANES_##W) {                   \
                VEC_##W x[REGS][LANES_##W];                                                    \
                CBC_PREFETCH(W, src, dst, next + 16 * LANES * j, SQUARE_BYTES, size, to_l2);   \
                for (int r = 0; r < (REGS); r++)                                               \
                    load_square_##W(in + LANES_##W * r * unit_bytes, unit_bytes, x[r]);        \
                UNROLL(SQUARE_UNROLL_##W) for (int k = 0; k < LANES_##W; k++) {               \
                    for (int r = 0; r < (REGS); r++)                                           \
                        state[r] = XOR_##W(state[r], x[r][k]);                                 \
                    ROUNDS(ENC_##W, ENCLAST_##W, XOR_##W, rk, rounds, state, REGS);            \
                    for (int r = 0; r < (REGS); r++)                                           \
                        x[r][k] = state[r];                                                    \
                }                                                                              \
                for (int r = 0; r < (REGS); r++)                                               \
                    store_square_##W(out + LANES_##W * r * unit_bytes, unit_bytes, x[r]);      \
                in += 16 * LANES_##W;                                                          \
                out += 16 * LANES_##W;                                                         \
            }                                                                                  \
            for (; j < blocks; j++, in += 16, out += 16) {                                     \
                if (n == LANES)                                                                \
                    CBC_PREFETCH(W, src, dst, next + 16 * LANES * j, 16 * LANES, size, to_l2); \
                for (int r = 0; r < (REGS); r++)                                               \
                    state[r] = XOR_##W(state[r], load_lanes_##W(in, off + LANES_##W * r));     \
                ROUNDS(ENC_##W, ENCLAST_##W, XOR_##W, rk, rounds, state, REGS);                \
                for (int r = 0; r < (REGS); r++)                                               \
                    store_lanes_##W(out, off + LANES_##W * r, state[r]);                       \
            }                                                                                  \
        }                                                                                      \
        OPENSSL_cleanse(rk, sizeof rk);                                                        \
        OPENSSL_cleanse(lane_ivs, sizeof lane_ivs);                                            \
    }

CBC_ENCRYPT_GROUPS(cbc_groups_128, AESNI_TARGET, 128, 8)
CBC_ENCRYPT_GROUPS(cbc_groups_256, AVX2_TARGET, 256, 8)
CBC_ENCRYPT_GROUPS(cbc_groups_512, AVX512_TARGET, 512, 4)

/* A path's CBC encryption kernel: its groups, with 512-byte units (a sector) as a constant. */
#define CBC_ENCRYPT_KERNEL(name, TARGET, groups)                                               \
    TARGET static void name(const AesSchedule *s, uint8_t *dst, const uint8_t *src,            \
                            const uint8_t *ivs, size_t units, size_t unit_bytes)              \
    {                                                                                          \
        if (unit_bytes == 512)                                                                 \
            groups(s, dst, src, ivs, units, 512);                                              \
        else                                                                                   \
            groups(s, dst, src, ivs, units, unit_bytes);                                       \
    }

CBC_ENCRYPT_KERNEL(cbc_encrypt_aesni, AESNI_TARGET, cbc_groups_128)
CBC_ENCRYPT_KERNEL(cbc_encrypt_avx2, AVX2_TARGET, cbc_groups_256)
CBC_ENCRYPT_KERNEL(cbc_encrypt_avx512, AVX512_TARGET, cbc_groups_512)

/* CBC decryption has no chain to wait for: P[j] = D(C[j]) ^ C[j-1], with C[-1] the IV. Each
 * step loads all its ciphertext before it stores, and the previous step's last block stays in
 * a register, so dst may be src. The blocks past the last whole step, one at a time. */
AESNI_TARGET static void cbc_decrypt_tail(const AesSchedule *s, uint8_t *out, const uint8_t *in,
                                          size_t from, size_t blocks, __m128i previous)
{
    for (size_t j = from; j < blocks; j++) {
        __m128i x = _mm_loadu_si128((const __m128i *)(in + 16 * j));
        _mm_storeu_si128((__m128i *)(out + 16 * j),
                         _mm_xor_si128(aes_block(s->dec, s->rounds, x, 0), previous));
        previous = x;
    }
}

/* CBC decryption of a unit REGS registers at a time; register i's previous blocks come from
 * register i - 1 and itself (BEFORE_W), the first register's from the last step's. FOLD: XOR
 * them into the last round's key instead of the result (aesdeclast(x, k ^ p) is
 * aesdeclast(x, k) ^ p), as OpenSSL does: faster on aesni (16 registers), not on the wider. */
#define CBC_DECRYPT_KERNEL(name, TARGET, W, REGS, FOLD)                                        \
    TARGET static void name(const AesSchedule *s, uint8_t *dst, const uint8_t *src,            \
                            const uint8_t *ivs, size_t units, size_t unit_bytes)              \
    {                                                                                          \
        enum { STEP = LANES_##W * (REGS) };                                                    \
        VEC_##W rk[15];                                                                        \
        int rounds = s->rounds;                                                                \
        size_t blocks = unit_bytes / 16;                                                       \
        for (int r = 0; r <= rounds; r++)                                                      \
            rk[r] = BROADCAST_##W(s->dec[r]);                                                  \
        for (size_t u = 0; u < units; u++) {                                                   \
            const uint8_t *in = src + u * unit_bytes;                                          \
            uint8_t *out = dst + u * unit_bytes;                                               \
            VEC_##W last = BROADCAST_##W(_mm_loadu_si128((const __m128i *)(ivs + 16 * u)));   \
            size_t j = 0;                                                                      \
            for (; j + STEP <= blocks; j += STEP) {                                            \
                VEC_##W c[REGS], x[REGS];                                                      \
                for (int i = 0; i < (REGS); i++)                                               \
                    c[i] = x[i] = LOADU_##W(in + 16 * (j + LANES_##W * i));                    \
                if (FOLD) {                                                                    \
                    VEC_##W p[REGS];                                                           \
                    for (int i = 0; i < (REGS); i++) {                                         \
                        x[i] = XOR_##W(x[i], rk[0]);                                           \
                        p[i] = XOR_##W(rk[rounds], BEFORE_##W(c[i], i ? c[i - 1] : last));     \
                    }                                                                          \
                    MIDDLE_ROUNDS(DEC_##W, rk, rounds, x, REGS);                               \
                    for (int i = 0; i < (REGS); i++)                                           \
                        STOREU_##W(out + 16 * (j + LANES_##W * i), DECLAST_##W(x[i], p[i]));   \
                } else {                                                                       \
                    ROUNDS(DEC_##W, DECLAST_##W, XOR_##W, rk, rounds, x, REGS);                \
                    for (int i = 0; i < (REGS); i++)                                           \
                        STOREU_##W(out + 16 * (j + LANES_##W * i),                             \
                                   XOR_##W(x[i], BEFORE_##W(c[i], i ? c[i - 1] : last)));     \
                }                                                                              \
                last = c[(REGS) - 1];                                                          \
            }                                                                                  \
            cbc_decrypt_tail(s, out, in, j, blocks, HIGH_##W(last));                           \
        }                                                                                      \
        OPENSSL_cleanse(rk, sizeof rk);                                                        \
    }

CBC_DECRYPT_KERNEL(cbc_decrypt_aesni, AESNI_TARGET, 128, 8, 1)
CBC_DECRYPT_KERNEL(cbc_decrypt_avx2, AVX2_TARGET, 256, 8, 0)
CBC_DECRYPT_KERNEL(cbc_decrypt_avx512, AVX512_TARGET, 512, 4, 0)

/* dm-crypt's essiv IVs on a path's width: ivs[u] = E_salt(le64 of sector + u * step, zero
 * padded), eight blocks a step. ivs has room for units rounded up to 8: the last step fills the
 * slots past the last unit too, instead of a serial tail. */
#define ESSIV_STEP 8
#define ESSIV_KERNEL(name, TARGET, W)                                                          \
    TARGET static void name(const AesSchedule *s, uint8_t *ivs, uint64_t sector, uint64_t step, \
                            size_t units)                                                      \
    {                                                                                          \
        enum { REGS = ESSIV_STEP / LANES_##W };                                                \
        VEC_##W rk[15];                                                                        \
        int rounds = s->rounds;                                                                \
        size_t slots = (units + ESSIV_STEP - 1) / ESSIV_STEP * ESSIV_STEP;                     \
        for (size_t u = 0; u < slots; u++, sector += step) {                                   \
            store_le64(ivs + 16 * u, sector);                                                  \
            store_le64(ivs + 16 * u + 8, 0);                                                   \
        }                                                                                      \
        for (int r = 0; r <= rounds; r++)                                                      \
            rk[r] = BROADCAST_##W(s->enc[r]);                                                  \
        for (size_t u = 0; u < slots; u += ESSIV_STEP) {                                       \
            VEC_##W x[REGS];                                                                   \
            for (int i = 0; i < REGS; i++)                                                     \
                x[i] = LOADU_##W(ivs + 16 * (u + LANES_##W * i));                              \
            ROUNDS(ENC_##W, ENCLAST_##W, XOR_##W, rk, rounds, x, REGS);                        \
            for (int i = 0; i < REGS; i++)                                                     \
                STOREU_##W(ivs + 16 * (u + LANES_##W * i), x[i]);                              \
        }                                                                                      \
        OPENSSL_cleanse(rk, sizeof rk);                                                        \
    }

ESSIV_KERNEL(essiv_aesni, AESNI_TARGET, 128)
ESSIV_KERNEL(essiv_avx2, AVX2_TARGET, 256)
ESSIV_KERNEL(essiv_avx512, AVX512_TARGET, 512)

/* The paths this CPU and OS can run, one bit per Path: CPUID for the instructions, XCR0 for
 * the OS saving the ymm (and opmask and zmm) state across context switches. */
static unsigned detect_paths(void)
{
    unsigned paths = 1u << PATH_OPENSSL, a, b, c, d, xcr0, xcr0_high;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_AES) || !(c & bit_PCLMUL))
        return paths;
    paths |= 1u << PATH_AESNI;
    if (!(c & bit_OSXSAVE) || !(c & bit_AVX) || !__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return paths;
    __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
    int vaes = (c & bit_VAES) && (c & bit_VPCLMULQDQ), ymm = (xcr0 & 0x06) == 0x06, zmm = (xcr0 & 0xe6) == 0xe6;
    if (vaes && ymm && (b & bit_AVX2))
        paths |= 1u << PATH_AVX2;
    if (vaes && zmm && (b & bit_AVX512F) && (b & bit_AVX512BW))
        paths |= 1u << PATH_AVX512;
    return paths;
}

typedef void (*XtsKernel)(const AesSchedule *, const AesSchedule *, uint8_t *, const uint8_t *,
                          const uint8_t *, size_t, size_t, int);
typedef void (*CbcKernel)(const AesSchedule *, uint8_t *, const uint8_t *, const uint8_t *,
                          size_t, size_t);

static const XtsKernel xts_kernels[PATH_COUNT] = {
    [PATH_AESNI] = xts_aesni, [PATH_AVX2] = xts_avx2, [PATH_AVX512] = xts_avx512};
static const CbcKernel cbc_encrypt_kernels[PATH_COUNT] = {
    [PATH_AESNI] = cbc_encrypt_aesni, [PATH_AVX2] = cbc_encrypt_avx2,
    [PATH_AVX512] = cbc_encrypt_avx512};
static const CbcKernel cbc_decrypt_kernels[PATH_COUNT] = {
    [PATH_AESNI] = cbc_decrypt_aesni, [PATH_AVX2] = cbc_decrypt_avx2,
    [PATH_AVX512] = cbc_decrypt_avx512};
typedef void (*EssivKernel)(const AesSchedule *, uint8_t *, uint64_t, uint64_t, size_t);
static const EssivKernel essiv_kernels[PATH_COUNT] = {
    [PATH_AESNI] = essiv_aesni, [PATH_AVX2] = essiv_avx2, [PATH_AVX512] = essiv_avx512};

/* Units whose IVs are made just before the CBC kernel runs over them: 4 KiB of IVs, in L1
 * (a multiple of ESSIV_STEP and of every path's lanes). */
#define ESSIV_CHUNK 256

/* AES-CBC with essiv IVs of sectors sector, sector + step, ...: a chunk's IVs, then its units. */
static void cbc_essiv_run(Path path, const AesSchedule *data, const AesSchedule *salt,
                          uint8_t *dst, const uint8_t *src, uint64_t sector, uint64_t step,
                          size_t units, size_t unit_bytes, int encrypt)
{
    uint8_t ivs[16 * ESSIV_CHUNK];
    CbcKernel kernel = encrypt ? cbc_encrypt_kernels[path] : cbc_decrypt_kernels[path];
    for (size_t u = 0; u < units; u += ESSIV_CHUNK) {
        size_t n = units - u < ESSIV_CHUNK ? units - u : ESSIV_CHUNK;
        essiv_kernels[path](salt, ivs, sector + u * step, step, n);
        kernel(data, dst + u * unit_bytes, src + u * unit_bytes, ivs, n, unit_bytes);
    }
    size_t filled = units < ESSIV_CHUNK ? units : ESSIV_CHUNK;
    OPENSSL_cleanse(ivs, 16 * ((filled + ESSIV_STEP - 1) / ESSIV_STEP * ESSIV_STEP));
}
#else
#define X86_PATHS 0
static unsigned detect_paths(void)
{
    return 1u << PATH_OPENSSL;
}
#endif

static const EVP_CIPHER *aes_ecb(Py_ssize_t key_bytes)
{
    switch (key_bytes) {
    case 16:
        return EVP_aes_128_ecb();
    case 24:
        return EVP_aes_192_ecb();
    case 32:
        return EVP_aes_256_ecb();
    default:
        return NULL;
    }
}

static int aes_key_size(Py_ssize_t bytes)
{
    return bytes == 16 || bytes == 24 || bytes == 32;
}

PyDoc_STRVAR(xts_doc,
             "xts(dst, src, ivs, key, unit_bytes, encrypt)\n--\n\n"
             "AES-XTS (IEEE 1619) of src into dst (which may be src), data unit by data unit:\n"
             "unit u uses the 16-byte tweak ivs[u]; key is the data key then the tweak key\n"
             "(32, 48 or 64 bytes), as in dm-crypt's aes-xts tables. AES-128 and AES-256 run\n"
             "on the current path (path()); AES-192 and the openssl path on OpenSSL's ECB.");

/* XtsKey: an aes-xts key with its two AES key schedules expanded once (the kernel's
 * aesni_xts_ctx), so that a 4 KiB request does not expand them again on every call. The raw
 * key stays beside them for the openssl path and AES-192; both are cleansed by wipe() and on
 * deallocation, and neither is ever shown (no repr of the bytes, no pickling). */
typedef struct {
    PyObject_HEAD
#if X86_PATHS
    AesSchedule schedules[2]; /* data, tweak: valid when expanded */
#endif
    uint8_t key[64];
    Py_ssize_t key_len; /* 0 once wiped */
    int expanded;
    int busy; /* calls running on the schedules without the GIL */
} XtsKeyObject;

static PyTypeObject XtsKeyType;

/* The key types take positional arguments only: 1 with TypeError set if kwargs has any. */
static int refuse_keywords(const char *type_name, PyObject *kwargs)
{
    if (kwargs == NULL || PyDict_Size(kwargs) == 0)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s() takes no keyword arguments", type_name);
    return 1;
}

static void xts_key_cleanse(XtsKeyObject *self)
{
    OPENSSL_cleanse((uint8_t *)self + sizeof(PyObject),
                    sizeof(XtsKeyObject) - sizeof(PyObject));
}

static PyObject *xts_key_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    Py_buffer key;
    if (refuse_keywords("XtsKey", kwargs) || !PyArg_ParseTuple(args, "y*:XtsKey", &key))
        return NULL;
    XtsKeyObject *self = NULL;
    if (key.len != 32 && key.len != 48 && key.len != 64) {
        PyErr_SetString(PyExc_ValueError, "key must be 32, 48 or 64 bytes");
    } else if ((self = (XtsKeyObject *)type->tp_alloc(type, 0)) != NULL) {
        memcpy(self->key, key.buf, (size_t)key.len);
        self->key_len = key.len;
#if X86_PATHS
        /* AES-192 has no kernel: it stays on OpenSSL's ECB, from the raw key. */
        if (runnable_paths & 1u << PATH_AESNI && key.len != 48) {
            aes_schedule(&self->schedules[0], self->key, (int)key.len / 2);
            aes_schedule(&self->schedules[1], self->key + key.len / 2, (int)key.len / 2);
            self->expanded = 1;
        }
#endif
    }
    PyBuffer_Release(&key);
    return (PyObject *)self;
}

static void xts_key_dealloc(XtsKeyObject *self)
{
    xts_key_cleanse(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(xts_key_wipe_doc, "wipe()\n--\n\n"
                               "Cleanse the key and its schedules now, once the calls running\n"
                               "on them in other threads have ended (it waits for them); later\n"
                               "calls that use this key raise ValueError.");

static PyObject *xts_key_wipe(XtsKeyObject *self, PyObject *unused)
{
    self->key_len = 0; /* refuses new calls while the running ones end */
    wait_until_idle(&self->busy);
    xts_key_cleanse(self);
    Py_RETURN_NONE;
}

static PyMethodDef xts_key_methods[] = {
    {"wipe", (PyCFunction)xts_key_wipe, METH_NOARGS, xts_key_wipe_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(xts_key_doc,
             "XtsKey(key)\n--\n\n"
             "An aes-xts key (the data key then the tweak key: 32, 48 or 64 bytes) with its AES\n"
             "key schedules expanded once, for xts_plain64. Copies the key; cleansed by wipe()\n"
             "and when collected.");

static PyTypeObject XtsKeyType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "app._native.XtsKey",
    .tp_basicsize = sizeof(XtsKeyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = xts_key_doc,
    .tp_new = xts_key_new,
    .tp_dealloc = (destructor)xts_key_dealloc,
    .tp_methods = xts_key_methods,
};

/* EssivKey: an aes-cbc-essiv key and its salt with their AES schedules expanded once, as XtsKey
 * for XTS. cbc_essiv runs only on the AES paths, so no raw key is kept: on a CPU without them
 * nothing is expanded, and cbc_essiv refuses the call as it refuses the raw key. The schedules
 * are cleansed by wipe() and on deallocation, and never shown (no repr of the bytes, no
 * pickling). */
typedef struct {
    PyObject_HEAD
#if X86_PATHS
    AesSchedule schedules[2]; /* data, salt */
#endif
    int wiped;
    int busy; /* calls running on the schedules without the GIL */
} EssivKeyObject;

static PyTypeObject EssivKeyType;

static void essiv_key_cleanse(EssivKeyObject *self)
{
    OPENSSL_cleanse((uint8_t *)self + sizeof(PyObject),
                    sizeof(EssivKeyObject) - sizeof(PyObject));
}

static PyObject *essiv_key_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    Py_buffer key, salt;
    if (refuse_keywords("EssivKey", kwargs) ||
        !PyArg_ParseTuple(args, "y*y*:EssivKey", &key, &salt))
        return NULL;
    EssivKeyObject *self = NULL;
    if (!aes_key_size(key.len)) {
        PyErr_SetString(PyExc_ValueError, "key must be 16, 24 or 32 bytes");
    } else if (!aes_key_size(salt.len)) {
        PyErr_SetString(PyExc_ValueError, "salt must be 16, 24 or 32 bytes");
    } else if ((self = (EssivKeyObject *)type->tp_alloc(type, 0)) != NULL) {
#if X86_PATHS
        if (runnable_paths & 1u << PATH_AESNI) {
            aes_schedule(&self->schedules[0], key.buf, (int)key.len);
            aes_schedule(&self->schedules[1], salt.buf, (int)salt.len);
        }
#endif
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&salt);
    return (PyObject *)self;
}

static void essiv_key_dealloc(EssivKeyObject *self)
{
    essiv_key_cleanse(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(essiv_key_wipe_doc, "wipe()\n--\n\n"
                                 "Cleanse the schedules now, once the calls running on them in\n"
                                 "other threads have ended (it waits for them); later calls\n"
                                 "that use this key raise ValueError.");

static PyObject *essiv_key_wipe(EssivKeyObject *self, PyObject *unused)
{
    self->wiped = 1; /* refuses new calls while the running ones end */
    wait_until_idle(&self->busy);
    essiv_key_cleanse(self);
    self->wiped = 1;
    Py_RETURN_NONE;
}

static PyMethodDef essiv_key_methods[] = {
    {"wipe", (PyCFunction)essiv_key_wipe, METH_NOARGS, essiv_key_wipe_doc},
    {NULL, NULL, 0, NULL},
};

PyDoc_STRVAR(essiv_key_doc,
             "EssivKey(key, salt)\n--\n\n"
             "An aes-cbc-essiv key (16, 24 or 32 bytes) and its essiv salt (16, 24 or 32 bytes)\n"
             "with their AES key schedules expanded once, for cbc_essiv. Keeps no copy of\n"
             "either; cleansed by wipe() and when collected.");

static PyTypeObject EssivKeyType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "app._native.EssivKey",
    .tp_basicsize = sizeof(EssivKeyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = essiv_key_doc,
    .tp_new = essiv_key_new,
    .tp_dealloc = (destructor)essiv_key_dealloc,
    .tp_methods = essiv_key_methods,
};

/* AES-XTS of src into dst with the tweaks ivs (16 bytes per unit, ivs_len of them), with the
 * raw key (key_len bytes) or, when schedules is not NULL, its expanded data and tweak
 * schedules, whose key object's busy count is busy; the caller releases the buffers. */
static PyObject *xts_with_ivs(Py_buffer *dst_view, Py_buffer *src_view, const uint8_t *iv_bytes,
                              Py_ssize_t ivs_len, const uint8_t *key_bytes, Py_ssize_t key_len,
                              const void *schedules, int *busy, Py_ssize_t unit_bytes,
                              int encrypt)
{
    Py_buffer dst = *dst_view, src = *src_view;
#if !X86_PATHS
    (void)schedules;
    (void)busy;
#endif
    struct {
        const uint8_t *buf;
        Py_ssize_t len;
    } key = {key_bytes, key_len};
    PyObject *result = NULL;
    XtsJob job = {NULL, NULL, NULL, NULL, 0, 0};
    const EVP_CIPHER *cipher = aes_ecb(key.len / 2);
    if (key.len % 2 || cipher == NULL) {
        PyErr_SetString(PyExc_ValueError, "key must be 32, 48 or 64 bytes");
        goto done;
    }
    if (unit_bytes <= 0 || unit_bytes % 16 || unit_bytes > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "unit_bytes must be a multiple of 16, at most 1 MiB");
        goto done;
    }
    if (dst.len != src.len || src.len % unit_bytes) {
        PyErr_SetString(PyExc_ValueError, "dst and src must be the same whole number of units");
        goto done;
    }
    if (ivs_len < 16 * (src.len / unit_bytes)) {
        PyErr_SetString(PyExc_ValueError, "ivs needs 16 bytes per data unit");
        goto done;
    }
#if X86_PATHS
    Path path = current_path;
    if (path != PATH_OPENSSL && key.len != 48) {
        const AesSchedule *given = schedules;
        AesSchedule made[2];
        if (given == NULL) {
            aes_schedule(&made[0], key.buf, (int)key.len / 2);
            aes_schedule(&made[1], key.buf + key.len / 2, (int)key.len / 2);
        }
        const AesSchedule *use = given != NULL ? given : made;
        RUN_RELEASING_ABOVE(src.len, given != NULL ? busy : NULL,
                            xts_kernels[path](&use[0], &use[1], dst.buf, src.buf, iv_bytes,
                                              (size_t)src.len, (size_t)unit_bytes, encrypt));
        if (given == NULL)
            OPENSSL_cleanse(made, sizeof made);
        result = Py_NewRef(Py_None);
        goto done;
    }
#endif
    job.chunk = unit_bytes >= XTS_CHUNK ? unit_bytes : XTS_CHUNK / unit_bytes * unit_bytes;
    job.data = EVP_CIPHER_CTX_new();
    job.tweak = EVP_CIPHER_CTX_new();
    /* One first tweak per unit of a chunk, plus the block of slack EVP_EncryptUpdate asks for. */
    job.first_bytes = 16 * (job.chunk / unit_bytes) + 16;
    job.tweaks = PyMem_Malloc((size_t)job.chunk);
    job.first = PyMem_Malloc((size_t)job.first_bytes);
    if (job.data == NULL || job.tweak == NULL || job.tweaks == NULL || job.first == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const uint8_t *k = key.buf;
    if (!EVP_CipherInit_ex(job.data, cipher, NULL, k, NULL, encrypt) ||
        !EVP_EncryptInit_ex(job.tweak, cipher, NULL, k + key.len / 2, NULL) ||
        !EVP_CIPHER_CTX_set_padding(job.data, 0) || !EVP_CIPHER_CTX_set_padding(job.tweak, 0)) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL refused the AES-ECB context");
        goto done;
    }
    int failed;
    RUN_RELEASING_ABOVE(src.len, NULL,
                        failed = xts_run(&job, dst.buf, src.buf, iv_bytes, src.len, unit_bytes));
    if (failed)
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL AES-ECB failed");
    else
        result = Py_NewRef(Py_None);
done:
    /* The buffers hold tweaks, which are the tweak key's output: wiped like the contexts. */
    if (job.tweaks != NULL) {
        OPENSSL_cleanse(job.tweaks, (size_t)job.chunk);
        PyMem_Free(job.tweaks);
    }
    if (job.first != NULL) {
        OPENSSL_cleanse(job.first, (size_t)job.first_bytes);
        PyMem_Free(job.first);
    }
    EVP_CIPHER_CTX_free(job.data);
    EVP_CIPHER_CTX_free(job.tweak);
    return result;
}

static PyObject *native_xts(PyObject *module, PyObject *args)
{
    Py_buffer dst, src, ivs, key;
    Py_ssize_t unit_bytes;
    int encrypt;
    if (!PyArg_ParseTuple(args, "w*y*y*y*np:xts", &dst, &src, &ivs, &key, &unit_bytes, &encrypt))
        return NULL;
    PyObject *result = xts_with_ivs(&dst, &src, ivs.buf, ivs.len, key.buf, key.len, NULL, NULL,
                                    unit_bytes, encrypt);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    PyBuffer_Release(&ivs);
    PyBuffer_Release(&key);
    return result;
}

/* METH_FASTCALL arguments, converted as PyArg_ParseTuple's codes would, with its errors: the
 * per-request calls skip building an argument tuple and interpreting a format string. Each
 * returns 0 with an exception set on failure. */

static int positional_count(const char *function, Py_ssize_t nargs, Py_ssize_t wanted)
{
    if (nargs == wanted)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd arguments (%zd given)", function,
                 wanted, nargs);
    return 0;
}

static void argument_type_error(const char *function, int number, const char *wanted,
                                PyObject *arg)
{
    PyErr_Format(PyExc_TypeError, "%s() argument %d must be %s, not %.50s", function, number,
                 wanted, arg == Py_None ? "None" : Py_TYPE(arg)->tp_name);
}

/* Codes w* (writable) and y*: a C-contiguous buffer; view->obj is NULL unless it is held. */
static int buffer_argument(const char *function, int number, PyObject *arg, Py_buffer *view,
                           int writable)
{
    if (PyObject_GetBuffer(arg, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        view->obj = NULL;
        if (writable) {
            PyErr_Clear();
            argument_type_error(function, number, "read-write bytes-like object", arg);
        }
        return 0;
    }
    if (!PyBuffer_IsContiguous(view, 'C')) {
        PyBuffer_Release(view);
        view->obj = NULL;
        argument_type_error(function, number, "contiguous buffer", arg);
        return 0;
    }
    return 1;
}

/* Code K: an int, taken mod 2^64. */
static int u64_argument(const char *function, int number, PyObject *arg, unsigned long long *out)
{
    if (!PyLong_Check(arg)) {
        argument_type_error(function, number, "int", arg);
        return 0;
    }
    *out = PyLong_AsUnsignedLongLongMask(arg);
    return !(*out == (unsigned long long)-1 && PyErr_Occurred());
}

/* Code n: anything with __index__ that fits a Py_ssize_t. */
static int ssize_argument(PyObject *arg, Py_ssize_t *out)
{
    PyObject *index = PyNumber_Index(arg);
    if (index == NULL)
        return 0;
    *out = PyLong_AsSsize_t(index);
    Py_DECREF(index);
    return !(*out == -1 && PyErr_Occurred());
}

/* Code p: truth. */
static int bool_argument(PyObject *arg, int *out)
{
    *out = PyObject_IsTrue(arg);
    return *out >= 0;
}

/* xts_plain64's and cbc_essiv's arguments but their keys: dst, src, the IVs' first sector and
 * step (arguments 1 to 4), and unit_bytes and encrypt (the last two). */
typedef struct {
    Py_buffer dst, src;
    unsigned long long iv_sector, iv_step;
    Py_ssize_t unit_bytes;
    int encrypt;
} SectorCall;

/* Converts them from `wanted` arguments, in order, as PyArg_ParseTuple's w* y* K K ... n p
 * would; on failure 0 with the exception set. The buffers are the caller's to release
 * (PyBuffer_Release reads only obj): obj stays NULL where not held, as the caller sets it
 * first. Inlined: a call would add instructions to every request. */
static inline __attribute__((always_inline)) int sector_call_arguments(
    const char *function, PyObject *const *args, Py_ssize_t nargs, Py_ssize_t wanted,
    SectorCall *call)
{
    return positional_count(function, nargs, wanted) &&
           buffer_argument(function, 1, args[0], &call->dst, 1) &&
           buffer_argument(function, 2, args[1], &call->src, 0) &&
           u64_argument(function, 3, args[2], &call->iv_sector) &&
           u64_argument(function, 4, args[3], &call->iv_step) &&
           ssize_argument(args[wanted - 2], &call->unit_bytes) &&
           bool_argument(args[wanted - 1], &call->encrypt);
}

PyDoc_STRVAR(xts_plain64_doc,
             "xts_plain64(dst, src, iv_sector, iv_step, key, unit_bytes, encrypt)\n--\n\n"
             "xts() with dm-crypt's plain64 IVs made here: unit u's tweak is the le64 of\n"
             "iv_sector + u * iv_step (mod 2^64), zero padded to 16 bytes. A small request\n"
             "skips building the IV array in numpy. key is the raw key, as for xts(), or an\n"
             "XtsKey, whose schedules are not expanded again.");

static PyObject *native_xts_plain64(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char name[] = "xts_plain64";
    SectorCall call;
    Py_buffer key = {0};
    PyObject *result = NULL;
    uint8_t small[16 * 16];
    uint8_t *ivs = small;
    Py_ssize_t units = 0;
    call.dst.obj = call.src.obj = NULL;
    if (!sector_call_arguments(name, args, nargs, 7, &call))
        goto done;
    PyObject *key_object = args[4];
    XtsKeyObject *xts_key = NULL;
    if (Py_IS_TYPE(key_object, &XtsKeyType)) {
        xts_key = (XtsKeyObject *)key_object;
        if (xts_key->key_len == 0) {
            PyErr_SetString(PyExc_ValueError, "the key was wiped");
            goto done;
        }
    } else if (PyObject_GetBuffer(key_object, &key, PyBUF_SIMPLE) < 0) {
        goto done;
    }
    if (call.unit_bytes <= 0 || call.unit_bytes % 16 || call.unit_bytes > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "unit_bytes must be a multiple of 16, at most 1 MiB");
        goto done;
    }
    units = call.src.len / call.unit_bytes;
    if (units > 16 && (ivs = PyMem_Malloc((size_t)(16 * units))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    uint64_t sector = call.iv_sector;
    for (Py_ssize_t u = 0; u < units; u++, sector += call.iv_step) {
        store_le64(ivs + 16 * u, sector);
        store_le64(ivs + 16 * u + 8, 0);
    }
    const uint8_t *key_bytes = key.buf;
    Py_ssize_t key_len = key.len;
    const void *schedules = NULL;
    int *busy = NULL;
    if (xts_key != NULL) {
        key_bytes = xts_key->key;
        key_len = xts_key->key_len;
#if X86_PATHS
        if (xts_key->expanded)
            schedules = xts_key->schedules;
        busy = &xts_key->busy;
#endif
    }
    result = xts_with_ivs(&call.dst, &call.src, ivs, 16 * units, key_bytes, key_len, schedules,
                          busy, call.unit_bytes, call.encrypt);
done:
    if (ivs != small)
        PyMem_Free(ivs);
    PyBuffer_Release(&call.dst);
    PyBuffer_Release(&call.src);
    if (key.obj != NULL)
        PyBuffer_Release(&key);
    return result;
}

PyDoc_STRVAR(essiv_doc,
             "essiv(dst, sectors, salt)\n--\n\n"
             "dm-crypt's essiv IVs with AES: dst[u] = AES_salt(le64 of sectors[u], zero padded\n"
             "to 16 bytes), sectors native uint64, salt 16, 24 or 32 bytes. One pass and one\n"
             "OpenSSL ECB call, instead of numpy building the plain64 blocks and copying them.");

static PyObject *native_essiv(PyObject *module, PyObject *args)
{
    Py_buffer dst, sectors, salt;
    PyObject *result = NULL;
    EVP_CIPHER_CTX *context = NULL;
    if (!PyArg_ParseTuple(args, "w*y*y*:essiv", &dst, &sectors, &salt))
        return NULL;
    const EVP_CIPHER *cipher = aes_ecb(salt.len);
    Py_ssize_t units = sectors.len / 8;
    int written;
    if (cipher == NULL) {
        PyErr_SetString(PyExc_ValueError, "salt must be 16, 24 or 32 bytes");
    } else if (sectors.len % 8 || dst.len != 16 * units) {
        PyErr_SetString(PyExc_ValueError, "dst needs 16 bytes per 8-byte sector");
    } else if (units > INT_MAX / 16) {
        PyErr_SetString(PyExc_ValueError, "too many sectors for one call");
    } else if ((context = EVP_CIPHER_CTX_new()) == NULL) {
        PyErr_NoMemory();
    } else if (!EVP_EncryptInit_ex(context, cipher, NULL, salt.buf, NULL) ||
               !EVP_CIPHER_CTX_set_padding(context, 0)) {
        PyErr_SetString(PyExc_RuntimeError, "OpenSSL refused the AES-ECB context");
    } else {
        uint8_t *out = dst.buf;
        const uint8_t *in = sectors.buf;
        for (Py_ssize_t u = 0; u < units; u++) {
            uint64_t sector;
            memcpy(&sector, in + 8 * u, 8);
            store_le64(out + 16 * u, sector);
            store_le64(out + 16 * u + 8, 0);
        }
        /* In place: with padding off and whole blocks, OpenSSL writes exactly what it reads. */
        if (units && !EVP_EncryptUpdate(context, out, &written, out, (int)(16 * units)))
            PyErr_SetString(PyExc_RuntimeError, "OpenSSL AES-ECB failed");
        else
            result = Py_NewRef(Py_None);
    }
    EVP_CIPHER_CTX_free(context);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&sectors);
    PyBuffer_Release(&salt);
    return result;
}

/* Why cbc_encrypt's, cbc_decrypt's or cbc_essiv's arguments other than the key are refused, or
 * NULL; ivs NULL when the call makes its own. */
static const char *cbc_arguments_problem(const Py_buffer *dst, const Py_buffer *src,
                                         const Py_buffer *ivs, Py_ssize_t unit_bytes)
{
    if (unit_bytes <= 0 || unit_bytes % 16)
        return "unit_bytes must be a positive multiple of 16";
    if (dst->len != src->len || src->len % unit_bytes)
        return "dst and src must be the same whole number of units";
    if (ivs != NULL && ivs->len < 16 * (src->len / unit_bytes))
        return "ivs needs 16 bytes per data unit";
    return NULL;
}

/* Whether a CBC call is refused, its exception set: ValueError for the arguments' problem
 * (NULL if none), RuntimeError on the openssl path, which has no CBC lanes. */
static int cbc_refused(const char *problem, Path path)
{
    if (problem != NULL) {
        PyErr_SetString(PyExc_ValueError, problem);
        return 1;
    }
    if (path == PATH_OPENSSL) {
        PyErr_SetString(PyExc_RuntimeError, "AES-CBC lanes need AES instructions: the current "
                                            "path is openssl");
        return 1;
    }
    return 0;
}

/* cbc_encrypt and cbc_decrypt: parse, check, run the current path's kernel. */
static PyObject *cbc_call(PyObject *args, const char *format, int encrypt)
{
    Py_buffer dst, src, ivs, key;
    Py_ssize_t unit_bytes;
    PyObject *result = NULL;
    Path path = current_path;
    if (!PyArg_ParseTuple(args, format, &dst, &src, &ivs, &key, &unit_bytes))
        return NULL;
    const char *problem = aes_key_size(key.len) ? cbc_arguments_problem(&dst, &src, &ivs, unit_bytes)
                                                : "key must be 16, 24 or 32 bytes";
    if (!cbc_refused(problem, path)) {
#if X86_PATHS
        AesSchedule schedule;
        CbcKernel kernel = encrypt ? cbc_encrypt_kernels[path] : cbc_decrypt_kernels[path];
        aes_schedule(&schedule, key.buf, (int)key.len);
        RUN_RELEASING_ABOVE(src.len, NULL,
                            kernel(&schedule, dst.buf, src.buf, ivs.buf,
                                   (size_t)(src.len / unit_bytes), (size_t)unit_bytes));
        OPENSSL_cleanse(&schedule, sizeof schedule);
#endif
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    PyBuffer_Release(&ivs);
    PyBuffer_Release(&key);
    return result;
}

/* cbc_encrypt's and cbc_decrypt's docstrings: one contract, two directions. */
#define CBC_DOC(name, direction, how)                                                          \
    name "(dst, src, ivs, key, unit_bytes)\n--\n\n"                                            \
         "AES-CBC " direction " of src into dst (which may be src, or must not overlap it),\n"  \
         "data unit by data unit: unit u starts from the 16-byte IV ivs[u]; key is 16, 24\n"    \
         "or 32 bytes. " how "On the current path (path()); on the openssl path the call\n"     \
         "raises RuntimeError."

PyDoc_STRVAR(cbc_encrypt_doc,
             CBC_DOC("cbc_encrypt", "encryption", "Many units at once in parallel lanes.\n"));

static PyObject *native_cbc_encrypt(PyObject *module, PyObject *args)
{
    return cbc_call(args, "w*y*y*y*n:cbc_encrypt", 1);
}

PyDoc_STRVAR(cbc_decrypt_doc, CBC_DOC("cbc_decrypt", "decryption", ""));

static PyObject *native_cbc_decrypt(PyObject *module, PyObject *args)
{
    return cbc_call(args, "w*y*y*y*n:cbc_decrypt", 0);
}

PyDoc_STRVAR(cbc_essiv_doc,
             "cbc_essiv(dst, src, iv_sector, iv_step, key, salt, unit_bytes, encrypt)\n--\n\n"
             "cbc_encrypt() or cbc_decrypt() with dm-crypt's essiv IVs made here: unit u's IV\n"
             "is AES_salt(le64 of iv_sector + u * iv_step (mod 2^64), zero padded to 16\n"
             "bytes), salt 16, 24 or 32 bytes. One call per request: no IV array, no numpy.\n"
             "key may be an EssivKey, whose schedules are not expanded again; salt is then\n"
             "None. On the openssl path the call raises RuntimeError.");

static PyObject *native_cbc_essiv(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    static const char name[] = "cbc_essiv";
    SectorCall call;
    Py_buffer key = {0}, salt = {0};
    PyObject *result = NULL;
    Path path = current_path;
    call.dst.obj = call.src.obj = NULL;
    if (!sector_call_arguments(name, args, nargs, 8, &call))
        goto done;
    PyObject *key_object = args[4], *salt_object = args[5];
    EssivKeyObject *essiv_key = NULL;
    const char *problem;
    if (Py_IS_TYPE(key_object, &EssivKeyType)) {
        essiv_key = (EssivKeyObject *)key_object;
        if (salt_object != Py_None) {
            PyErr_SetString(PyExc_TypeError, "an EssivKey holds its salt: salt must be None");
            goto done;
        }
        if (essiv_key->wiped) {
            PyErr_SetString(PyExc_ValueError, "the key was wiped");
            goto done;
        }
        problem = cbc_arguments_problem(&call.dst, &call.src, NULL, call.unit_bytes);
    } else {
        if (PyObject_GetBuffer(key_object, &key, PyBUF_SIMPLE) < 0 ||
            PyObject_GetBuffer(salt_object, &salt, PyBUF_SIMPLE) < 0)
            goto done;
        problem = !aes_key_size(key.len)    ? "key must be 16, 24 or 32 bytes"
                  : !aes_key_size(salt.len) ? "salt must be 16, 24 or 32 bytes"
                                            : cbc_arguments_problem(&call.dst, &call.src, NULL,
                                                                    call.unit_bytes);
    }
    if (!cbc_refused(problem, path)) {
#if X86_PATHS
        AesSchedule made[2];
        if (essiv_key == NULL) {
            aes_schedule(&made[0], key.buf, (int)key.len);
            aes_schedule(&made[1], salt.buf, (int)salt.len);
        }
        const AesSchedule *use = essiv_key != NULL ? essiv_key->schedules : made;
        RUN_RELEASING_ABOVE(call.src.len, essiv_key != NULL ? &essiv_key->busy : NULL,
                            cbc_essiv_run(path, &use[0], &use[1], call.dst.buf, call.src.buf,
                                          call.iv_sector, call.iv_step,
                                          (size_t)(call.src.len / call.unit_bytes),
                                          (size_t)call.unit_bytes, call.encrypt));
        if (essiv_key == NULL)
            OPENSSL_cleanse(made, sizeof made);
#endif
        result = Py_NewRef(Py_None);
    }
done:
    PyBuffer_Release(&call.dst);
    PyBuffer_Release(&call.src);
    if (key.obj != NULL)
        PyBuffer_Release(&key);
    if (salt.obj != NULL)
        PyBuffer_Release(&salt);
    return result;
}

/* After a transfer loop ran without the GIL: 1 to retry (EINTR, once signal handlers have
 * run), -1 with OSError set (or a handler's exception), 0 when done. */
static int after_transfer(int error)
{
    if (error == EINTR)
        return PyErr_CheckSignals() < 0 ? -1 : 1;
    if (error) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

/* A request's segments as an iovec array, neighbours in memory merged and empty ones
   dropped; the buffers stay held (views) until release_segments. */
typedef struct {
    Py_buffer *views;
    Py_ssize_t held;
    struct iovec *iov;
    size_t count;
    size_t bytes;
} Segments;

static void release_segments(Segments *segments)
{
    for (Py_ssize_t i = 0; i < segments->held; i++)
        PyBuffer_Release(&segments->views[i]);
    PyMem_Free(segments->views);
    PyMem_Free(segments->iov);
}

/* Hold every buffer of the sequence and fill segments; then check that offset + bytes
   does not pass end (check_range's ValueError). 0, or -1 with an exception set. */
static int hold_segments(PyObject *buffers, long long offset, long long end, int writable,
                         Segments *segments)
{
    *segments = (Segments){0};
    PyObject *fast = PySequence_Fast(buffers, "buffers must be a sequence");
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    segments->views = PyMem_Calloc((size_t)n + 1, sizeof(Py_buffer));
    segments->iov = PyMem_Calloc((size_t)n + 1, sizeof(struct iovec));
    if (segments->views == NULL || segments->iov == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    int flags = writable ? PyBUF_WRITABLE : PyBUF_SIMPLE;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer *view = &segments->views[i];
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, i), view, flags) < 0) {
            Py_DECREF(fast);
            return -1;
        }
        segments->held++;
        if (view->len == 0)
            continue;
        struct iovec *last = segments->count ? &segments->iov[segments->count - 1] : NULL;
        if (last != NULL && (char *)last->iov_base + last->iov_len == view->buf) {
            last->iov_len += (size_t)view->len;
        } else {
            segments->iov[segments->count].iov_base = view->buf;
            segments->iov[segments->count].iov_len = (size_t)view->len;
            segments->count++;
        }
        segments->bytes += (size_t)view->len;
    }
    Py_DECREF(fast);
    if (offset < 0 || (long long)segments->bytes > end - offset) {
        PyErr_Format(PyExc_ValueError, "range %lld+%zu is outside the device (%lld bytes)", offset,
                     segments->bytes, end);
        return -1;
    }
    return 0;
}

/* Write or read iov[*first..count) at *offset, at most chunk bytes and IOV_MAX entries per
   system call, advancing *first, the entry it names and *offset past what was done. Stops
   at the end (0), an error (its errno) or, reading, end of file (-1). */
static int transfer(int fd, struct iovec *iov, size_t count, size_t *first, long long *offset,
                    size_t chunk, int write)
{
    size_t i = *first;
    while (i < count) {
        size_t left = chunk, j = i;
        while (j < count && j - i < IOV_MAX && left > iov[j].iov_len)
            left -= iov[j++].iov_len;
        size_t cut = 0, entries = j - i;
        if (j < count && entries < IOV_MAX) { /* entry j ends the piece, whole or in part */
            cut = iov[j].iov_len;
            iov[j].iov_len = left;
            entries++;
        }
        ssize_t done;
        if (entries == 1)
            done = write ? pwrite(fd, iov[i].iov_base, iov[i].iov_len, (off_t)*offset)
                         : pread(fd, iov[i].iov_base, iov[i].iov_len, (off_t)*offset);
        else
            done = write ? pwritev(fd, &iov[i], (int)entries, (off_t)*offset)
                         : preadv(fd, &iov[i], (int)entries, (off_t)*offset);
        if (cut)
            iov[j].iov_len = cut;
        if (done < 0 || (done == 0 && write)) {
            *first = i;
            return done < 0 ? errno : EIO;
        }
        if (done == 0) {
            *first = i;
            return -1;
        }
        *offset += done;
        size_t rest = (size_t)done;
        while (i < count && rest >= iov[i].iov_len)
            rest -= iov[i++].iov_len;
        if (rest) {
            iov[i].iov_base = (char *)iov[i].iov_base + rest;
            iov[i].iov_len -= rest;
        }
    }
    *first = i;
    return 0;
}

/* pwritev_chunks and preadv_into: hold the segments, then transfer them under one release
   of the GIL (again after EINTR, once signal handlers have run); reads past the end of the
   file leave zeros. */
static PyObject *vector_call(int fd, PyObject *buffers, long long offset, long long end,
                             Py_ssize_t chunk, int write)
{
    Segments segments;
    PyObject *result = NULL;
    if (hold_segments(buffers, offset, end, !write, &segments) < 0)
        goto done;
    size_t first = 0;
    while (first < segments.count) {
        int error;
        Py_BEGIN_ALLOW_THREADS
        error = transfer(fd, segments.iov, segments.count, &first, &offset, (size_t)chunk, write);
        if (error == -1) {
            for (size_t i = first; i < segments.count; i++)
                memset(segments.iov[i].iov_base, 0, segments.iov[i].iov_len);
            first = segments.count;
            error = 0;
        }
        Py_END_ALLOW_THREADS
        int next = after_transfer(error);
        if (next < 0)
            goto done;
        if (next)
            continue;
    }
    result = Py_NewRef(Py_None);
done:
    release_segments(&segments);
    return result;
}

PyDoc_STRVAR(pwritev_chunks_doc,
             "pwritev_chunks(fd, buffers, offset, chunk, end)\n--\n\n"
             "Write the buffers one after another to fd from offset, at most chunk bytes per\n"
             "system call (pieces span buffers; pwrite(2) for a piece of one, else pwritev(2)),\n"
             "buffers adjacent in memory written as one. ValueError, writing nothing, if the\n"
             "range passes end.");

/* Codes i and L: anything with __index__ that fits an int or a long long. */
static int fd_argument(PyObject *arg, int *out)
{
    Py_ssize_t value;
    if (!ssize_argument(arg, &value))
        return 0;
    if (value < INT_MIN || value > INT_MAX) {
        PyErr_SetString(PyExc_OverflowError, "fd does not fit a C int");
        return 0;
    }
    *out = (int)value;
    return 1;
}

static int longlong_argument(PyObject *arg, long long *out)
{
    PyObject *index = PyNumber_Index(arg);
    if (index == NULL)
        return 0;
    *out = PyLong_AsLongLong(index);
    Py_DECREF(index);
    return !(*out == -1 && PyErr_Occurred());
}

static PyObject *native_pwritev_chunks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int fd;
    long long offset, end;
    Py_ssize_t chunk;
    if (!positional_count("pwritev_chunks", nargs, 5) || !fd_argument(args[0], &fd) ||
        !longlong_argument(args[2], &offset) || !ssize_argument(args[3], &chunk) ||
        !longlong_argument(args[4], &end))
        return NULL;
    PyObject *buffers = args[1];
    if (chunk <= 0) {
        PyErr_SetString(PyExc_ValueError, "chunk must be positive");
        return NULL;
    }
    return vector_call(fd, buffers, offset, end, chunk, 1);
}

PyDoc_STRVAR(preadv_into_doc,
             "preadv_into(fd, buffers, offset, end)\n--\n\n"
             "Fill the writable buffers one after another from fd at offset, preadv(2) until\n"
             "done (retrying short reads and EINTR); what lies past the end of the file reads\n"
             "as zeros. ValueError, reading nothing, if the range passes end. The GIL is\n"
             "released for the whole loop.");

static PyObject *native_preadv_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    int fd;
    long long offset, end;
    if (!positional_count("preadv_into", nargs, 4) || !fd_argument(args[0], &fd) ||
        !longlong_argument(args[2], &offset) || !longlong_argument(args[3], &end))
        return NULL;
    return vector_call(fd, args[1], offset, end, SSIZE_MAX, 0);
}

/* librbd's aio calls, reached through the addresses rbd_bind was given (the library is
   loaded by ctypes, not linked): a request is started in one call and a batch's
   completions are collected under one release of the GIL. */
typedef struct {
    int (*create_completion)(void *arg, void *callback, void **completion);
    int (*aio_readv)(void *image, const struct iovec *iov, int count, uint64_t offset,
                     void *completion);
    int (*aio_writev)(void *image, const struct iovec *iov, int count, uint64_t offset,
                      void *completion);
    int (*is_complete)(void *completion);
    int (*wait_for_complete)(void *completion);
    ssize_t (*get_return_value)(void *completion);
    void (*release)(void *completion);
} RbdCalls;

static RbdCalls rbd_calls;

PyDoc_STRVAR(rbd_bind_doc,
             "rbd_bind(create_completion, aio_readv, aio_writev, is_complete,\n"
             "         wait_for_complete, get_return_value, release)\n--\n\n"
             "The addresses of librbd's rbd_aio_create_completion, rbd_aio_readv,\n"
             "rbd_aio_writev, rbd_aio_is_complete, rbd_aio_wait_for_complete,\n"
             "rbd_aio_get_return_value and rbd_aio_release, which rbd_aio_start and\n"
             "rbd_collect call.");

static PyObject *native_rbd_bind(PyObject *module, PyObject *args)
{
    unsigned long long address[7];
    if (!PyArg_ParseTuple(args, "KKKKKKK:rbd_bind", &address[0], &address[1], &address[2],
                          &address[3], &address[4], &address[5], &address[6]))
        return NULL;
    for (int i = 0; i < 7; i++) {
        if (address[i] == 0) {
            PyErr_SetString(PyExc_ValueError, "a librbd function's address is 0");
            return NULL;
        }
    }
    rbd_calls.create_completion = (void *)(uintptr_t)address[0];
    rbd_calls.aio_readv = (void *)(uintptr_t)address[1];
    rbd_calls.aio_writev = (void *)(uintptr_t)address[2];
    rbd_calls.is_complete = (void *)(uintptr_t)address[3];
    rbd_calls.wait_for_complete = (void *)(uintptr_t)address[4];
    rbd_calls.get_return_value = (void *)(uintptr_t)address[5];
    rbd_calls.release = (void *)(uintptr_t)address[6];
    Py_RETURN_NONE;
}

/* RbdAio: one started request. A read holds its segments (librbd fills them, and scatters
   by the iovec array, at the end) until it is collected; a write's are let go at once
   (librbd has copied them). */
typedef struct {
    PyObject_HEAD
    void *completion; /* NULL once collected */
    Py_ssize_t code;  /* librbd's return value, once collected */
    Py_ssize_t length;
    Segments segments;
} RbdAioObject;

static PyTypeObject RbdAioType;

static void rbd_aio_dealloc(RbdAioObject *self)
{
    void *completion = self->completion;
    if (completion != NULL) { /* never collected: librbd may still fill the segments */
        Py_BEGIN_ALLOW_THREADS
        rbd_calls.wait_for_complete(completion);
        rbd_calls.release(completion);
        Py_END_ALLOW_THREADS
    }
    release_segments(&self->segments);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *rbd_aio_get_code(RbdAioObject *self, void *closure)
{
    if (self->completion != NULL)
        Py_RETURN_NONE;
    return PyLong_FromSsize_t(self->code);
}

static PyObject *rbd_aio_get_length(RbdAioObject *self, void *closure)
{
    return PyLong_FromSsize_t(self->length);
}

static PyGetSetDef rbd_aio_getset[] = {
    {"code", (getter)rbd_aio_get_code, NULL,
     "librbd's return value (bytes, or a negative errno); None until collected.", NULL},
    {"length", (getter)rbd_aio_get_length, NULL, "The request's bytes.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RbdAioType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "app._native.RbdAio",
    .tp_basicsize = sizeof(RbdAioObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One librbd aio request, started by rbd_aio_start; collected by rbd_collect (or\n"
              "waited for when it is freed uncollected).",
    .tp_dealloc = (destructor)rbd_aio_dealloc,
    .tp_getset = rbd_aio_getset,
};

PyDoc_STRVAR(rbd_aio_start_doc,
             "rbd_aio_start(image, offset, buffers, end, write)\n--\n\n"
             "Start one librbd aio read into (or write of) the buffers at offset of the image\n"
             "(an rbd_image_t's address), adjacent buffers as one iovec entry: an RbdAio.\n"
             "ValueError, starting nothing, if the range passes end; OSError with librbd's\n"
             "errno if librbd refuses the request.");

static PyObject *native_rbd_aio_start(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (!positional_count("rbd_aio_start", nargs, 5))
        return NULL;
    void *image = PyLong_AsVoidPtr(args[0]);
    long long offset = PyLong_AsLongLong(args[1]);
    long long end = PyLong_AsLongLong(args[3]);
    int write = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred() || write < 0)
        return NULL;
    if (rbd_calls.release == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "rbd_bind was not called");
        return NULL;
    }
    RbdAioObject *self = PyObject_New(RbdAioObject, &RbdAioType);
    if (self == NULL)
        return NULL;
    self->completion = NULL;
    self->code = 0;
    if (hold_segments(args[2], offset, end, !write, &self->segments) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    self->length = (Py_ssize_t)self->segments.bytes;
    void *completion = NULL;
    int code = rbd_calls.create_completion(NULL, NULL, &completion);
    if (code >= 0) {
        int count = (int)self->segments.count;
        if (count == 0) /* an empty request: librbd wants one (empty) entry */
            count = 1;
        Py_BEGIN_ALLOW_THREADS
        code = (write ? rbd_calls.aio_writev : rbd_calls.aio_readv)(
            image, self->segments.iov, count, (uint64_t)offset, completion);
        Py_END_ALLOW_THREADS
        if (code < 0)
            rbd_calls.release(completion);
        else
            self->completion = completion;
    }
    if (write || code < 0) {
        release_segments(&self->segments);
        self->segments = (Segments){0};
    }
    if (code < 0) {
        Py_DECREF(self);
        errno = -code;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return (PyObject *)self;
}

PyDoc_STRVAR(rbd_collect_doc,
             "rbd_collect(aios)\n--\n\n"
             "Wait for every RbdAio of the list not yet collected, newest first, under one\n"
             "release of the GIL (none if all are complete), keep each return value (its\n"
             "code) and release its completion. One caller at a time per RbdAio.");

static PyObject *native_rbd_collect(PyObject *module, PyObject *arg)
{
    PyObject *fast = PySequence_Fast(arg, "aios must be a sequence");
    if (fast == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), pending = 0;
    RbdAioObject **aios = PyMem_Malloc(((size_t)n + 1) * sizeof(*aios));
    void **completions = PyMem_Malloc(((size_t)n + 1) * sizeof(*completions));
    ssize_t *codes = PyMem_Malloc(((size_t)n + 1) * sizeof(*codes));
    if (aios == NULL || completions == NULL || codes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        if (!Py_IS_TYPE(item, &RbdAioType)) {
            PyErr_SetString(PyExc_TypeError, "rbd_collect takes RbdAio objects");
            goto done;
        }
        RbdAioObject *aio = (RbdAioObject *)item;
        if (aio->completion == NULL)
            continue;
        aios[pending] = (RbdAioObject *)Py_NewRef(item);
        completions[pending++] = aio->completion;
    }
    /* The GIL is let go only to sleep: taking it back can wait behind the thread that
       took it meanwhile. */
    int all_complete = 1;
    for (Py_ssize_t i = 0; i < pending && all_complete; i++)
        all_complete = rbd_calls.is_complete(completions[i]);
    if (!all_complete) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < pending; i++)
            rbd_calls.wait_for_complete(completions[i]);
        Py_END_ALLOW_THREADS
    }
    for (Py_ssize_t i = 0; i < pending; i++) {
        codes[i] = rbd_calls.get_return_value(completions[i]);
        rbd_calls.release(completions[i]);
    }
    for (Py_ssize_t i = 0; i < pending; i++) {
        RbdAioObject *aio = aios[i];
        aio->code = codes[i];
        aio->completion = NULL;
        release_segments(&aio->segments);
        aio->segments = (Segments){0};
        Py_DECREF(aio);
    }
    pending = 0;
done:
    for (Py_ssize_t i = 0; i < pending; i++)
        Py_DECREF(aios[i]);
    PyMem_Free(aios);
    PyMem_Free(completions);
    PyMem_Free(codes);
    Py_DECREF(fast);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(path_doc, "path()\n--\n\n"
                       "The path xts, xts_plain64, cbc_encrypt and cbc_decrypt take: the fastest\n"
                       "this CPU can run unless set_path chose another.");

static PyObject *native_path(PyObject *module, PyObject *unused)
{
    return PyUnicode_FromString(path_names[current_path]);
}

PyDoc_STRVAR(set_path_doc,
             "set_path(name)\n--\n\n"
             "Make the calls take path name (one of PATHS), for every thread; for tests and\n"
             "benchmarks. A path this CPU cannot run raises RuntimeError naming what it lacks.");

static PyObject *native_set_path(PyObject *module, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL)
        return NULL;
    for (int p = 0; p < PATH_COUNT; p++) {
        if (strcmp(name, path_names[p]) != 0)
            continue;
        if (!(runnable_paths & 1u << p))
            return PyErr_Format(PyExc_RuntimeError, "this CPU cannot run the %s path: it needs %s",
                                name, path_needs[p]);
        current_path = (Path)p;
        Py_RETURN_NONE;
    }
    return PyErr_Format(PyExc_ValueError, "unknown path %R: one of openssl, aesni, avx2, avx512",
                        arg);
}

static PyMethodDef methods[] = {
    {"whiten", native_whiten, METH_VARARGS, whiten_doc},
    {"xts", native_xts, METH_VARARGS, xts_doc},
    {"xts_plain64", (PyCFunction)(void (*)(void))native_xts_plain64, METH_FASTCALL,
     xts_plain64_doc},
    {"cbc_encrypt", native_cbc_encrypt, METH_VARARGS, cbc_encrypt_doc},
    {"cbc_decrypt", native_cbc_decrypt, METH_VARARGS, cbc_decrypt_doc},
    {"essiv", native_essiv, METH_VARARGS, essiv_doc},
    {"cbc_essiv", (PyCFunction)(void (*)(void))native_cbc_essiv, METH_FASTCALL, cbc_essiv_doc},
    {"pwritev_chunks", (PyCFunction)(void (*)(void))native_pwritev_chunks, METH_FASTCALL,
     pwritev_chunks_doc},
    {"preadv_into", (PyCFunction)(void (*)(void))native_preadv_into, METH_FASTCALL,
     preadv_into_doc},
    {"rbd_bind", native_rbd_bind, METH_VARARGS, rbd_bind_doc},
    {"rbd_aio_start", (PyCFunction)(void (*)(void))native_rbd_aio_start, METH_FASTCALL,
     rbd_aio_start_doc},
    {"rbd_collect", native_rbd_collect, METH_O, rbd_collect_doc},
    {"path", native_path, METH_NOARGS, path_doc},
    {"set_path", native_set_path, METH_O, set_path_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "Data-path loops that run without the GIL.", -1, methods,
};

/* PATHS: the names of the paths this CPU can run, fastest first; the first is the default. */
PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module), *paths = NULL;
    runnable_paths = detect_paths();
    Py_ssize_t count = 0;
    for (int p = PATH_COUNT - 1; p >= 0; p--) {
        if (runnable_paths & 1u << p && count++ == 0)
            current_path = (Path)p;
    }
    if ((paths = PyTuple_New(count)) != NULL) {
        Py_ssize_t i = 0;
        for (int p = PATH_COUNT - 1; p >= 0; p--) {
            if (!(runnable_paths & 1u << p))
                continue;
            PyObject *name = PyUnicode_FromString(path_names[p]);
            if (name == NULL) {
                Py_CLEAR(paths);
                break;
            }
            PyTuple_SET_ITEM(paths, i++, name);
        }
    }
    if (m != NULL && (paths == NULL || PyModule_AddObjectRef(m, "PATHS", paths) < 0 ||
                      PyType_Ready(&XtsKeyType) < 0 ||
                      PyModule_AddObjectRef(m, "XtsKey", (PyObject *)&XtsKeyType) < 0 ||
                      PyType_Ready(&EssivKeyType) < 0 ||
                      PyModule_AddObjectRef(m, "EssivKey", (PyObject *)&EssivKeyType) < 0 ||
                      PyType_Ready(&RbdAioType) < 0 ||
                      PyModule_AddObjectRef(m, "RbdAio", (PyObject *)&RbdAioType) < 0))
        Py_CLEAR(m);
    Py_XDECREF(paths);
    return m;
}
