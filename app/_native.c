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
 *
 * gather: an HTTP body arrives in pieces of arbitrary length; the block layer
 * wants one contiguous buffer of whole data units.
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
#include <stdint.h>
#include <string.h>

#define RELEASE_BYTES (64 * 1024)

#define RUN_RELEASING_ABOVE(bytes, statement)                                                  \
    do {                                                                                       \
        if ((bytes) >= RELEASE_BYTES) {                                                        \
            Py_BEGIN_ALLOW_THREADS statement;                                                  \
            Py_END_ALLOW_THREADS                                                               \
        } else {                                                                               \
            statement;                                                                         \
        }                                                                                      \
    } while (0)

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
        RUN_RELEASING_ABOVE(src.len, whiten(dst.buf, src.buf, first.buf, src.len / unit_bytes,
                                            unit_bytes / 16));
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    PyBuffer_Release(&first);
    return result;
}

static void copy_in(char *out, const Py_buffer *views, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        memcpy(out, views[i].buf, (size_t)views[i].len);
        out += views[i].len;
    }
}

PyDoc_STRVAR(gather_doc,
             "gather(dst, pieces)\n--\n\n"
             "Copy the buffers in the list pieces back to back into dst, which they must fill\n"
             "exactly.");

static PyObject *native_gather(PyObject *module, PyObject *args)
{
    Py_buffer dst;
    PyObject *list;
    if (!PyArg_ParseTuple(args, "w*O!:gather", &dst, &PyList_Type, &list))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(list), taken = 0, total = 0;
    Py_buffer *views = PyMem_Calloc(count ? count : 1, sizeof(Py_buffer));
    PyObject *result = NULL;
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; taken < count; taken++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(list, taken), &views[taken], PyBUF_SIMPLE) < 0)
            goto done;
        total += views[taken].len;
    }
    if (total != dst.len) {
        PyErr_Format(PyExc_ValueError, "pieces hold %zd bytes, dst %zd", total, dst.len);
        goto done;
    }
    RUN_RELEASING_ABOVE(total, copy_in(dst.buf, views, count));
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < taken; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyBuffer_Release(&dst);
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

PyDoc_STRVAR(xts_doc,
             "xts(dst, src, ivs, key, unit_bytes, encrypt)\n--\n\n"
             "AES-XTS (IEEE 1619) of src into dst (which may be src), data unit by data unit:\n"
             "unit u uses the 16-byte tweak ivs[u]; key is the data key then the tweak key\n"
             "(32, 48 or 64 bytes), as in dm-crypt's aes-xts tables.");

static PyObject *native_xts(PyObject *module, PyObject *args)
{
    Py_buffer dst, src, ivs, key;
    Py_ssize_t unit_bytes;
    int encrypt;
    PyObject *result = NULL;
    XtsJob job = {NULL, NULL, NULL, NULL, 0, 0};
    if (!PyArg_ParseTuple(args, "w*y*y*y*np:xts", &dst, &src, &ivs, &key, &unit_bytes, &encrypt))
        return NULL;
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
    if (ivs.len < 16 * (src.len / unit_bytes)) {
        PyErr_SetString(PyExc_ValueError, "ivs needs 16 bytes per data unit");
        goto done;
    }
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
    RUN_RELEASING_ABOVE(src.len, failed = xts_run(&job, dst.buf, src.buf, ivs.buf, src.len,
                                                  unit_bytes));
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
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    PyBuffer_Release(&ivs);
    PyBuffer_Release(&key);
    return result;
}

static PyMethodDef methods[] = {
    {"whiten", native_whiten, METH_VARARGS, whiten_doc},
    {"gather", native_gather, METH_VARARGS, gather_doc},
    {"xts", native_xts, METH_VARARGS, xts_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "Data-path loops that run without the GIL.", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&module);
}
