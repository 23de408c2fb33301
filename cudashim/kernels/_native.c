/* Host-memory fast paths for cudashim.kernels: bit packing and the 1-bit compression steps.
 *
 * The functions take raw addresses and sizes from the Python side (native.py), which hands
 * over only contiguous CPU tensors of the right dtype and length, and the number of threads
 * torch is told to use. Each loop runs without the GIL, split into contiguous parts over
 * that many threads. They are the same arithmetic as the portable torch versions
 * (compressed.py, bits.py), in one or two passes over memory where the torch versions make
 * several, each with a temporary.
 *
 * Bit order "big" (numpy's default, and the order of the packed signs): element i of a byte
 * is bit 7 - i. Sign bits: 1 where x >= 0 (zero and -0.0 count as positive, NaN as negative,
 * as torch's ``x >= 0``). Little-endian hosts only: native.py checks before using these.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#if !defined(_WIN32)
#include <pthread.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Eight 0/1 bytes read as a little-endian word, times this, leave the packed byte on top. */
#define PACK_BIG 0x8040201008040201ULL
#define PACK_LITTLE 0x0102040810204080ULL

static uint64_t unpack_table[2][256];      /* [little?][byte] -> eight 0/1 bytes */
static float sign_table[256][8];           /* [byte] -> eight +1.0 / -1.0, big bit order */
static unsigned char reversed[256];        /* [byte] -> its bits in the other order */

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
        reversed[byte] = (unsigned char)((little * PACK_BIG) >> 56);
    }
}

/* ---- running a loop on several threads ------------------------------------------------- */

#define MAX_PARTS 64
/* Below this many units per part a thread costs more than it saves. */
#define MIN_UNITS_PER_PART ((size_t)1 << 18)

typedef void (*PartBody)(void *context, size_t start, size_t stop, size_t part);

typedef struct {
    PartBody body;
    void *context;
    size_t start, stop, part;
} Part;

static void *run_part(void *argument)
{
    Part *p = (Part *)argument;
    p->body(p->context, p->start, p->stop, p->part);
    return NULL;
}

/* Runs body over [0, n) in up to `threads` contiguous parts whose bounds are multiples of
 * `unit` (but the last); part 0 runs on the calling thread. Returns how many parts ran, so
 * that a caller that keeps one partial result per part can fold them in order. Where a
 * thread cannot be started its part runs here: the result is the same. */
static size_t parallel_for(size_t n, size_t unit, size_t threads, PartBody body, void *context)
{
    Part parts[MAX_PARTS];
    size_t units = (n + unit - 1) / unit, count, per, p;
#if !defined(_WIN32)
    pthread_t handles[MAX_PARTS];
    int started[MAX_PARTS];
#endif
    count = threads < MAX_PARTS ? threads : MAX_PARTS;
    if (count > units * unit / MIN_UNITS_PER_PART)
        count = units * unit / MIN_UNITS_PER_PART;
    if (count < 1)
        count = 1;
    per = (units + count - 1) / count;
    for (p = 0; p < count; p++) {
        size_t start = p * per * unit, stop = (p + 1) * per * unit;
        parts[p].body = body;
        parts[p].context = context;
        parts[p].start = start < n ? start : n;
        parts[p].stop = stop < n ? stop : n;
        parts[p].part = p;
    }
#if defined(_WIN32)
    for (p = 0; p < count; p++)
        run_part(&parts[p]);
#else
    for (p = 1; p < count; p++)
        started[p] = pthread_create(&handles[p], NULL, run_part, &parts[p]) == 0;
    run_part(&parts[0]);
    for (p = 1; p < count; p++) {
        if (started[p])
            pthread_join(handles[p], NULL);
        else
            run_part(&parts[p]);
    }
#endif
    return count;
}

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

/* ---- bit packing ------------------------------------------------------------------------ */

typedef struct {
    const unsigned char *src;
    unsigned char *dst;
    int little;                      /* the bit order: 1 little, 0 big (numpy's default) */
} Bytes;

/* Each of the eight bytes of x with its bits in the other order. */
static inline uint64_t reverse_each_byte(uint64_t x)
{
    x = (x >> 4 & 0x0F0F0F0F0F0F0F0FULL) | (x & 0x0F0F0F0F0F0F0F0FULL) << 4;
    x = (x >> 2 & 0x3333333333333333ULL) | (x & 0x3333333333333333ULL) << 2;
    return (x >> 1 & 0x5555555555555555ULL) | (x & 0x5555555555555555ULL) << 1;
}

