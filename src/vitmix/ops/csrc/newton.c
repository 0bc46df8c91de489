/* Batched Newton–Schulz iteration V <- 2V - V (P V) on small m x m matrices (landmark kernels, m <= ~128).
 *
 * P, V: (B, m, m) contiguous; V holds the start V0 on entry and the result on return. One work item
 * per matrix: zero-padded copies of P and V (to a multiple of JB columns) and two scratch matrices
 * (4 mp^2 values, 64 KiB at m = 49 in float32), in the thread's scratch, stay in L1/L2 for all iterations;
 * each product (gemm_typed.h) keeps JB-wide blocks of a row in vector registers. Batched BLAS pays a
 * per-matrix call overhead that dominates at this size. Plain C99 + OpenMP (pthreads without it:
 * vitmix_parallel.h); no torch headers.
 */
#include "vitmix_simd.h"
#include "vitmix_parallel.h"
#include "newton.h"

#include "dtype_f32.h"
#include "gemm_typed.h"
#include "newton_typed.h"
#include "dtype_end.h"

#include "dtype_f64.h"
#include "gemm_typed.h"
#include "newton_typed.h"
#include "dtype_end.h"
