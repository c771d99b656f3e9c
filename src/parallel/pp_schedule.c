/* Pipeline schedules as lists of actions per stage (pp.h): GPipe (every forward, then every
 * backward) and 1F1B (PipeDream-flush, as Megatron-LM's non-interleaved schedule: a warm-up of
 * K-s-1 forwards, then one forward and one backward in turn, then the remaining backwards), so
 * that stage s never holds more than K-s micro-batches. With fewer micro-batches than stages the
 * warm-up is cut to M, and every stage still runs each micro-batch once each way. */
#include "parallel/pp.h"

#include <string.h>

void dt_pp_schedule(dt_pp_schedule_kind kind, int s, int K, int M, dt_pp_action *a) {
    int n = 0;
    if (kind == DT_PP_GPIPE) {
        for (int j = 0; j < M; j++) a[n++] = (dt_pp_action){.backward = false, .mb = j};
        for (int j = M - 1; j >= 0; j--) a[n++] = (dt_pp_action){.backward = true, .mb = j};
        return;
    }
    int warm = K - s - 1 < M ? K - s - 1 : M;
    if (warm < 0) warm = 0;
    int f = 0, b = 0;
    while (f < warm) a[n++] = (dt_pp_action){.backward = false, .mb = f++};
    while (f < M) {
        a[n++] = (dt_pp_action){.backward = false, .mb = f++};
        a[n++] = (dt_pp_action){.backward = true, .mb = b++};
    }
    while (b < M) a[n++] = (dt_pp_action){.backward = true, .mb = b++};
}

int dt_pp_schedule_peak(const dt_pp_action *a, int n) {
    int live = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        live += a[i].backward ? -1 : 1;
        if (live > peak) peak = live;
    }
    return peak;
}

dt_status dt_pp_schedule_parse(const char *name, dt_pp_schedule_kind *kind) {
    if (name && !strcmp(name, "gpipe")) *kind = DT_PP_GPIPE;
    else if (name && !strcmp(name, "1f1b")) *kind = DT_PP_1F1B;
    else return dt_error(DT_EINVAL, "`pp_schedule` %s: unknown schedule (choose gpipe or 1f1b)", name ? name : "");
    return DT_OK;
}

const char *dt_pp_schedule_name(dt_pp_schedule_kind kind) { return kind == DT_PP_1F1B ? "1f1b" : "gpipe"; }
