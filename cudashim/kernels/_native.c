/* Host-memory fast paths for cudashim.kernels: bit packing and the 1-bit compression steps.
 *
 * The functions take raw addresses and sizes from the Python side (bits.py, compressed.py),
 * which hands over only contiguous CPU tensors of the right dtype and length; each loop runs
 * without the GIL. They are the same arithmetic as the portable torch versions, in one pass
 * over memory where the torch versions make several, each with a temporary.
 *
 * Bit order "big" (numpy's default, and the order of the packed signs): element i of a byte
 * is bit 7 - i. Sign bits: 1 where x >= 0 (zero and -0.0 count as positive, NaN as negative,
 * as torch's ``x >= 0``). Little-endian hosts only: bits.py checks before using these.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

static uint64_t unpack_table[2][256];      /* [little?][byte] -> eight 0/1 bytes */
static float sign_table[256][8];           /* [byte] -> eight +1.0 / -1.0, big bit order */

static void build_tables(void)
{
    int byte, i;
    for (byte = 0; byte < 256; byte++) {
        uint64_t big = 0, little = 0;
        for (i = 0; i < 8; i++) {
            big |= (uint64_t)((byte >> (7 - i)) & 1) << (8 * i);
            little |= (uint64_t)((byte >> i) & 1) << (8 * i);
        }
        unpack_table[0][byte] = big;
        unpack_table[1][byte] = little;
        for (i = 0; i < 8; i++)
            sign_table[byte][i] = (byte >> (7 - i)) & 1 ? 1.0f : -1.0f;
    }
}

/* Eight 0/1 bytes read as a little-endian word, times this, leave the packed byte on top. */
#define PACK_BIG 0x8040201008040201ULL
#define PACK_LITTLE 0x0102040810204080ULL

static int parse_addresses(PyObject *const *args, Py_ssize_t nargs, Py_ssize_t expected,
                           const char *name, uintptr_t *out)
{
    Py_ssize_t i;
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, expected, nargs);
        return 0;
    }
    for (i = 0; i < nargs; i++) {
        out[i] = (uintptr_t)PyLong_AsVoidPtr(args[i]);
        if (PyErr_Occurred())
            return 0;
    }
    return 1;
}

/* pack_bytes(src, words, dst, little): 8 * words bytes of 0/1 -> words packed bytes. */
static PyObject *pack_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[4];
    const unsigned char *src;
    unsigned char *dst;
    size_t words, i;
    uint64_t multiplier;
    if (!parse_addresses(args, nargs, 4, "pack_bytes", a))
        return NULL;
    src = (const unsigned char *)a[0];
    words = (size_t)a[1];
    dst = (unsigned char *)a[2];
    multiplier = a[3] ? PACK_LITTLE : PACK_BIG;
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < words; i++) {
        uint64_t word;
        memcpy(&word, src + 8 * i, 8);
        dst[i] = (unsigned char)((word * multiplier) >> 56);
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* unpack_bytes(src, count, dst, little): count packed bytes -> 8 * count bytes of 0/1. */
static PyObject *unpack_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[4];
    const unsigned char *src;
    unsigned char *dst;
    const uint64_t *table;
    size_t count, i;
    if (!parse_addresses(args, nargs, 4, "unpack_bytes", a))
        return NULL;
    src = (const unsigned char *)a[0];
    count = (size_t)a[1];
    dst = (unsigned char *)a[2];
    table = unpack_table[a[3] ? 1 : 0];
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < count; i++)
        memcpy(dst + 8 * i, &table[src[i]], 8);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static inline unsigned char sign_byte(const float *x)
{
    uint64_t word = 0;
    int k;
    for (k = 0; k < 8; k++)
        word |= (uint64_t)(x[k] >= 0.0f) << (8 * k);
    return (unsigned char)((word * PACK_BIG) >> 56);
}

/* pack_signs_f32(src, n, dst): n floats (a multiple of 8) -> n / 8 sign bytes. */
static PyObject *pack_signs_f32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[3];
    const float *x;
    unsigned char *dst;
    size_t bytes, i;
    if (!parse_addresses(args, nargs, 3, "pack_signs_f32", a))
        return NULL;
    x = (const float *)a[0];
    bytes = (size_t)a[1] / 8;
    dst = (unsigned char *)a[2];
    Py_BEGIN_ALLOW_THREADS
    for (i = 0; i < bytes; i++)
        dst[i] = sign_byte(x + 8 * i);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* compress_f32(x, n, error, packed) -> scale: x's signs packed, scale = ||x|| / sqrt(n),
 * error = x - scale * sign(x). n is a multiple of 8. */
