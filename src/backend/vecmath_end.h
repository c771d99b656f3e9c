/* Ends a vecmath.h section: undefines its names (AV_VL, AV_TARGET and AV_SUFFIX too). */
#undef vf
#undef vi
#undef vfu
#undef AV_SET1
#undef AV_FMA
#undef AV_MAX
#undef AV_LOAD
#undef AV_STORE
#undef AV_FN
#undef AV
#undef AV_CAT
#undef AV_CAT2
#undef AV_VL
#undef AV_TARGET
#undef AV_SUFFIX
