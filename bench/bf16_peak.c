/* The arithmetic ceiling of bf16 and fp16 against f32 on this CPU's AVX-512 units: throughput
 * of the instruction each precision's GEMM kernels are built on (f32: vfmadd231ps, 16 MACs;
 * bf16 without AMX: vdpbf16ps, 32 MACs; fp16: vfmadd231ph, 32 MACs), 24 independent zmm
 * accumulators (no latency chain), timed in process CPU time (best of 5, so a loaded machine
 * costs little). "x f32" is the MAC rate against vfmadd231ps: the most that bf16/fp16 kernels can
 * gain over f32 here before memory effects. (Measured on the Xeon family 6 model 207 without
 * AMX: vdpbf16ps retires ~1 per 2 cycles against 2 FMAs per cycle, so bf16 peaks at ~0.5x f32,
 * and oneDNN's jit_bf16 convolutions measure 0.5-0.9x of its f32 ones; vfmadd231ph reaches ~2x,
 * but it accumulates in fp16, which mixed precision with f32 sums does not.) Prints a table,
 * then a JSON line.
 *   cc -O2 -march=native bench/bf16_peak.c -o build/bench_bf16_peak && build/bench_bf16_peak */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <time.h>

#if defined(__AVX512F__)
#include <immintrin.h>

#define ITERS 20000000L
#define ACC24(X)                                                                                                   \
    X(0)                                                                                                           \
    X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17) X(18) X(19) X(20) \
        X(21) X(22) X(23)

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* rate_NAME(sink): instructions per second of 24 independent accumulators a0..a23 (declared and
 * initialised by INIT(i), distinct so that the compiler cannot merge them), each updated by
 * STEP(i) once per iteration, with operands x, y of type OPND set to X, Y and hidden from the
 * optimiser; REDUCE(i) folds an accumulator into the float s kept in *sink. */
#define RATE(NAME, INIT, OPND, X, Y, STEP, REDUCE) \
    static double rate_##NAME(float *sink) {       \
        ACC24(INIT)                                \
        OPND x = X, y = Y;                         \
        __asm__ volatile("" : "+v"(x), "+v"(y));   \
        double t = cpu_now();                      \
        for (long n = 0; n < ITERS; n++) {         \
            ACC24(STEP)                            \
        }                                          \
        t = cpu_now() - t;                         \
        float s = 0;                               \
        ACC24(REDUCE)                              \
        *sink += s;                                \
        return ITERS * 24.0 / t;                   \
    }

#define INIT_PS(i) __m512 a##i = _mm512_set1_ps((float)(i)*1e-9f);
#define SUM_PS(i) s += _mm512_reduce_add_ps(a##i);
#define FMA_PS(i) a##i = _mm512_fmadd_ps(x, y, a##i);
RATE(fma_ps, INIT_PS, __m512, _mm512_set1_ps(1.0001f), _mm512_set1_ps(0.9999f), FMA_PS, SUM_PS)

#if defined(__AVX512BF16__)
#define DP_BF16(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
RATE(dpbf16, INIT_PS, __m512bh, (__m512bh)_mm512_set1_epi16(0x3f80), (__m512bh)_mm512_set1_epi16(0x3f80), DP_BF16,
     SUM_PS)
#endif

#if defined(__AVX512FP16__)
#define INIT_PH(i) __m512h a##i = _mm512_set1_ph((_Float16)((float)(i)*1e-3f));
#define FMA_PH(i) a##i = _mm512_fmadd_ph(x, y, a##i);
#define SUM_PH(i) s += (float)_mm512_reduce_add_ph(a##i);
RATE(fma_ph, INIT_PH, __m512h, _mm512_set1_ph((_Float16)1.0f), _mm512_set1_ph((_Float16)0.0001f), FMA_PH, SUM_PH)
#endif

static double best_of(double (*f)(float *), float *sink) {
    double b = 0;
    for (int r = 0; r < 5; r++) {
        double v = f(sink);
        if (v > b) b = v;
    }
    return b;
}

int main(void) {
    float sink = 0;
    const double f32 = best_of(rate_fma_ps, &sink) * 16; /* MACs per second */
    double bf16 = 0, fp16 = 0;
#if defined(__AVX512BF16__)
    bf16 = best_of(rate_dpbf16, &sink) * 32;
#endif
#if defined(__AVX512FP16__)
    fp16 = best_of(rate_fma_ph, &sink) * 32;
#endif
    printf("%-22s %12s %8s\n", "instruction", "GMAC/s", "x f32");
    printf("%-22s %12.1f %7.2fx\n", "vfmadd231ps (f32)", f32 / 1e9, 1.0);
    if (bf16 > 0) printf("%-22s %12.1f %7.2fx\n", "vdpbf16ps (bf16)", bf16 / 1e9, bf16 / f32);
    else printf("%-22s %12s %8s\n", "vdpbf16ps (bf16)", "-", "(no AVX512-BF16 in this build)");
    if (fp16 > 0) printf("%-22s %12.1f %7.2fx\n", "vfmadd231ph (fp16)", fp16 / 1e9, fp16 / f32);
    else printf("%-22s %12s %8s\n", "vfmadd231ph (fp16)", "-", "(no AVX512-FP16 in this build)");
    printf(
        "{\"bench\": \"bf16_peak\", \"f32_gmacs\": %.2f, \"bf16_gmacs\": %.2f, \"fp16_gmacs\": %.2f, \"sink\": %g}\n",
        f32 / 1e9, bf16 / 1e9, fp16 / 1e9, (double)sink);
    return 0;
}
#else
int main(void) {
    printf("built without AVX-512 (-march=native on an AVX-512 CPU): nothing to measure\n");
    return 0;
}
#endif