static PyObject *compress_f32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[4];
    const float *x;
    float *error, scale;
    unsigned char *packed;
    size_t n, i;
    double squares = 0.0;
    if (!parse_addresses(args, nargs, 4, "compress_f32", a))
        return NULL;
    x = (const float *)a[0];
    n = (size_t)a[1];
    error = (float *)a[2];
    packed = (unsigned char *)a[3];
    Py_BEGIN_ALLOW_THREADS
    {
        /* Eight running sums in float, folded into a double per block: vectorizes, and
         * stays as accurate as torch's pairwise float32 sum on these lengths. */
        size_t block;
        for (block = 0; block < n; block += 4096) {
            float partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            size_t stop = block + 4096 < n ? block + 4096 : n, k;
            for (i = block; i + 8 <= stop; i += 8)
                for (k = 0; k < 8; k++)
                    partial[k] += x[i + k] * x[i + k];
            for (; i < stop; i++)
                partial[0] += x[i] * x[i];
            for (k = 0; k < 8; k++)
                squares += partial[k];
        }
        scale = n ? (float)(sqrt(squares) / sqrt((double)n)) : 0.0f;
        for (i = 0; i < n; i += 8) {
            uint64_t word = 0;
            int k;
            for (k = 0; k < 8; k++) {
                const int positive = x[i + k] >= 0.0f;
                word |= (uint64_t)positive << (8 * k);
                error[i + k] = x[i + k] - (positive ? scale : -scale);
            }
            packed[i / 8] = (unsigned char)((word * PACK_BIG) >> 56);
        }
    }
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(scale);
}

/* signs_f32(packed, rows, columns, scales, out, accumulate): row r of the packed signs
 * (columns / 8 bytes each) read as +scales[r] / -scales[r]. accumulate = 0: out is rows x
 * columns; accumulate = 1: out has columns elements, the rows summed into it. */
static PyObject *signs_f32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[6];
    const unsigned char *packed;
    const float *scales;
    float *out;
    size_t rows, columns, r, i;
    int accumulate;
    if (!parse_addresses(args, nargs, 6, "signs_f32", a))
        return NULL;
    packed = (const unsigned char *)a[0];
    rows = (size_t)a[1];
    columns = (size_t)a[2];
    scales = (const float *)a[3];
    out = (float *)a[4];
    accumulate = a[5] != 0;
    Py_BEGIN_ALLOW_THREADS
    for (r = 0; r < rows; r++) {
        const unsigned char *row = packed + r * (columns / 8);
        const float scale = scales[r];
        float *target = accumulate ? out : out + r * columns;
        const int add = accumulate && r;
        for (i = 0; i < columns; i += 8) {
            const float *signs = sign_table[row[i / 8]];
            int k;
            if (add)
                for (k = 0; k < 8; k++)
                    target[i + k] += signs[k] * scale;
            else
                for (k = 0; k < 8; k++)
                    target[i + k] = signs[k] * scale;
        }
    }
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* advise_huge(address, nbytes): ask for transparent huge pages on a fresh buffer before its
 * first touch, as numpy does for its large arrays: a first write into 64 MiB then takes 32
 * page faults instead of 16384. Advice only: where it is refused nothing changes. */
static PyObject *advise_huge(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[2];
    if (!parse_addresses(args, nargs, 2, "advise_huge", a))
        return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    {
        const uintptr_t huge = (uintptr_t)2 << 20;
        uintptr_t start = (a[0] + huge - 1) & ~(huge - 1), stop = (a[0] + a[1]) & ~(huge - 1);
        if (stop > start)
            madvise((void *)start, stop - start, MADV_HUGEPAGE);
    }
#endif
    Py_RETURN_NONE;
}

static PyMethodDef native_methods[] = {
    {"pack_bytes", (PyCFunction)(void (*)(void))pack_bytes, METH_FASTCALL,
     "pack_bytes(src, words, dst, little): 0/1 bytes packed eight to a byte"},
    {"unpack_bytes", (PyCFunction)(void (*)(void))unpack_bytes, METH_FASTCALL,
     "unpack_bytes(src, count, dst, little): each byte spread to eight 0/1 bytes"},
    {"pack_signs_f32", (PyCFunction)(void (*)(void))pack_signs_f32, METH_FASTCALL,
     "pack_signs_f32(src, n, dst): float32 signs (x >= 0) packed, big bit order"},
    {"compress_f32", (PyCFunction)(void (*)(void))compress_f32, METH_FASTCALL,
     "compress_f32(x, n, error, packed) -> scale: 1-bit compression with error feedback"},
    {"advise_huge", (PyCFunction)(void (*)(void))advise_huge, METH_FASTCALL,
     "advise_huge(address, nbytes): transparent huge pages for a fresh buffer"},
    {"signs_f32", (PyCFunction)(void (*)(void))signs_f32, METH_FASTCALL,
     "signs_f32(packed, rows, columns, scales, out, accumulate): packed signs times scales"},
    {NULL}
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cudashim.kernels._native",
    .m_doc = "Host-memory fast paths for cudashim.kernels (see bits.py and compressed.py).",
    .m_size = -1,
    .m_methods = native_methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    build_tables();
    return PyModule_Create(&native_module);
}