static void pack_part(void *context, size_t start, size_t stop, size_t part)
{
    const Bytes *b = (const Bytes *)context;
    const uint64_t multiplier = b->little ? PACK_LITTLE : PACK_BIG;
    size_t i = start;
#if defined(__SSE2__)
    /* Sixteen bytes to a register: each 0/1 shifted up to the top bit, then one mask of them
     * (element k at bit k: the little order). Four masks make eight packed bytes. */
    for (; i + 8 <= stop; i += 8) {
        uint64_t word = 0;
        int q;
        for (q = 0; q < 4; q++) {
            const __m128i flags = _mm_loadu_si128((const __m128i *)(b->src + 8 * i + 16 * q));
            word |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_slli_epi16(flags, 7)) << (16 * q);
        }
        if (!b->little)
            word = reverse_each_byte(word);
        memcpy(b->dst + i, &word, 8);
    }
#endif
    for (; i < stop; i++) {
        uint64_t word;
        memcpy(&word, b->src + 8 * i, 8);
        b->dst[i] = (unsigned char)((word * multiplier) >> 56);
    }
}

static void unpack_part(void *context, size_t start, size_t stop, size_t part)
{
    const Bytes *b = (const Bytes *)context;
    const uint64_t *table = unpack_table[b->little];
    size_t i = start;
    for (; i + 2 <= stop; i += 2) {           /* two table words, one 16-byte store */
        const uint64_t pair[2] = {table[b->src[i]], table[b->src[i + 1]]};
        memcpy(b->dst + 8 * i, pair, 16);
    }
    for (; i < stop; i++)
        memcpy(b->dst + 8 * i, &table[b->src[i]], 8);
}

/* The two entry points below: (src, count, dst, little, threads), count words to pack or
 * bytes to unpack, run by body. */
static PyObject *run_bytes(PyObject *const *args, Py_ssize_t nargs, const char *name, PartBody body)
{
    uintptr_t a[5];
    Bytes b;
    if (!parse_addresses(args, nargs, 5, name, a))
        return NULL;
    b.src = (const unsigned char *)a[0];
    b.dst = (unsigned char *)a[2];
    b.little = a[3] != 0;
    Py_BEGIN_ALLOW_THREADS
    parallel_for((size_t)a[1], 64, (size_t)a[4], body, &b);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* pack_bytes(src, words, dst, little, threads): 8 * words bytes of 0/1 -> words packed bytes. */
static PyObject *pack_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return run_bytes(args, nargs, "pack_bytes", pack_part);
}

/* unpack_bytes(src, count, dst, little, threads): count packed bytes -> 8 * count 0/1 bytes. */
static PyObject *unpack_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return run_bytes(args, nargs, "unpack_bytes", unpack_part);
}

/* ---- 1-bit compression ------------------------------------------------------------------ */

/* Sums of squares are taken a block at a time, in eight float lanes (which vectorize) folded
 * into a double per block: as accurate as torch's pairwise float32 sum on these lengths.
 * Parts start on block bounds, so the blocks, and the sum, do not depend on the threads. */
#define BLOCK 4096

/* Four floats, one register's worth: GCC and Clang turn arithmetic on it into one
 * instruction on any machine with 128-bit registers (SSE2 on every x86-64, NEON on arm64).
 * The loops below take eight floats at a time, as two of these. */
#if !defined(__GNUC__)
#error "the host kernels need GCC or Clang vector extensions; cudashim runs without them"
#endif
typedef float f4 __attribute__((vector_size(16)));

static inline f4 load4(const float *p)
{
    f4 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store4(float *p, f4 v)
{
    memcpy(p, &v, sizeof v);
}

/* The packed sign byte of eight floats (big bit order): one compare and mask a register of
 * four with SSE2, one compare a float elsewhere; the same bits. */
static inline unsigned char sign_byte(const float *x)
{
#if defined(__SSE2__)
    const __m128 zero = _mm_setzero_ps();
    const int low = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(x), zero));
    const int high = _mm_movemask_ps(_mm_cmpge_ps(_mm_loadu_ps(x + 4), zero));
    return reversed[low | high << 4];
#else
    unsigned little = 0;
    int k;
    for (k = 0; k < 8; k++)
        little |= (unsigned)(x[k] >= 0.0f) << k;
    return reversed[little];
#endif
}

static double block_squares(const float *x, size_t n)
{
    f4 low = {0, 0, 0, 0}, high = {0, 0, 0, 0};        /* lanes 0-3 and 4-7 */
    double total = 0.0;
    size_t i;
    int k;
    for (i = 0; i + 8 <= n; i += 8) {
        const f4 a = load4(x + i), b = load4(x + i + 4);
        low += a * a;
        high += b * b;
    }
    for (; i < n; i++)
        low[0] += x[i] * x[i];
    for (k = 0; k < 4; k++)
        total += low[k];
    for (k = 0; k < 4; k++)
        total += high[k];
    return total;
}

