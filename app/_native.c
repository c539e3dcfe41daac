/*
 * The data path's inner loops that must not hold the GIL.
 *
 * The event loop holds the GIL most of the time under load, so every step a
 * worker thread takes with the GIL, and every GIL round trip between numpy
 * calls, is paid twice: once in CPU, once waiting. These are single passes with
 * the GIL released.
 *
 * whiten: IEEE 1619 XTS is E(P ^ T) ^ T with T = E_k2(iv) * x^j for block j of a
 * data unit. The cipher calls are OpenSSL ECB over the whole request (pyca); what
 * is left is this XOR with the tweak sequence, recomputed block by block. In
 * numpy it took about a dozen passes over a tweak array.
 *
 * gather: an HTTP body arrives in pieces of arbitrary length; the block layer
 * wants one contiguous buffer of whole data units.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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
            uint64_t carry = hi >> 63;
            hi = hi << 1 | lo >> 63;
            lo = lo << 1 ^ (0x87 & (0 - carry));
        }
    }
}

PyDoc_STRVAR(whiten_doc,
             "whiten(dst, src, first_tweaks, unit_bytes)\n--\n\n"
             "dst[u][j] = src[u][j] ^ first_tweaks[u] * x^j, per 16-byte block j of data unit u\n"
             "(GF(2^128), IEEE 1619 order). dst may be src; the GIL is released.");

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
        Py_BEGIN_ALLOW_THREADS
        whiten(dst.buf, src.buf, first.buf, src.len / unit_bytes, unit_bytes / 16);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&dst);
    PyBuffer_Release(&src);
    PyBuffer_Release(&first);
    return result;
}

PyDoc_STRVAR(gather_doc,
             "gather(dst, pieces)\n--\n\n"
             "Copy the buffers in the list pieces back to back into dst, which they must fill\n"
             "exactly. The GIL is released for the copy.");

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
    Py_BEGIN_ALLOW_THREADS
    char *out = dst.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        memcpy(out, views[i].buf, (size_t)views[i].len);
        out += views[i].len;
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < taken; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyBuffer_Release(&dst);
    return result;
}

static PyMethodDef methods[] = {
    {"whiten", native_whiten, METH_VARARGS, whiten_doc},
    {"gather", native_gather, METH_VARARGS, gather_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native", "Data-path loops that run without the GIL.", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    return PyModule_Create(&module);
}
