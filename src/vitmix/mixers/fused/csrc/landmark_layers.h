/* Exported functions of the landmark layers' library (landmark_layers.c; bound by vitmix.mixers.fused.library,
 * whose prototype table a test checks against these prototypes). The library also holds the Newton-Schulz
 * functions of newton.h. */
#ifndef VITMIX_LANDMARK_LAYERS_H
#define VITMIX_LANDMARK_LAYERS_H

#include <stdint.h>

int64_t vitmix_laplacian_mix_f32(const float *y, const float *conv_w, const float *conv_b, float *out, int64_t B,
                                 int64_t n, int64_t prefix, int64_t H, int64_t W, int64_t heads, int64_t d,
                                 int64_t mh, int64_t mw, float scale, float eps, int64_t iters, int rule,
                                 float norm_eps, float contrast, const float *mean_w, int64_t ksize, float *save,
                                 int nthreads);
int64_t vitmix_laplacian_mix_f64(const double *y, const double *conv_w, const double *conv_b, double *out,
                                 int64_t B, int64_t n, int64_t prefix, int64_t H, int64_t W, int64_t heads,
                                 int64_t d, int64_t mh, int64_t mw, double scale, double eps, int64_t iters,
                                 int rule, double norm_eps, double contrast, const double *mean_w, int64_t ksize,
                                 double *save, int nthreads);
int64_t vitmix_soft_mix_f32(const float *qp, const float *vp, const float *lm_w, const float *ln_w,
                            const float *ln_b, float ln_eps, const float *conv_w, float *out, int64_t B, int64_t n,
                            int64_t prefix, int64_t H, int64_t W, int64_t heads, int64_t d, int64_t mh, int64_t mw,
                            int64_t s, int pool_first, float scale, float eps, int64_t iters, int rule, int norm,
                            int64_t ksize, float *save, int nthreads);
int64_t vitmix_soft_mix_f64(const double *qp, const double *vp, const double *lm_w, const double *ln_w,
                            const double *ln_b, double ln_eps, const double *conv_w, double *out, int64_t B,
                            int64_t n, int64_t prefix, int64_t H, int64_t W, int64_t heads, int64_t d, int64_t mh,
                            int64_t mw, int64_t s, int pool_first, double scale, double eps, int64_t iters,
                            int rule, int norm, int64_t ksize, double *save, int nthreads);
int64_t vitmix_laplacian_mix_backward_f32(const float *y, const float *gout, const float *conv_w,
                                          const float *mean_w, const float *saved, float *dy, float *dconv_w,
                                          float *dconv_b, float *dmean, int64_t B, int64_t n, int64_t prefix,
                                          int64_t H, int64_t W, int64_t heads, int64_t d, int64_t mh, int64_t mw,
                                          float scale, float norm_eps, float contrast, int64_t ksize, int nthreads);
int64_t vitmix_laplacian_mix_backward_f64(const double *y, const double *gout, const double *conv_w,
                                          const double *mean_w, const double *saved, double *dy, double *dconv_w,
                                          double *dconv_b, double *dmean, int64_t B, int64_t n, int64_t prefix,
                                          int64_t H, int64_t W, int64_t heads, int64_t d, int64_t mh, int64_t mw,
                                          double scale, double norm_eps, double contrast, int64_t ksize,
                                          int nthreads);
int64_t vitmix_soft_mix_backward_f32(const float *qp, const float *vp, const float *lm_w, const float *ln_w,
                                     const float *ln_b, float ln_eps, const float *conv_w, const float *gout,
                                     const float *saved, float *dqp, float *dvp, float *dlmt, float *dln_w,
                                     float *dln_b, float *dconv_w, int64_t B, int64_t n, int64_t prefix, int64_t H,
                                     int64_t W, int64_t heads, int64_t d, int64_t mh, int64_t mw, int64_t s,
                                     int pool_first, float scale, int norm, int64_t ksize, int nthreads);
int64_t vitmix_soft_mix_backward_f64(const double *qp, const double *vp, const double *lm_w, const double *ln_w,
                                     const double *ln_b, double ln_eps, const double *conv_w, const double *gout,
                                     const double *saved, double *dqp, double *dvp, double *dlmt, double *dln_w,
                                     double *dln_b, double *dconv_w, int64_t B, int64_t n, int64_t prefix,
                                     int64_t H, int64_t W, int64_t heads, int64_t d, int64_t mh, int64_t mw,
                                     int64_t s, int pool_first, double scale, int norm, int64_t ksize,
                                     int nthreads);

#endif /* VITMIX_LANDMARK_LAYERS_H */
