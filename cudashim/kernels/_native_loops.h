/* The loops of the host kernels, compiled once per instruction set (_native.c includes this
 * file once per variant, each time with VARIANT naming it and SIMD_LEVEL saying what it may
 * use, under a target pragma that lets the compiler use that instruction set here only).
 *
 * SIMD_LEVEL 3: AVX-512 F+BW (x86-64); 2: AVX2 (x86-64); 1: SSE2 (every x86-64);
 * 0: the compiler's vector extensions alone (NEON on arm64, whatever other hosts have).
 *
 * Every variant gives the same bits: the masks and shuffles below only move bits, the float
 * arithmetic is the same operations in the same order in each (the sums of squares keep
 * eight lanes everywhere, and the build turns off contraction into fused multiply-adds).
 */

#define V_JOIN_(name, variant) name##_##variant
#define V_JOIN(name, variant) V_JOIN_(name, variant)
#define V(name) V_JOIN(name, VARIANT)

/* ---- bit packing ------------------------------------------------------------------------ */

/* Eight bytes of 0/1 flags, each read at bit 0, packed: the packed byte of flags 8i..8i+7 in
 * byte i of the word, in the bit order asked for (little: element k at bit k; big: at bit
 * 7 - k). Where the instruction set has a byte shuffle, big order reverses each group of
 * eight flags before the mask is taken; elsewhere the word's bytes are reversed after. */
static inline uint64_t V(flags_word)(const unsigned char *src, int little)
{
#if SIMD_LEVEL >= 3
    const __m512i reverse = _mm512_set_epi64(
        0x08090A0B0C0D0E0FLL, 0x0001020304050607LL, 0x08090A0B0C0D0E0FLL, 0x0001020304050607LL,
        0x08090A0B0C0D0E0FLL, 0x0001020304050607LL, 0x08090A0B0C0D0E0FLL, 0x0001020304050607LL);
    __m512i flags = _mm512_loadu_si512((const void *)src);
    if (!little)
        flags = _mm512_shuffle_epi8(flags, reverse);
    return (uint64_t)_mm512_test_epi8_mask(flags, _mm512_set1_epi8(1));
#elif SIMD_LEVEL == 2
    const __m256i reverse = _mm256_set_epi64x(0x08090A0B0C0D0E0FLL, 0x0001020304050607LL,
                                              0x08090A0B0C0D0E0FLL, 0x0001020304050607LL);
    __m256i low = _mm256_loadu_si256((const __m256i *)src);
    __m256i high = _mm256_loadu_si256((const __m256i *)(src + 32));
    if (!little) {
        low = _mm256_shuffle_epi8(low, reverse);
        high = _mm256_shuffle_epi8(high, reverse);
    }
    return (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(low, 7))
         | (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(high, 7)) << 32;
#elif SIMD_LEVEL == 1
    /* Sixteen bytes to a register: each 0/1 shifted up to the top bit, then one mask. */
    uint64_t word = 0;
    int q;
    for (q = 0; q < 4; q++) {
        const __m128i flags = _mm_loadu_si128((const __m128i *)(src + 16 * q));
        word |= (uint64_t)(unsigned)_mm_movemask_epi8(_mm_slli_epi16(flags, 7)) << (16 * q);
    }
    return little ? word : reverse_each_byte(word);
#else
    const uint64_t multiplier = little ? PACK_LITTLE : PACK_BIG;
    uint64_t word = 0, eight;
    int q;
    for (q = 0; q < 8; q++) {
        memcpy(&eight, src + 8 * q, 8);
        word |= ((eight * multiplier) >> 56) << (8 * q);
    }
    return word;
#endif
}

static void V(pack_part)(void *context, size_t start, size_t stop, size_t part)
{
    const Bytes *b = (const Bytes *)context;
    const uint64_t multiplier = b->little ? PACK_LITTLE : PACK_BIG;
    size_t i = start;
    if (b->little) {                          /* two loops: the order is a constant in each */
        for (; i + 8 <= stop; i += 8) {
            const uint64_t word = V(flags_word)(b->src + 8 * i, 1);
            __builtin_prefetch(b->src + 8 * i + PREFETCH_AHEAD);
            memcpy(b->dst + i, &word, 8);
        }
    } else {
        for (; i + 8 <= stop; i += 8) {
            const uint64_t word = V(flags_word)(b->src + 8 * i, 0);
            __builtin_prefetch(b->src + 8 * i + PREFETCH_AHEAD);
            memcpy(b->dst + i, &word, 8);
        }
    }
    for (; i < stop; i++) {
        uint64_t word;
        memcpy(&word, b->src + 8 * i, 8);
        b->dst[i] = (unsigned char)((word * multiplier) >> 56);
    }
}

