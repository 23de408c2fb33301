/* Host-memory fast paths for cudashim.kernels: bit packing, the 1-bit compression steps,
 * conversions between float16 and bfloat16 (for the precision policy), and long float32 sums in
 * double (norms, distances and cosine similarities as exact as CUDA's: patches/reductions.py).
 *
 * The functions take raw addresses and sizes from the Python side (native.py), which hands
 * over only contiguous CPU tensors of the right dtype and length, and the number of threads
 * torch is told to use. Each loop runs without the GIL, split into contiguous parts over
 * that many threads (the long sums into chunks the threads take in turn). They are the same arithmetic as the portable torch versions
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
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#if !defined(_WIN32)
#include <pthread.h>
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

/* ---- what the loops share ---------------------------------------------------------------- */

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

/* Sums of squares are taken a block at a time, in eight float lanes (which vectorize) folded
 * into a double per block: as accurate as torch's pairwise float32 sum on these lengths.
 * Parts start on block bounds, so the blocks, and the sum, do not depend on the threads. */
#define BLOCK 4096

/* Packing reads its input once, front to back: each line is asked for this far ahead. */
#define PREFETCH_AHEAD 1024

/* Eight floats: GCC and Clang turn arithmetic on it into one instruction where registers
 * are 256 bits wide, two where they are 128 (SSE2, NEON). */
#if !defined(__GNUC__)
#error "the host kernels need GCC or Clang vector extensions; cudashim runs without them"
#endif
typedef float f8 __attribute__((vector_size(32)));
/* Unaligned loads and stores of eight floats, as macros: a function passing f8 by value would
 * have one calling convention with AVX and another without. */
#define LOAD8(p) __extension__({ f8 v_; memcpy(&v_, (p), sizeof v_); v_; })
#define STORE8(p, v) do { f8 v_ = (v); memcpy((p), &v_, sizeof v_); } while (0)

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

typedef struct {
    const unsigned char *packed;
    size_t columns;
    const float *scales;
    float *out;
} Expansion;

/* Eight 32-bit integers: a float vector's bits, for its absolute value. */
typedef int32_t i8 __attribute__((vector_size(32)));

/* What a long reduction sums over a run of float32 elements (and, for the two-input kinds, the
 * run of the same length in y): |x|, x^2, x*y, |x - y|, (x - y)^2. */
enum { SUM_ABS, SUM_SQUARES, SUM_PRODUCTS, SUM_ABS_DIFFERENCES, SUM_SQUARED_DIFFERENCES };

/* A long reduction is summed in chunks of this many elements, which threads take one at a time
 * as they finish the last: a thread that torch's own pool keeps from its core (its workers spin
 * for a while after each of torch's ops) then takes fewer, where a fixed share would hold up the
 * call (a dot of 2^24 floats took 2.4-3.8 ms in halves right after a torch op, 1.5 ms alone).
 * The chunks' sums are folded in order: the result does not depend on the threads at all. */
#define REDUCTION_CHUNK ((size_t)1 << 16)
typedef struct {
    const float *x, *y;
    int kind;
    size_t run;                      /* each row's length */
    size_t chunks_per_row;
    double *sums;                    /* each chunk's sum, rows after rows */
    size_t next;                     /* the next chunk to take (atomic) */
    size_t chunks;
    void (*sum_chunk)(void *context, size_t chunk);
} Reduction;

/* A run's sum as the caller asked for it: the sum, or its square root for the squares (a
 * 2-norm, a Euclidean distance), rounded to float32 once. */
static float reduction_result(double total, int kind)
{
    if (kind == SUM_SQUARES || kind == SUM_SQUARED_DIFFERENCES)
        total = sqrt(total);
    return (float)total;
}

/* One variant's loops (see _native_loops.h). */
typedef struct {
    PartBody pack, unpack, compensate, server, residue, pack_signs, expand;
    void (*sum_chunk)(void *context, size_t chunk);
} Loops;

/* ---- the variants, one per instruction set ------------------------------------------------ */

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>

#if defined(__clang__)
#define TARGET_PUSH(isa) _Pragma("clang attribute push(__attribute__((target(\"" isa "\"))), apply_to = function)")
#define TARGET_POP() _Pragma("clang attribute pop")
#else
#define TARGET_PRAGMA(text) _Pragma(#text)
#define TARGET_PUSH(isa) _Pragma("GCC push_options") TARGET_PRAGMA(GCC target(isa))
#define TARGET_POP() _Pragma("GCC pop_options")
#endif

#define VARIANT avx512
#define SIMD_LEVEL 3
TARGET_PUSH("avx512f,avx512bw,avx2,avx")
#include "_native_loops.h"
TARGET_POP()
#undef VARIANT
#undef SIMD_LEVEL

#define VARIANT avx2
#define SIMD_LEVEL 2
TARGET_PUSH("avx2,avx")
#include "_native_loops.h"
TARGET_POP()
#undef VARIANT
#undef SIMD_LEVEL

