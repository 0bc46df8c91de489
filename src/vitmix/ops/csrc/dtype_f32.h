/* Instantiates a *_typed.h for float32 (included before it; dtype_end.h after): the element type, the
 * integer of its width (sign-bit masks), the name suffix of every function and the libm functions. A
 * library picks its own EXPFN (see vitmix_exp.h) before including the typed file. */
#define TYPE float
#define ITYPE int32_t
#define UTYPE uint32_t
#define SFX(name) name##_f32
#define SQRTFN sqrtf
#define ERFFN erff
#define LOGFN logf