typedef struct {
    /* what is compressed: x (the error tensor, updated in place first) */
    float *x;
    size_t n;
    /* the worker side: x[:buffer_n] += buffer */
    const float *buffer;
    size_t buffer_n;
    /* the server side: x += the mean over rows of row r's signs times scales[r] */
    const unsigned char *signs;
    const float *scales;
    size_t rows;
    /* the result */
    float scale;
    unsigned char *packed;
    double squares[MAX_PARTS];
} Compression;

/* Pass one of the worker side: compensate (x += buffer), then sum the squares. */
static void compensate_part(void *context, size_t start, size_t stop, size_t part)
{
    Compression *c = (Compression *)context;
    double squares = 0.0;
    size_t block, i;
    for (block = start; block < stop; block += BLOCK) {
        size_t end = block + BLOCK < stop ? block + BLOCK : stop;
        size_t added = end < c->buffer_n ? end : c->buffer_n;
        for (i = block; i < added; i++)
            c->x[i] += c->buffer[i];
        squares += block_squares(c->x + block, end - block);
    }
    c->squares[part] = squares;
}

/* Pass one of the server side: x += (sum over rows of sign * scale) / rows, as the portable
 * version computes it (row by row, then divided), then sum the squares. */
static void server_part(void *context, size_t start, size_t stop, size_t part)
{
    Compression *c = (Compression *)context;
    float *restrict x = c->x;
    const unsigned char *restrict signs = c->signs;
    const size_t row_bytes = c->n / 8, rows = c->rows;
    const float divisor = (float)rows;
    double squares = 0.0;
    size_t block, i, r;
    for (block = start; block < stop; block += BLOCK) {
        size_t end = block + BLOCK < stop ? block + BLOCK : stop;
        for (i = block; i < end; i += 8) {
            const float *first = sign_table[signs[i / 8]];
            f4 low = load4(first) * c->scales[0], high = load4(first + 4) * c->scales[0];
            for (r = 1; r < rows; r++) {
                const float *row = sign_table[signs[r * row_bytes + i / 8]];
                low += load4(row) * c->scales[r];
                high += load4(row + 4) * c->scales[r];
            }
            store4(x + i, load4(x + i) + low / divisor);
            store4(x + i + 4, load4(x + i + 4) + high / divisor);
        }
        squares += block_squares(x + block, end - block);
    }
    c->squares[part] = squares;
}

/* Pass two: pack the signs of x; x becomes what they miss, x - (+scale or -scale). */
static void residue_part(void *context, size_t start, size_t stop, size_t part)
{
    Compression *c = (Compression *)context;
    float *restrict x = c->x;
    unsigned char *restrict packed = c->packed;
    const float scale = c->scale;
    size_t i;
    for (i = start; i < stop; i += 8) {
        const unsigned char byte = sign_byte(x + i);
        const float *signs = sign_table[byte];
        packed[i / 8] = byte;
        store4(x + i, load4(x + i) - load4(signs) * scale);
        store4(x + i + 4, load4(x + i + 4) - load4(signs + 4) * scale);
    }
}

/* Both passes; the scale is ||x|| / sqrt(n). */
static PyObject *compress(Compression *c, PartBody first_pass, size_t threads)
{
    Py_BEGIN_ALLOW_THREADS
    {
        size_t parts = parallel_for(c->n, BLOCK, threads, first_pass, c), p;
        double squares = 0.0;
        for (p = 0; p < parts; p++)
            squares += c->squares[p];
        c->scale = c->n ? (float)(sqrt(squares) / sqrt((double)c->n)) : 0.0f;
        parallel_for(c->n, BLOCK, threads, residue_part, c);
    }
    Py_END_ALLOW_THREADS
    return PyFloat_FromDouble(c->scale);
}

/* compress_compensated_f32(buffer, buffer_n, error, n, packed, threads) -> scale: the worker
 * side. error[:buffer_n] += buffer, then error's signs are packed and error keeps what they
 * miss. n is a multiple of 8. */
static PyObject *compress_compensated_f32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[6];
    Compression c;
    if (!parse_addresses(args, nargs, 6, "compress_compensated_f32", a))
        return NULL;
    memset(&c, 0, sizeof c);
    c.buffer = (const float *)a[0];
    c.buffer_n = (size_t)a[1];
    c.x = (float *)a[2];
    c.n = (size_t)a[3];
    c.packed = (unsigned char *)a[4];
    return compress(&c, compensate_part, (size_t)a[5]);
}

/* compress_server_f32(signs, rows, scales, error, n, packed, threads) -> scale: the server
 * side. signs holds rows rows of n / 8 packed bytes; error += their mean weighted by
 * scales, then it is compressed as above. */