#define VARIANT sse2
#define SIMD_LEVEL 1
#include "_native_loops.h"
#undef VARIANT
#undef SIMD_LEVEL

static int runs_avx512(void) { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"); }
static int runs_avx2(void) { return __builtin_cpu_supports("avx2"); }
static int runs_always(void) { return 1; }

typedef struct {
    const char *name;
    const char *needs;                       /* the CPU features, as /proc/cpuinfo names them */
    int (*runs_here)(void);
    const Loops *loops;
} Variant;

/* Widest first. */
static const Variant variants[] = {
    {"avx512", "avx512f avx512bw", runs_avx512, &loops_avx512},
    {"avx2", "avx2", runs_avx2, &loops_avx2},
    {"sse2", "sse2 (every x86-64 CPU)", runs_always, &loops_sse2},
};

#else   /* arm64 (NEON is part of every AArch64 CPU) and other hosts: the vector extensions */

#if defined(__aarch64__)
#define VARIANT neon
#else
#define VARIANT generic
#endif
#define SIMD_LEVEL 0
#include "_native_loops.h"
#undef SIMD_LEVEL

static int runs_always(void) { return 1; }

typedef struct {
    const char *name;
    const char *needs;
    int (*runs_here)(void);
    const Loops *loops;
} Variant;

#if defined(__aarch64__)
static const Variant variants[] = {{"neon", "asimd (every AArch64 CPU)", runs_always, &loops_neon}};
#else
static const Variant variants[] = {{"generic", "nothing (the compiler's vector code)", runs_always, &loops_generic}};
#endif
#undef VARIANT
#endif

#define VARIANT_COUNT (sizeof variants / sizeof variants[0])

/* The variant the entry points run: the widest this CPU runs until native.py, having checked
 * each against the portable version, picks one (use_variant). */
static const Variant *current = NULL;

static const Variant *widest_running_here(void)
{
    size_t v;
    for (v = 0; v < VARIANT_COUNT; v++)
        if (variants[v].runs_here())
            return &variants[v];
    return &variants[VARIANT_COUNT - 1];
}

/* ---- bit packing ------------------------------------------------------------------------ */

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
    return run_bytes(args, nargs, "pack_bytes", current->loops->pack);
}

/* unpack_bytes(src, count, dst, little, threads): count packed bytes -> 8 * count 0/1 bytes. */
static PyObject *unpack_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return run_bytes(args, nargs, "unpack_bytes", current->loops->unpack);
}

/* ---- 1-bit compression ------------------------------------------------------------------ */

/* Both passes; the scale is ||x|| / sqrt(n). */
static PyObject *compress(Compression *c, PartBody first_pass, size_t threads)
{
    PartBody residue = current->loops->residue;
    Py_BEGIN_ALLOW_THREADS
    {
        size_t parts = parallel_for(c->n, BLOCK, threads, first_pass, c), p;
        double squares = 0.0;
        for (p = 0; p < parts; p++)
            squares += c->squares[p];
        c->scale = c->n ? (float)(sqrt(squares) / sqrt((double)c->n)) : 0.0f;
        parallel_for(c->n, BLOCK, threads, residue, c);
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
    return compress(&c, current->loops->compensate, (size_t)a[5]);
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
    return compress(&c, current->loops->server, (size_t)a[6]);
}

/* pack_signs_f32(src, n, dst, threads): n floats (a multiple of 8) -> n / 8 sign bytes. */
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
    parallel_for(c.n, BLOCK, (size_t)a[3], current->loops->pack_signs, &c);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
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
    parallel_for((size_t)a[4], 64, (size_t)a[5], current->loops->expand, &e);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---- float16 <-> bfloat16 ------------------------------------------------------------- */

/* Torch's CPU kernels convert between the two reduced types one element at a time and to or
 * from float32 with vector instructions; these convert in one pass, by way of float32 in
 * registers, with F16C's conversions (which round to nearest even, subnormals included, as
 * torch's float32 -> float16 does) and bfloat16's rounding in integers (to nearest even, as
 * torch's float32 -> bfloat16 does; a NaN stays a NaN). Only where the CPU has F16C: elsewhere
 * the entry points say so and native.py leaves the conversion to torch. */

typedef struct {
    const uint16_t *src;
    uint16_t *dst;
} Halves;

#if defined(__x86_64__) || defined(_M_X64)

#define BFLOAT16_NAN 0x7FC0u

/* The bfloat16 bits of a float32's, rounded to nearest even. */
static inline uint16_t bfloat16_bits(uint32_t f)
{
    if ((f & 0x7FFFFFFFu) > 0x7F800000u)
        return (uint16_t)(BFLOAT16_NAN | (f >> 16 & 0x8000u));
    return (uint16_t)((f + 0x7FFFu + (f >> 16 & 1u)) >> 16);
}

/* What the vector loops leave, one value at a time. */
TARGET_PUSH("f16c")

static inline void half_to_bfloat16_tail(const Halves *h, size_t i, size_t stop)
{
    for (; i < stop; i++) {
        const float f = _cvtsh_ss(h->src[i]);
        uint32_t u;
        memcpy(&u, &f, 4);
        h->dst[i] = bfloat16_bits(u);
    }
}

static inline void bfloat16_to_half_tail(const Halves *h, size_t i, size_t stop)
{
    for (; i < stop; i++) {
        const uint32_t u = (uint32_t)h->src[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        h->dst[i] = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    }
}

TARGET_POP()

TARGET_PUSH("avx512f,avx512bw,avx2,avx,f16c")

static inline __m512i rounded_to_bfloat16_512(__m512 f)
{
    const __m512i u = _mm512_castps_si512(f);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    const __m512i quiet = _mm512_or_si512(_mm512_set1_epi32(BFLOAT16_NAN),
                                          _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)));
    return _mm512_mask_mov_epi32(rounded, nan, quiet);
}

