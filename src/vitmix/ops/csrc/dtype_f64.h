/* Instantiates the *_typed.h files for float64 (see dtype_f32.h). */
#define TYPE double
#define ITYPE int64_t
#define UTYPE uint64_t
#define SFX(name) name##_f64
#define SQRTFN sqrt
#define ERFFN erf
#define LOGFN log
#define EXPFN exp
#include "vec_typed.h"