static PyObject *compress_server_f32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[7];
    Compression c;
    if (!parse_addresses(args, nargs, 7, "compress_server_f32", a))
        return NULL;
    memset(&c, 0, sizeof c);
    c.signs = (const unsigned char *)a[0];
    c.rows = (size_t)a[1];
    c.scales = (const float *)a[2];
    c.x = (float *)a[3];
    c.n = (size_t)a[4];
    c.packed = (unsigned char *)a[5];
    return compress(&c, server_part, (size_t)a[6]);
}

/* pack_signs_f32(src, n, dst, threads): n floats (a multiple of 8) -> n / 8 sign bytes. */
static void pack_signs_part(void *context, size_t start, size_t stop, size_t part)
{
    const Compression *c = (const Compression *)context;
    size_t i;
    for (i = start; i < stop; i += 8)
        c->packed[i / 8] = sign_byte(c->x + i);
}

static PyObject *pack_signs_f32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[4];
    Compression c;
    if (!parse_addresses(args, nargs, 4, "pack_signs_f32", a))
        return NULL;
    memset(&c, 0, sizeof c);
    c.x = (float *)a[0];
    c.n = (size_t)a[1];
    c.packed = (unsigned char *)a[2];
    Py_BEGIN_ALLOW_THREADS
    parallel_for(c.n, BLOCK, (size_t)a[3], pack_signs_part, &c);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

typedef struct {
    const unsigned char *packed;
    size_t columns;
    const float *scales;
    float *out;
} Expansion;

/* out[j] = sign j of the packed bits times the scale of j's row (columns elements a row). */
static void expand_part(void *context, size_t start, size_t stop, size_t part)
{
    const Expansion *e = (const Expansion *)context;
    const unsigned char *restrict packed = e->packed;
    float *restrict out = e->out;
    size_t j = start;
    while (j < stop) {
        const size_t row = j / e->columns, row_stop = (row + 1) * e->columns;
        const size_t end = row_stop < stop ? row_stop : stop;
        const float scale = e->scales[row];
        for (; j + 8 <= end; j += 8) {
            const float *signs = sign_table[packed[j / 8]];
            store4(out + j, load4(signs) * scale);
            store4(out + j + 4, load4(signs + 4) * scale);
        }
        for (; j < end; j++)
            out[j] = sign_table[packed[j / 8]][j % 8] * scale;
    }
}

/* expand_signs_f32(packed, columns, scales, out, count, threads): the first count signs of
 * packed (rows of columns, a multiple of 8) as +scales[row] / -scales[row] into out. */
static PyObject *expand_signs_f32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[6];
    Expansion e;
    if (!parse_addresses(args, nargs, 6, "expand_signs_f32", a))
        return NULL;
    e.packed = (const unsigned char *)a[0];
    e.columns = (size_t)a[1];
    e.scales = (const float *)a[2];
    e.out = (float *)a[3];
    if (e.columns == 0 || e.columns % 8) {
        PyErr_SetString(PyExc_ValueError, "expand_signs_f32: columns must be a positive multiple of 8");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    parallel_for((size_t)a[4], 64, (size_t)a[5], expand_part, &e);
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

#define FASTCALL(name, doc) {#name, (PyCFunction)(void (*)(void))name, METH_FASTCALL, doc}

static PyMethodDef native_methods[] = {
    FASTCALL(pack_bytes, "pack_bytes(src, words, dst, little, threads): 0/1 bytes packed eight to a byte"),
    FASTCALL(unpack_bytes, "unpack_bytes(src, count, dst, little, threads): each byte spread to eight 0/1 bytes"),
    FASTCALL(pack_signs_f32, "pack_signs_f32(src, n, dst, threads): float32 signs (x >= 0) packed, big bit order"),
    FASTCALL(compress_compensated_f32,
             "compress_compensated_f32(buffer, buffer_n, error, n, packed, threads) -> scale: the worker side"),
    FASTCALL(compress_server_f32,
             "compress_server_f32(signs, rows, scales, error, n, packed, threads) -> scale: the server side"),
    FASTCALL(expand_signs_f32,
             "expand_signs_f32(packed, columns, scales, out, count, threads): packed signs times row scales"),
    FASTCALL(advise_huge, "advise_huge(address, nbytes): transparent huge pages for a fresh buffer"),
    {NULL}
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cudashim.kernels._native",
    .m_doc = "Host-memory fast paths for cudashim.kernels (see native.py).",
    .m_size = -1,
    .m_methods = native_methods,
};

PyMODINIT_FUNC PyInit__native(void)
{
    build_tables();
    return PyModule_Create(&native_module);
}
