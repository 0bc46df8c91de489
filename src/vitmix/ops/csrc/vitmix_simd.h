/* Shared by every vitmix C library: standard headers and the native vector width.
 *
 * The libraries are plain C99 (+ OpenMP where available, pthreads without: vitmix_parallel.h), no torch
 * headers; vitmix.ops._cbuild compiles each .c of this folder on first use. Code written once for both
 * dtypes lives in *_typed.h files that a .c includes once per dtype, between dtype_f32.h / dtype_f64.h and
 * dtype_end.h (TYPE, SFX(name), JB, ... below those).
 */
#ifndef VITMIX_SIMD_H
#define VITMIX_SIMD_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* VEC_BYTES: one native vector register (64-byte AVX-512, 32-byte AVX/AVX2, else 16 bytes); a typed body
 * takes JB = VEC_BYTES / sizeof(TYPE) lanes. A wider GCC vector type than the target has is lowered through
 * memory: with JB fixed at 16 floats the AVX2 build ran 12x slower than with 8 (Newton-Schulz loop, m = 49). */
#if defined(__AVX512F__)
#define VEC_BYTES 64
#elif defined(__AVX__)
#define VEC_BYTES 32
#else
#define VEC_BYTES 16
#endif

#endif /* VITMIX_SIMD_H */