static void V(unpack_part)(void *context, size_t start, size_t stop, size_t part)
{
    const Bytes *b = (const Bytes *)context;
    const uint64_t *table = unpack_table[b->little];
    size_t i = start;
#if SIMD_LEVEL >= 3
    /* Eight packed bytes are a 64-bit mask (once each byte's bits are in element order):
     * one masked move spreads it to 64 bytes of 0/1. */
    const __m512i ones = _mm512_set1_epi8(1);
    for (; i + 8 <= stop; i += 8) {
        uint64_t word;
        memcpy(&word, b->src + i, 8);
        if (!b->little)
            word = reverse_each_byte(word);
        _mm512_storeu_si512((void *)(b->dst + 8 * i), _mm512_maskz_mov_epi8((__mmask64)word, ones));
    }
#elif SIMD_LEVEL == 2
    /* Four packed bytes broadcast, byte k copied to bytes 8k..8k+7, each copy tested at its
     * own bit: 32 flags to a register. */
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = b->little
        ? _mm256_set1_epi64x(0x8040201008040201LL)
        : _mm256_set1_epi64x(0x0102040810204080LL);
    const __m256i ones = _mm256_set1_epi8(1);
    for (; i + 4 <= stop; i += 4) {
        int32_t four;
        __m256i copies;
        memcpy(&four, b->src + i, 4);
        copies = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(four), spread), bit);
        _mm256_storeu_si256((__m256i *)(b->dst + 8 * i),
                            _mm256_and_si256(_mm256_cmpeq_epi8(copies, bit), ones));
    }
#else
    for (; i + 2 <= stop; i += 2) {           /* two table words, one 16-byte store */
        const uint64_t pair[2] = {table[b->src[i]], table[b->src[i + 1]]};
        memcpy(b->dst + 8 * i, pair, 16);
    }
#endif
    for (; i < stop; i++)
        memcpy(b->dst + 8 * i, &table[b->src[i]], 8);
}

/* ---- 1-bit compression ------------------------------------------------------------------ */

/* The packed sign byte of eight floats (big bit order): one compare and mask where the
 * instruction set has them, one compare a float elsewhere; the same bits (x >= 0 is false
 * for NaN in each). */
static inline unsigned char V(sign_byte)(const float *x)
{
#if SIMD_LEVEL >= 2
    return reversed[_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x), _mm256_setzero_ps(),
                                                      _CMP_GE_OQ))];
#elif SIMD_LEVEL == 1
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

/* Eight lanes in every variant, folded in lane order: the sum does not depend on it. */
static double V(block_squares)(const float *x, size_t n)
{
    f8 lanes = {0, 0, 0, 0, 0, 0, 0, 0};
    double total = 0.0;
    size_t i;
    int k;
    for (i = 0; i + 8 <= n; i += 8) {
        const f8 a = LOAD8(x + i);
        lanes += a * a;
    }
    for (; i < n; i++)
        lanes[0] += x[i] * x[i];
    for (k = 0; k < 8; k++)
        total += lanes[k];
    return total;
}

/* Pass one of the worker side: compensate (x += buffer), then sum the squares. */
static void V(compensate_part)(void *context, size_t start, size_t stop, size_t part)
{
    Compression *c = (Compression *)context;
    double squares = 0.0;
    size_t block, i;
    for (block = start; block < stop; block += BLOCK) {
        size_t end = block + BLOCK < stop ? block + BLOCK : stop;
        size_t added = end < c->buffer_n ? end : c->buffer_n;
        for (i = block; i < added; i++)
            c->x[i] += c->buffer[i];
        squares += V(block_squares)(c->x + block, end - block);
    }
    c->squares[part] = squares;
}

/* Pass one of the server side: x += (sum over rows of sign * scale) / rows, as the portable
 * version computes it (row by row, then divided), then sum the squares. */
static void V(server_part)(void *context, size_t start, size_t stop, size_t part)
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
            f8 sum = LOAD8(sign_table[signs[i / 8]]) * c->scales[0];
            for (r = 1; r < rows; r++)
                sum += LOAD8(sign_table[signs[r * row_bytes + i / 8]]) * c->scales[r];
            STORE8(x + i, LOAD8(x + i) + sum / divisor);
        }
        squares += V(block_squares)(x + block, end - block);
    }
    c->squares[part] = squares;
}

/* Pass two: pack the signs of x; x becomes what they miss, x - (+scale or -scale). */
static void V(residue_part)(void *context, size_t start, size_t stop, size_t part)
{
    Compression *c = (Compression *)context;
    float *restrict x = c->x;
    unsigned char *restrict packed = c->packed;
    const float scale = c->scale;
    size_t i;
    for (i = start; i < stop; i += 8) {
        const unsigned char byte = V(sign_byte)(x + i);
        packed[i / 8] = byte;
        STORE8(x + i, LOAD8(x + i) - LOAD8(sign_table[byte]) * scale);
    }
}

static void V(pack_signs_part)(void *context, size_t start, size_t stop, size_t part)
{
    const Compression *c = (const Compression *)context;
    size_t i;
    for (i = start; i < stop; i += 8)
        c->packed[i / 8] = V(sign_byte)(c->x + i);
}

