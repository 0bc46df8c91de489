/* exp(x) for x <= 0 in float32 without a library call, so that loops over kernel matrices and softmax rows
 * vectorise. Two approximations, each kept with the library whose numbers were validated with it (a library
 * defines EXPFN as one of them before its float32 instantiation):
 *   exp_nonpos_f32: degree-7 Taylor polynomial, below float32 rounding (Nystrom kernel matrices);
 *   vitmix_expf: Cephes-style degree-6 polynomial, ~2e-7 relative (Fibottention's softmax).
 */
#ifndef VITMIX_EXP_H
#define VITMIX_EXP_H

#include <math.h>
#include <stdint.h>

/* exp(x) for x <= 0 in float32 without a library call, so the loop over a kernel matrix vectorises (~6x
 * faster than expf here): 2^n p(r) with r = x - n ln2 in [-ln2/2, ln2/2] (ln2 split in two for an exact
 * product) and p the degree-7 Taylor polynomial (truncation < 6e-9 relative, below float32 rounding).
 * x is clamped at -87 so 2^n stays a normal float: exp(-87) = 1.6e-38 stands for anything smaller. */
static inline float exp_nonpos_f32(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float fn = floorf(x * 1.44269504088896341f + 0.5f);
    const float r = (x - fn * 0.693359375f) - fn * -2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { int32_t i; float f; } two_n;
    two_n.i = ((int32_t)fn + 127) << 23;
    return p * two_n.f;
}

/* exp for x <= 0 (softmax weights), vectorisable: Cephes-style range reduction + degree-6
 * polynomial, max relative error ~2e-7 on [-87, 0]; below -87 it returns ~1e-38, negligible next
 * to the row maximum's weight of 1. */
static inline __attribute__((always_inline)) float vitmix_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;
    union { int32_t i; float f; } u;
    u.i = ((int32_t)n + 127) << 23;
    return y * u.f;
}

#endif /* VITMIX_EXP_H */