static void half_to_bfloat16_avx512(void *context, size_t start, size_t stop, size_t part)
{
    const Halves *h = (const Halves *)context;
    size_t i = start;
    for (; i + 16 <= stop; i += 16) {
        const __m512 f = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h->src + i)));
        _mm256_storeu_si256((__m256i *)(h->dst + i), _mm512_cvtepi32_epi16(rounded_to_bfloat16_512(f)));
    }
    half_to_bfloat16_tail(h, i, stop);
}

static void bfloat16_to_half_avx512(void *context, size_t start, size_t stop, size_t part)
{
    const Halves *h = (const Halves *)context;
    size_t i = start;
    for (; i + 16 <= stop; i += 16) {
        const __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(h->src + i))), 16);
        _mm256_storeu_si256((__m256i *)(h->dst + i),
                            _mm512_cvtps_ph(_mm512_castsi512_ps(u), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    bfloat16_to_half_tail(h, i, stop);
}

TARGET_POP()

/* Where the CPU has AVX512-BF16: one instruction rounds 32 float32 values to bfloat16 (to
 * nearest even; a NaN stays a NaN). It reads a subnormal float32 as zero, which no float16
 * value is in float32. Compilers before GCC 10 and Clang 11 lack its intrinsic: there the
 * integer rounding above serves. */
#if (defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && __GNUC__ >= 10)
#define HAVE_AVX512BF16 1
TARGET_PUSH("avx512f,avx512bw,avx512bf16,avx2,avx,f16c")

static void half_to_bfloat16_avx512bf16(void *context, size_t start, size_t stop, size_t part)
{
    const Halves *h = (const Halves *)context;
    size_t i = start;
    for (; i + 32 <= stop; i += 32) {
        const __m512 low = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h->src + i)));
        const __m512 high = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h->src + i + 16)));
        _mm512_storeu_si512((void *)(h->dst + i), (__m512i)_mm512_cvtne2ps_pbh(high, low));
    }
    half_to_bfloat16_avx512(context, i, stop, part);
}

TARGET_POP()
#endif

TARGET_PUSH("avx2,avx,f16c")

static void half_to_bfloat16_avx2(void *context, size_t start, size_t stop, size_t part)
{
    const Halves *h = (const Halves *)context;
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7FFF);
    const __m256i nan_bits = _mm256_set1_epi32(BFLOAT16_NAN), sign = _mm256_set1_epi32(0x8000);
    size_t i = start;
    for (; i + 8 <= stop; i += 8) {
        const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h->src + i)));
        const __m256i u = _mm256_castps_si256(f), high = _mm256_srli_epi32(u, 16);
        const __m256i rounded = _mm256_srli_epi32(
            _mm256_add_epi32(u, _mm256_add_epi32(_mm256_and_si256(high, one), bias)), 16);
        const __m256i quiet = _mm256_or_si256(nan_bits, _mm256_and_si256(high, sign));
        const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
        const __m256i bits = _mm256_blendv_epi8(rounded, quiet, nan);
        /* eight 32-bit lanes (each below 2^16) to eight 16-bit ones, in order */
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
        _mm_storeu_si128((__m128i *)(h->dst + i), _mm256_castsi256_si128(packed));
    }
    half_to_bfloat16_tail(h, i, stop);
}

