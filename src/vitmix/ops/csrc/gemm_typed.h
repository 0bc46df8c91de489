/* The small GEMMs of one dtype, shared by the Newton-Schulz loop (newton_typed.h), the Nystrom core
 * (nystrom_core_typed.h) and the landmark layers' backward: matrices of tens to a few hundred rows that stay in
 * cache, where a BLAS call costs more than the arithmetic. */

/* Sums over tokens (column means, and gemm's inner dimension, N for the normaliser's products) run in blocks
 * of SUM_BLOCK terms added to a total: float32 rounding then grows with SUM_BLOCK + N / SUM_BLOCK instead of
 * N. With one running sum, a LaplacianFormer stage at N = 1024 gave 7x the composed path's output error,
 * which the untrained pyramid's later stages amplified to a 3 % gradient error. */
#undef SUM_BLOCK
#define SUM_BLOCK 32

/* c[:, j0:j0+w] (row stride p, w <= JB lanes stored) = A b[:, j0:j0+w] (b's block at row stride p) for rows
 * i..i+rows of A (A[i, l] = a[i * si + l * sl]), rows <= 4: four broadcast-FMA chains share each load of b,
 * and the sums over l run in blocks of `block` terms (SUM_BLOCK; k: one running sum). A partial block (w < JB)
 * loads a full vector of each row of b, whose extra lanes belong to the next row and are never stored; only
 * the rows whose load would read past the end of b (the last one, more when p < JB) are copied into a
 * zero-padded vector. */
static void SFX(gemm_block)(const TYPE *a, int64_t si, int64_t sl, const TYPE *b, TYPE *c, int64_t p, int64_t i,
                           int64_t rows, int64_t k, int64_t w, int64_t block) {
    const TYPE *a0 = a + i * si, *a1 = a0 + (rows > 1) * si, *a2 = a0 + (rows > 2) * 2 * si;
    const TYPE *a3 = a0 + (rows > 3) * 3 * si;
    /* rows of b loaded as full vectors: those whose JB lanes end inside b, which ends w lanes into row k - 1 */
    const int64_t room = (k - 1) * p + w - JB;      /* the last offset a full load may start at */
    const int64_t last = room < 0 ? 0 : (room / p + 1 < k ? room / p + 1 : k);
    SFX(vec) acc[4] = {{0}}, bl;
    for (int64_t l0 = 0; l0 < k; l0 += block) {
        const int64_t l1 = k - l0 < block ? k : l0 + block;
        SFX(vec) s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        for (int64_t l = l0; l < l1; ++l) {
            if (l < last) {
                memcpy(&bl, b + l * p, sizeof bl);
            } else {
                bl = (SFX(vec)){0};
                memcpy(&bl, b + l * p, sizeof(TYPE) * (size_t)w);
            }
            s0 += a0[l * sl] * bl;
            s1 += a1[l * sl] * bl;
            s2 += a2[l * sl] * bl;
            s3 += a3[l * sl] * bl;
        }
        acc[0] += s0;
        acc[1] += s1;
        acc[2] += s2;
        acc[3] += s3;
    }
    for (int64_t r = 0; r < rows; ++r) memcpy(c + (i + r) * p, &acc[r], sizeof(TYPE) * (size_t)w);
}

/* c (n, p) = A b with A (n, k) read as A[i, l] = a[i * si + l * sl] (a or a transposed) and b (k, p)
 * row-major, the sums over l in blocks of `block` terms: rows of c go four at a time and each JB-wide block
 * of them is accumulated in vector registers over l, then stored once (the last block may be partial: m = 25
 * landmarks are 16 + 9 lanes). Blocks of four rows rather than of 4 JB columns: at m = 16 a 4 JB-wide row
 * block computed four times the useful columns (float32, AVX-512). At the sizes of one slice (N = 65,
 * m = 16, d = 32) the plain triple loop spent more time in loop overhead and loads/stores of c than in
 * arithmetic. */
static void SFX(gemm)(const TYPE *a, int64_t si, int64_t sl, const TYPE *restrict b, TYPE *restrict c, int64_t n,
                     int64_t k, int64_t p, int64_t block) {
    for (int64_t i = 0; i < n; i += 4) {
        const int64_t rows = n - i < 4 ? n - i : 4;
        for (int64_t j0 = 0; j0 < p; j0 += JB)
            SFX(gemm_block)(a, si, sl, b + j0, c + j0, p, i, rows, k, p - j0 < JB ? p - j0 : JB, block);
    }
}

/* c (n, p) = a (n, k) b (k, p), row-major */
static inline void SFX(mm)(const TYPE *restrict a, const TYPE *restrict b, TYPE *restrict c, int64_t n, int64_t k,
                           int64_t p) {
    SFX(gemm)(a, k, 1, b, c, n, k, p, SUM_BLOCK);
}

/* c (k, p) = a(n, k)^T b (n, p) */
static inline void SFX(mtm)(const TYPE *restrict a, const TYPE *restrict b, TYPE *restrict c, int64_t n, int64_t k,
                            int64_t p) {
    SFX(gemm)(a, 1, k, b, c, k, n, p, SUM_BLOCK);
}

/* c (n, p) = a (n, k) b (p, k)^T: b transposed into bt (k x p scratch), then gemm (dot products of rows
 * would end in one horizontal sum per element) */
static inline void SFX(mmt)(const TYPE *restrict a, const TYPE *restrict b, TYPE *restrict c, int64_t n, int64_t k,
                            int64_t p, TYPE *restrict bt) {
    for (int64_t j = 0; j < p; ++j)
        for (int64_t l = 0; l < k; ++l) bt[l * p + j] = b[j * k + l];
    SFX(gemm)(a, k, 1, bt, c, n, k, p, SUM_BLOCK);
}
