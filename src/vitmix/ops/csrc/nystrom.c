/* Nystrom attention's forward in one C call per batch of (batch, head) slices (inference; bound by
 * vitmix.ops.nystrom.c). One work item per slice: the kernel matrices C_q = k(Q, L_k), C_k = k(K, L_q),
 * W = k(L_q, L_k), M = NS(W + eps I) (the Newton-Schulz start and loop of newton_typed.h), then the normalised
 * product, in cache-resident buffers (nystrom_core_typed.h). What each step computes is documented in
 * vitmix.ops.nystrom.c.
 */
#include "vitmix_simd.h"
#include "vitmix_parallel.h"
#include "vitmix_exp.h"
#include "newton.h"
#include "nystrom.h"

#include "dtype_f32.h"
#define EXPFN exp_nonpos_f32
#include "gemm_typed.h"
#include "newton_typed.h"
#include "distance_typed.h"
#include "nystrom_core_typed.h"
#include "nystrom_typed.h"
#include "dtype_end.h"

#include "dtype_f64.h"
#include "gemm_typed.h"
#include "newton_typed.h"
#include "distance_typed.h"
#include "nystrom_core_typed.h"
#include "nystrom_typed.h"
#include "dtype_end.h"