static void bfloat16_to_half_avx2(void *context, size_t start, size_t stop, size_t part)
{
    const Halves *h = (const Halves *)context;
    size_t i = start;
    for (; i + 8 <= stop; i += 8) {
        const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h->src + i))), 16);
        _mm_storeu_si128((__m128i *)(h->dst + i),
                         _mm256_cvtps_ph(_mm256_castsi256_ps(u), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    bfloat16_to_half_tail(h, i, stop);
}

TARGET_POP()

/* CPUID's word for a leaf and subleaf, 0 where the CPU has no such leaf. Read directly, not
 * through __builtin_cpu_supports, whose feature names older compilers lack. */
static unsigned cpuid_word(unsigned leaf, unsigned subleaf, int which)
{
    unsigned words[4] = {0, 0, 0, 0};
    if (!__get_cpuid_count(leaf, subleaf, &words[0], &words[1], &words[2], &words[3]))
        return 0;
    return words[which];
}

/* Read once, at import: CPUID is slow (in a virtual machine it exits to the hypervisor).
 * use_avx512bf16 turns has_avx512bf16 off, so that the tests run the integer rounding where
 * the CPU has AVX512-BF16 too. */
static int has_f16c, has_avx512bf16;

static void read_conversion_features(void)
{
    has_f16c = (cpuid_word(1, 0, 2) >> 29) & 1;             /* ECX bit 29 */
    has_avx512bf16 = (cpuid_word(7, 1, 0) >> 5) & 1;        /* EAX bit 5 */
}

/* The conversion loops for this CPU, by the variant in use (the widest one that agreed with
 * the portable kernels, whose check is also that the system saves the vector registers):
 * NULL where it lacks F16C. */
static void reduced_conversions(PartBody *to_bfloat16, PartBody *to_half)
{
    *to_bfloat16 = *to_half = NULL;
    if (!has_f16c)
        return;
    if (strcmp(current->name, "avx512") == 0) {
        *to_bfloat16 = half_to_bfloat16_avx512;
#if defined(HAVE_AVX512BF16)
        if (has_avx512bf16)
            *to_bfloat16 = half_to_bfloat16_avx512bf16;
#endif
        *to_half = bfloat16_to_half_avx512;
    } else if (strcmp(current->name, "avx2") == 0) {
        *to_bfloat16 = half_to_bfloat16_avx2;
        *to_half = bfloat16_to_half_avx2;
    }
}

#else

static void read_conversion_features(void) {}

static void reduced_conversions(PartBody *to_bfloat16, PartBody *to_half)
{
    *to_bfloat16 = *to_half = NULL;
}

#endif

/* convert_reduced(src, dst, n, to_bfloat16, threads) -> whether it converted: n float16
 * values to bfloat16 (to_bfloat16 true) or n bfloat16 values to float16. False, with
 * nothing written, where this CPU has no conversion loop. */
static PyObject *convert_reduced(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[5];
    Halves h;
    PartBody to_bfloat16, to_half, body;
    if (!parse_addresses(args, nargs, 5, "convert_reduced", a))
        return NULL;
    reduced_conversions(&to_bfloat16, &to_half);
    body = a[3] ? to_bfloat16 : to_half;
    if (body == NULL)
        Py_RETURN_FALSE;
    h.src = (const uint16_t *)a[0];
    h.dst = (uint16_t *)a[1];
    Py_BEGIN_ALLOW_THREADS
    parallel_for((size_t)a[2], 64, (size_t)a[4], body, &h);
    Py_END_ALLOW_THREADS
    Py_RETURN_TRUE;
}

/* A batch of matrices converted and transposed in one pass: what a convolution computed on
 * oneDNN's channels-last kernels reads and writes where the program's tensors are laid out
 * channel-first (batch, channel, position to batch, position, channel, and back). Torch would
 * take two passes, a permuting copy and a conversion, its copy the slower of them (a 2 MB
 * bfloat16 activation: 0.73 ms permuted, 0.09 ms converted, Xeon with AMX-BF16). Blocks of
 * 8 x 8 values are converted and transposed in registers, within tiles of TILE x TILE values
 * whose rows stay in cache while the tile is written: 2^21 values (16 x 32 x 64 x 64) took
 * 0.6-0.7 ms each way on that Xeon, where torch's copy that permutes and converts took 1.7-2.6. */

#define TILE 32

typedef struct {
    const uint16_t *src;
    uint16_t *dst;
    size_t rows, cols, row_tiles;  /* each matrix rows x cols in src, cols x rows in dst */
    int to_bfloat16;
} Transposition;

#if defined(__x86_64__) || defined(_M_X64)

TARGET_PUSH("avx2,avx,f16c")

static inline __m128i half8_to_bfloat16(__m128i halves)
{
    const __m256 f = _mm256_cvtph_ps(halves);
    const __m256i u = _mm256_castps_si256(f), high = _mm256_srli_epi32(u, 16);
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(_mm256_and_si256(high, _mm256_set1_epi32(1)),
                                             _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_set1_epi32(BFLOAT16_NAN),
                                          _mm256_and_si256(high, _mm256_set1_epi32(0x8000)));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    const __m256i bits = _mm256_blendv_epi8(rounded, quiet, nan);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08));
}

