/* Ends an instantiation begun by dtype_f32.h or dtype_f64.h. */
#undef TYPE
#undef ITYPE
#undef UTYPE
#undef SFX
#undef SQRTFN
#undef ERFFN
#undef LOGFN
#undef EXPFN
#undef JB
#undef ABSMASK
