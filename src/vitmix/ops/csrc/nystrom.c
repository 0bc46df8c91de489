/* Nystrom attention's fused forwards and LaplacianFormer's / SOFT's training backwards (one library).
 *
 * One work item per (batch, head) slice: the kernel matrices C_q = k(Q, L_k), C_k = k(K, L_q),
 * W = k(L_q, L_k), M = NS(W + eps I) (the Newton-Schulz start and loop of newton_typed.h), then the
 * normalised product, in cache-resident buffers (nystrom_forward_typed.h); the layers' whole token mixing
 * (qkv gather, landmark pooling or conv, the local conv, head merge) and its backward
 * (nystrom_backward_typed.h, which reuses the forward's static helpers). What each step computes is
 * documented in vitmix.ops.nystrom.c and the fused layers' Python modules.
 */
#include "vitmix_simd.h"
#include "vitmix_exp.h"
#include "newton.h"
#include "nystrom.h"

#include "dtype_f32.h"
#include "newton_typed.h"
#include "dtype_end.h"

#include "dtype_f64.h"
#include "newton_typed.h"
#include "dtype_end.h"

#include "dtype_f32.h"
#define EXPFN exp_nonpos_f32
#include "nystrom_forward_typed.h"
#include "nystrom_backward_typed.h"
#include "dtype_end.h"

#include "dtype_f64.h"
#include "nystrom_forward_typed.h"
#include "nystrom_backward_typed.h"
#include "dtype_end.h"
