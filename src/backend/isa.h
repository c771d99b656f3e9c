/* The vector instruction sets the fused CPU kernels are built for (attention, GELU), checked at run
 * time: a kernel's AVX-512 or AVX2 + FMA copy runs only where __builtin_cpu_supports says the CPU
 * (or valgrind's emulation of it) has that set, else its portable C version. */
#ifndef DT_BACKEND_ISA_H
#define DT_BACKEND_ISA_H

/* The vector copies exist on x86 only; elsewhere every kernel runs its portable version. */
#if defined(__x86_64__) || defined(__i386__)
#define DT_ISA_X86 1
#else
#define DT_ISA_X86 0
#endif

typedef enum { DT_ISA_PORTABLE, DT_ISA_AVX2, DT_ISA_AVX512, DT_ISA_COUNT } dt_isa;

/* Whether this CPU runs isa; the widest one it runs; a name ("portable", "avx2", "avx512"). */
int dt_isa_supported(dt_isa isa);
dt_isa dt_isa_best(void);
const char *dt_isa_name(dt_isa isa);

#endif