static inline __m128i bfloat16x8_to_half(__m128i bfloat16s)
{
    const __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(bfloat16s), 16);
    return _mm256_cvtps_ph(_mm256_castsi256_ps(u), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* Eight rows of eight 16-bit values to eight columns. */
static inline void transposed_8x8(__m128i r[8])
{
    const __m128i a0 = _mm_unpacklo_epi16(r[0], r[1]), a1 = _mm_unpackhi_epi16(r[0], r[1]);
    const __m128i a2 = _mm_unpacklo_epi16(r[2], r[3]), a3 = _mm_unpackhi_epi16(r[2], r[3]);
    const __m128i a4 = _mm_unpacklo_epi16(r[4], r[5]), a5 = _mm_unpackhi_epi16(r[4], r[5]);
    const __m128i a6 = _mm_unpacklo_epi16(r[6], r[7]), a7 = _mm_unpackhi_epi16(r[6], r[7]);
    const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);
    const __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);
    const __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);
    const __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
    r[0] = _mm_unpacklo_epi64(b0, b4); r[1] = _mm_unpackhi_epi64(b0, b4);
    r[2] = _mm_unpacklo_epi64(b1, b5); r[3] = _mm_unpackhi_epi64(b1, b5);
    r[4] = _mm_unpacklo_epi64(b2, b6); r[5] = _mm_unpackhi_epi64(b2, b6);
    r[6] = _mm_unpacklo_epi64(b3, b7); r[7] = _mm_unpackhi_epi64(b3, b7);
}

/* The loop over a part's tiles, for a way of converting and transposing one block of 8 x 8
 * values (BLOCK(src, cols, dst, rows, to_bfloat16): the block's first value in each, and the
 * row length of each); each instruction set has its own copy. Parts are rows of tiles, in units
 * of TILE * cols values (parallel_for's). Within a tile, blocks go in the order that finishes
 * each cache line of the side read or written far apart (rows of a long side lie a multiple of
 * 4 KiB apart, and would evict each other from L1 before the tile came back to them): along the
 * input's rows where they are the short ones, else down its columns. Two nested loops, not one
 * divided into them: a division a block cost as much as its conversion. */
#define TRANSPOSE_CONVERTED(name, BLOCK)                                                            \
static void name(void *context, size_t start, size_t stop, size_t part)                            \
{                                                                                                   \
    const Transposition *t = (const Transposition *)context;                                        \
    const size_t rows = t->rows, cols = t->cols, per_tile_row = TILE * cols;                        \
    size_t unit;                                                                                    \
    for (unit = start / per_tile_row; unit < (stop + per_tile_row - 1) / per_tile_row; unit++) {    \
        const size_t matrix = unit / t->row_tiles, i0 = unit % t->row_tiles * TILE;                 \
        const size_t height = rows - i0 < TILE ? rows - i0 : TILE;                                  \
        const uint16_t *src = t->src + matrix * rows * cols;                                        \
        uint16_t *dst = t->dst + matrix * rows * cols;                                              \
        size_t j0;                                                                                  \
        for (j0 = 0; j0 < cols; j0 += TILE) {                                                       \
            const size_t width = cols - j0 < TILE ? cols - j0 : TILE;                               \
            const size_t down = height / 8 * 8, across = width / 8 * 8;                             \
            size_t i, j;                                                                            \
            if (rows > cols) {                                                                      \
                for (j = 0; j < across; j += 8)                                                     \
                    for (i = 0; i < down; i += 8)                                                   \
                        BLOCK(src + (i0 + i) * cols + j0 + j, cols, dst + (j0 + j) * rows + i0 + i, \
                              rows, t->to_bfloat16);                                                \
            } else {                                                                                \
                for (i = 0; i < down; i += 8)                                                       \
                    for (j = 0; j < across; j += 8)                                                 \
                        BLOCK(src + (i0 + i) * cols + j0 + j, cols, dst + (j0 + j) * rows + i0 + i, \
                              rows, t->to_bfloat16);                                                \
            }                                                                                       \
            /* the edges the blocks leave, a value at a time */                                     \
            for (i = 0; i < height; i++)                                                            \
                for (j = i < down ? across : 0; j < width; j++) {                                   \
                    Halves one;                                                                     \
                    one.src = src + (i0 + i) * cols + j0 + j;                                       \
                    one.dst = dst + (j0 + j) * rows + i0 + i;                                       \
                    if (t->to_bfloat16)                                                             \
                        half_to_bfloat16_tail(&one, 0, 1);                                          \
                    else                                                                            \
                        bfloat16_to_half_tail(&one, 0, 1);                                          \
                }                                                                                   \
        }                                                                                           \
    }                                                                                               \
}

static inline void rows_converted_avx2(__m128i r[8], int to_bfloat16)
{
    int k;
    for (k = 0; k < 8; k++)
        r[k] = to_bfloat16 ? half8_to_bfloat16(r[k]) : bfloat16x8_to_half(r[k]);
}