/* out[j] = sign j of the packed bits times the scale of j's row (columns elements a row). */
static void V(expand_part)(void *context, size_t start, size_t stop, size_t part)
{
    const Expansion *e = (const Expansion *)context;
    const unsigned char *restrict packed = e->packed;
    float *restrict out = e->out;
    size_t j = start;
    while (j < stop) {
        const size_t row = j / e->columns, row_stop = (row + 1) * e->columns;
        const size_t end = row_stop < stop ? row_stop : stop;
        const float scale = e->scales[row];
        for (; j + 8 <= end; j += 8)
            STORE8(out + j, LOAD8(sign_table[packed[j / 8]]) * scale);
        for (; j < end; j++)
            out[j] = sign_table[packed[j / 8]][j % 8] * scale;
    }
}

/* ---- long reductions ------------------------------------------------------------------- */

/* Terms are summed in float32 over a stretch of this many elements (four accumulators of eight
 * lanes, eight terms each), and each stretch's sum is added to a double: the error is a float's
 * rounding over 256 terms, not over the whole run, as CUDA's tree reductions keep it. */
#define STRETCH 256

/* |v|, lane by lane: the sign bits cleared (a macro: an f8 passed by value would have one calling
 * convention with AVX and another without). */
#define ABSOLUTE8(v) ((f8)((i8)(v) & 0x7fffffff))

#define TERM_ABS(i) ABSOLUTE8(LOAD8(x + (i)))
#define TERM_SQUARES(i) (LOAD8(x + (i)) * LOAD8(x + (i)))
#define TERM_PRODUCTS(i) (LOAD8(x + (i)) * LOAD8(y + (i)))
#define TERM_ABS_DIFFERENCES(i) ABSOLUTE8(LOAD8(x + (i)) - LOAD8(y + (i)))
#define TERM_SQUARED_DIFFERENCES(i) ((LOAD8(x + (i)) - LOAD8(y + (i))) * (LOAD8(x + (i)) - LOAD8(y + (i))))

/* The stretches of [start, stop) summed for one kind: a loop of its own, so that the kind is not
 * decided per element. The last few elements go to lane 0, in order. */
#define STRETCH_SUMS(TERM, scalar)                                                            \
    for (begin = start; begin < stop; begin += STRETCH) {                                     \
        const size_t end = begin + STRETCH < stop ? begin + STRETCH : stop;                   \
        f8 a0 = {0, 0, 0, 0, 0, 0, 0, 0}, a1 = a0, a2 = a0, a3 = a0;                          \
        size_t i = begin;                                                                     \
        int k;                                                                                \
        for (; i + 32 <= end; i += 32) {                                                      \
            a0 += TERM(i);                                                                    \
            a1 += TERM(i + 8);                                                                \
            a2 += TERM(i + 16);                                                               \
            a3 += TERM(i + 24);                                                               \
        }                                                                                     \
        for (; i + 8 <= end; i += 8)                                                          \
            a0 += TERM(i);                                                                    \
        for (; i < end; i++)                                                                  \
            a0[0] += (scalar);                                                                \
        a0 = (a0 + a1) + (a2 + a3);                                                           \
        for (k = 0; k < 8; k++)                                                               \
            total += a0[k];                                                                   \
    }

/* The kind's terms over x[start:stop] (and y's), summed stretch by stretch into a double. */
static double V(sum_terms)(const float *x, const float *y, size_t start, size_t stop, int kind)
{
    double total = 0.0;
    size_t begin;
    switch (kind) {
    case SUM_ABS:
        STRETCH_SUMS(TERM_ABS, fabsf(x[i]))
        break;
    case SUM_SQUARES:
        STRETCH_SUMS(TERM_SQUARES, x[i] * x[i])
        break;
    case SUM_PRODUCTS:
        STRETCH_SUMS(TERM_PRODUCTS, x[i] * y[i])
        break;
    case SUM_ABS_DIFFERENCES:
        STRETCH_SUMS(TERM_ABS_DIFFERENCES, fabsf(x[i] - y[i]))
        break;
    default:
        STRETCH_SUMS(TERM_SQUARED_DIFFERENCES, (x[i] - y[i]) * (x[i] - y[i]))
        break;
    }
    return total;
}

/* One chunk of a long reduction (see reduce_f32): its sum, in its place. */
static void V(sum_chunk)(void *context, size_t chunk)
{
    Reduction *r = (Reduction *)context;
    const size_t row = chunk / r->chunks_per_row, within = chunk % r->chunks_per_row;
    const size_t start = row * r->run + within * REDUCTION_CHUNK;
    const size_t stop = row * r->run + ((within + 1) * REDUCTION_CHUNK < r->run ? (within + 1) * REDUCTION_CHUNK : r->run);
    r->sums[chunk] = V(sum_terms)(r->x, r->y, start, stop, r->kind);
}

#undef STRETCH_SUMS
#undef ABSOLUTE8
#undef TERM_ABS
#undef TERM_SQUARES
#undef TERM_PRODUCTS
#undef TERM_ABS_DIFFERENCES
#undef TERM_SQUARED_DIFFERENCES
#undef STRETCH

static const Loops V(loops) = {
    V(pack_part), V(unpack_part), V(compensate_part), V(server_part), V(residue_part),
    V(pack_signs_part), V(expand_part), V(sum_chunk),
};

#undef V
#undef V_JOIN
#undef V_JOIN_
