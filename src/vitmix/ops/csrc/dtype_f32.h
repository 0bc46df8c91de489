/* Instantiates the *_typed.h files for float32 (included before them; dtype_end.h after; once per library, as
 * the vector types below are typedefs): the element type, the integer of its width (sign-bit masks), the name
 * suffix of every function, the libm functions and the native vector (vec_typed.h). A library picks its own
 * EXPFN (see vitmix_exp.h) before including the typed files. */
#define TYPE float
#define ITYPE int32_t
#define UTYPE uint32_t
#define SFX(name) name##_f32
#define SQRTFN sqrtf
#define ERFFN erff
#define LOGFN logf
#include "vec_typed.h"