static inline void block_avx2(const uint16_t *src, size_t cols, uint16_t *dst, size_t rows, int to_bfloat16)
{
    __m128i r[8];
    int k;
    for (k = 0; k < 8; k++)
        r[k] = _mm_loadu_si128((const __m128i *)(src + k * cols));
    rows_converted_avx2(r, to_bfloat16);
    transposed_8x8(r);
    for (k = 0; k < 8; k++)
        _mm_storeu_si128((__m128i *)(dst + k * rows), r[k]);
}

TRANSPOSE_CONVERTED(transpose_converted_avx2, block_avx2)

TARGET_POP()

/* Where each value of the two 512-bit registers an 8 x 8 block's rows were loaded into, two rows
 * a 256-bit half, goes transposed: output word p of the first holds column p / 8 of row p % 8,
 * which the rows put at word (p % 8) * 8 + p / 8; of the second, columns 4 to 7. */
static const uint16_t TRANSPOSED_WORDS[2][32] = {
    {0, 8, 16, 24, 32, 40, 48, 56, 1, 9, 17, 25, 33, 41, 49, 57,
     2, 10, 18, 26, 34, 42, 50, 58, 3, 11, 19, 27, 35, 43, 51, 59},
    {4, 12, 20, 28, 36, 44, 52, 60, 5, 13, 21, 29, 37, 45, 53, 61,
     6, 14, 22, 30, 38, 46, 54, 62, 7, 15, 23, 31, 39, 47, 55, 63},
};

/* An 8 x 8 block in 512-bit registers: two rows loaded into each 256-bit half and converted
 * together (CONVERT_PAIR), then the 64 values transposed by two permutes across both registers,
 * where eight 128-bit rows take 24 unpacks. */
