/* The dtype's native vector (included by dtype_f32.h / dtype_f64.h, so once per instantiation): JB lanes of
 * TYPE in one register of VEC_BYTES (vitmix_simd.h), its integer twin for bit operations, and ABSMASK, every
 * bit but the sign (|v| = v & ABSMASK, lane-wise). */
#define JB ((int64_t)(VEC_BYTES / sizeof(TYPE)))
typedef TYPE SFX(vec) __attribute__((vector_size(VEC_BYTES)));
typedef ITYPE SFX(ivec) __attribute__((vector_size(VEC_BYTES)));
#define ABSMASK ((SFX(ivec)){0} + (ITYPE)(~((UTYPE)1 << (8 * sizeof(TYPE) - 1))))
