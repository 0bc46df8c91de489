/* LaplacianFormer's and SOFT's token mixing in one C call each way (bound by vitmix.mixers.fused.library).
 *
 * One work item per (batch, head) slice. Forward (landmark_layers_typed.h): gather the head's q, k, v from
 * the projections, the landmarks (adaptive pooling; SOFT's strided conv + LayerNorm + GELU), the Nystrom slice
 * of vitmix/ops/csrc (kernel matrices, Newton-Schulz, injective map or SOFT-Norm), the local conv, the head
 * merge. Backward (landmark_layers_backward_typed.h): the same steps' gradients, recomputing the normaliser's
 * intermediates. What each step computes is documented in vitmix.mixers.fused.
 */
#include "vitmix_simd.h"
#include "vitmix_parallel.h"
#include "vitmix_exp.h"
#include "newton.h"
#include "landmark_layers.h"

#include "dtype_f32.h"
#define EXPFN exp_nonpos_f32
#include "gemm_typed.h"
#include "newton_typed.h"
#include "distance_typed.h"
#include "nystrom_core_typed.h"
#include "landmark_layers_typed.h"
#include "landmark_layers_backward_typed.h"
#include "dtype_end.h"

#include "dtype_f64.h"
#include "gemm_typed.h"
#include "newton_typed.h"
#include "distance_typed.h"
#include "nystrom_core_typed.h"
#include "landmark_layers_typed.h"
#include "landmark_layers_backward_typed.h"
#include "dtype_end.h"