#define TRANSPOSED_BLOCK_512(name, CONVERT_PAIR)                                                    \
static inline __m256i name##_pair(const uint16_t *first, size_t cols, int to_bfloat16)             \
{                                                                                                   \
    const __m256i pair = _mm256_inserti128_si256(                                                   \
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)first)),                            \
        _mm_loadu_si128((const __m128i *)(first + cols)), 1);                                       \
    return CONVERT_PAIR(pair, to_bfloat16);                                                         \
}                                                                                                   \
static inline void name(const uint16_t *src, size_t cols, uint16_t *dst, size_t rows, int to_bfloat16) \
{                                                                                                   \
    const __m512i upper = _mm512_inserti64x4(                                                       \
        _mm512_castsi256_si512(name##_pair(src, cols, to_bfloat16)),                                \
        name##_pair(src + 2 * cols, cols, to_bfloat16), 1);                                         \
    const __m512i lower = _mm512_inserti64x4(                                                       \
        _mm512_castsi256_si512(name##_pair(src + 4 * cols, cols, to_bfloat16)),                     \
        name##_pair(src + 6 * cols, cols, to_bfloat16), 1);                                         \
    const __m512i left = _mm512_permutex2var_epi16(                                                 \
        upper, _mm512_loadu_si512((const void *)TRANSPOSED_WORDS[0]), lower);                       \
    const __m512i right = _mm512_permutex2var_epi16(                                                \
        upper, _mm512_loadu_si512((const void *)TRANSPOSED_WORDS[1]), lower);                       \
    _mm_storeu_si128((__m128i *)dst, _mm512_castsi512_si128(left));                                 \
    _mm_storeu_si128((__m128i *)(dst + rows), _mm512_extracti32x4_epi32(left, 1));                  \
    _mm_storeu_si128((__m128i *)(dst + 2 * rows), _mm512_extracti32x4_epi32(left, 2));              \
    _mm_storeu_si128((__m128i *)(dst + 3 * rows), _mm512_extracti32x4_epi32(left, 3));              \
    _mm_storeu_si128((__m128i *)(dst + 4 * rows), _mm512_castsi512_si128(right));                   \
    _mm_storeu_si128((__m128i *)(dst + 5 * rows), _mm512_extracti32x4_epi32(right, 1));             \
    _mm_storeu_si128((__m128i *)(dst + 6 * rows), _mm512_extracti32x4_epi32(right, 2));             \
    _mm_storeu_si128((__m128i *)(dst + 7 * rows), _mm512_extracti32x4_epi32(right, 3));             \
}

TARGET_PUSH("avx512f,avx512bw,avx2,avx,f16c")

static inline __m256i pair_to_half_avx512(__m256i bfloat16s)
{
    const __m512i u = _mm512_slli_epi32(_mm512_cvtepu16_epi32(bfloat16s), 16);
    return _mm512_cvtps_ph(_mm512_castsi512_ps(u), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

static inline __m256i pair_converted_avx512(__m256i pair, int to_bfloat16)
{
    return to_bfloat16 ? _mm512_cvtepi32_epi16(rounded_to_bfloat16_512(_mm512_cvtph_ps(pair)))
                       : pair_to_half_avx512(pair);
}

TRANSPOSED_BLOCK_512(block_avx512, pair_converted_avx512)
TRANSPOSE_CONVERTED(transpose_converted_avx512, block_avx512)

TARGET_POP()

#if defined(HAVE_AVX512BF16)
TARGET_PUSH("avx512f,avx512bw,avx512bf16,avx2,avx,f16c")

static inline __m256i pair_converted_avx512bf16(__m256i pair, int to_bfloat16)
{
    return to_bfloat16 ? (__m256i)_mm512_cvtneps_pbh(_mm512_cvtph_ps(pair)) : pair_to_half_avx512(pair);
}

TRANSPOSED_BLOCK_512(block_avx512bf16, pair_converted_avx512bf16)
TRANSPOSE_CONVERTED(transpose_converted_avx512bf16, block_avx512bf16)

TARGET_POP()
#endif

/* The transposing loop for this CPU, by the variant in use, as reduced_conversions chooses. */
static PartBody reduced_transposition(void)
{
    if (!has_f16c)
        return NULL;
    if (strcmp(current->name, "avx512") == 0) {
#if defined(HAVE_AVX512BF16)
        if (has_avx512bf16)
            return transpose_converted_avx512bf16;
#endif
        return transpose_converted_avx512;
    }
    return strcmp(current->name, "avx2") == 0 ? transpose_converted_avx2 : NULL;
}

#else

static PartBody reduced_transposition(void)
{
    return NULL;
}

#endif

/* convert_reduced_transposed(src, dst, matrices, rows, cols, to_bfloat16, threads) -> whether it
 * converted: each of `matrices` rows x cols matrices of float16 (to_bfloat16 true) or bfloat16
 * values, laid one after another in src, converted to the other type and written transposed
 * (cols x rows) at the same place in dst, which must not overlap src. False, with nothing
 * written, where this CPU has no conversion loop. */
static PyObject *convert_reduced_transposed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[7];
    Transposition t;
    PartBody body;
    size_t tiles;
    if (!parse_addresses(args, nargs, 7, "convert_reduced_transposed", a))
        return NULL;
    body = reduced_transposition();
    if (body == NULL)
        Py_RETURN_FALSE;
    t.to_bfloat16 = a[5] != 0;
    t.src = (const uint16_t *)a[0];
    t.dst = (uint16_t *)a[1];
    t.rows = (size_t)a[3];
    t.cols = (size_t)a[4];
    t.row_tiles = (t.rows + TILE - 1) / TILE;
    tiles = (size_t)a[2] * t.row_tiles;
    if (tiles == 0 || t.cols == 0)
        Py_RETURN_TRUE;
    Py_BEGIN_ALLOW_THREADS
    parallel_for(tiles * TILE * t.cols, TILE * t.cols, (size_t)a[6], body, &t);
    Py_END_ALLOW_THREADS
    Py_RETURN_TRUE;
}

/* ---- long reductions in double ------------------------------------------------------------ */

/* Below this many elements in all a reduction runs on one thread: starting one costs more than
 * it saves (2^20 floats: 42 us on one thread, 66 us on two, AVX-512 EPYC). */
#define REDUCTION_ELEMENTS_PER_THREAD ((size_t)1 << 21)

static void *take_chunks(void *argument)
{
    Reduction *r = (Reduction *)argument;
    for (;;) {
        size_t chunk = __atomic_fetch_add(&r->next, 1, __ATOMIC_RELAXED);
        if (chunk >= r->chunks)
            return NULL;
        r->sum_chunk(r, chunk);
    }
}

/* reduce_f32(x, y, rows, run, kind, out, threads): for each of rows runs of run contiguous
 * float32 elements of x (and of y, for the two-input kinds), the sum of the kind's terms in
 * double, written to out[row] as float32: the sum itself, or its square root for the squares
 * (a 2-norm, a Euclidean distance). */
static PyObject *reduce_f32(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    uintptr_t a[7];
    Reduction r;
    size_t rows, row, threads, t;
    float *out;
    if (!parse_addresses(args, nargs, 7, "reduce_f32", a))
        return NULL;
    if (a[4] > SUM_SQUARED_DIFFERENCES) {
        PyErr_Format(PyExc_ValueError, "reduce_f32: no reduction of kind %zu", (size_t)a[4]);
        return NULL;
    }
    rows = (size_t)a[2];
    r.x = (const float *)a[0];
    r.y = (const float *)a[1];
    r.run = (size_t)a[3];
    r.kind = (int)a[4];
    out = (float *)a[5];
    r.chunks_per_row = (r.run + REDUCTION_CHUNK - 1) / REDUCTION_CHUNK;
    r.chunks = rows * r.chunks_per_row;
    r.next = 0;
    r.sum_chunk = current->loops->sum_chunk;
    if (r.chunks == 0)
        Py_RETURN_NONE;
    r.sums = (double *)malloc(r.chunks * sizeof(double));
    if (r.sums == NULL)
        return PyErr_NoMemory();
    threads = rows * r.run >= REDUCTION_ELEMENTS_PER_THREAD ? (size_t)a[6] : 1;
    if (threads > r.chunks)
        threads = r.chunks;
    if (threads > MAX_PARTS)
        threads = MAX_PARTS;
    Py_BEGIN_ALLOW_THREADS
    {
#if !defined(_WIN32)
        pthread_t handles[MAX_PARTS];
        int started[MAX_PARTS];
        for (t = 1; t < threads; t++)
            started[t] = pthread_create(&handles[t], NULL, take_chunks, &r) == 0;
        take_chunks(&r);
        for (t = 1; t < threads; t++)
            if (started[t])
                pthread_join(handles[t], NULL);
#else
        take_chunks(&r);
#endif
        for (row = 0; row < rows; row++) {
            double total = 0.0;
            size_t k;
            for (k = 0; k < r.chunks_per_row; k++)
                total += r.sums[row * r.chunks_per_row + k];
            out[row] = reduction_result(total, r.kind);
        }
    }
    Py_END_ALLOW_THREADS
    free(r.sums);
    Py_RETURN_NONE;
}

/* use_avx512bf16(flag) -> whether it was used: AVX512-BF16's conversions where the CPU has
 * them (flag true, as at import), else the integer rounding of the AVX-512 variant. */
static PyObject *use_avx512bf16(PyObject *module, PyObject *flag)
{
    const int wanted = PyObject_IsTrue(flag);
    int before = 0;
    if (wanted < 0)
        return NULL;
#if defined(__x86_64__) || defined(_M_X64)
    before = has_avx512bf16;
    read_conversion_features();
    if (!wanted)
        has_avx512bf16 = 0;
#endif
    return PyBool_FromLong(before);
}

/* ---- choosing the variant ---------------------------------------------------------------- */

/* variants() -> ((name, needs, runs here), ...), widest first. */
static PyObject *list_variants(PyObject *module, PyObject *unused)
{
    PyObject *out = PyTuple_New(VARIANT_COUNT);
    size_t v;
    if (out == NULL)
        return NULL;
    for (v = 0; v < VARIANT_COUNT; v++) {
        PyObject *row = Py_BuildValue("(ssO)", variants[v].name, variants[v].needs,
                                      variants[v].runs_here() ? Py_True : Py_False);
        if (row == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, v, row);
    }
    return out;
}

/* variant() -> the name of the variant the entry points run. */
static PyObject *variant(PyObject *module, PyObject *unused)
{
    return PyUnicode_FromString(current->name);
}

/* use_variant(name): run that variant from now on; ValueError where there is no such variant
 * or this CPU cannot run it. */
static PyObject *use_variant(PyObject *module, PyObject *name)
{
    const char *wanted = PyUnicode_AsUTF8(name);
    size_t v;
    if (wanted == NULL)
        return NULL;
    for (v = 0; v < VARIANT_COUNT; v++) {
        if (strcmp(variants[v].name, wanted) != 0)
            continue;
        if (!variants[v].runs_here()) {
            PyErr_Format(PyExc_ValueError, "this CPU cannot run the %s host kernels (they need %s)",
                         wanted, variants[v].needs);
            return NULL;
        }
        current = &variants[v];
        Py_RETURN_NONE;
    }
    PyErr_Format(PyExc_ValueError, "no host-kernel variant named '%s' in this build", wanted);
    return NULL;
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
    FASTCALL(convert_reduced,
             "convert_reduced(src, dst, n, to_bfloat16, threads) -> converted: float16 <-> bfloat16, where the CPU has F16C"),
    FASTCALL(convert_reduced_transposed,
             "convert_reduced_transposed(src, dst, matrices, rows, cols, to_bfloat16, threads) -> converted: "
             "float16 <-> bfloat16, each matrix transposed"),
    FASTCALL(reduce_f32,
             "reduce_f32(x, y, rows, run, kind, out, threads): per-run sums of |x|, x^2, x*y, |x-y|, (x-y)^2 in double"),
    FASTCALL(advise_huge, "advise_huge(address, nbytes): transparent huge pages for a fresh buffer"),
    {"variants", list_variants, METH_NOARGS, "variants() -> ((name, CPU features, runs here), ...), widest first"},
    {"variant", variant, METH_NOARGS, "variant() -> the name of the variant in use"},
    {"use_variant", use_variant, METH_O, "use_variant(name): run that variant from now on"},
    {"use_avx512bf16", use_avx512bf16, METH_O,
     "use_avx512bf16(flag) -> whether it was used: AVX512-BF16's conversions where the CPU has them"},
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
#if defined(__x86_64__) || defined(_M_X64)
    __builtin_cpu_init();
#endif
    read_conversion_features();
    current = widest_running_here();
    return PyModule_Create(&native_module);
}
