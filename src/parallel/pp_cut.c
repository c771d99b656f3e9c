/* The cut of a model's graph into pipeline stages (pp.h). A stage boundary is valid where a
 * single activation crosses it (node k-1, read by the stages above): transformer block ends, the
 * layers of a sequential model. The balanced cut minimises the cost of the most expensive stage
 * over the valid boundaries (dynamic programming over the prefix sums of the per-node cost);
 * --pp-split names the boundaries instead, by node index or name. */
#include "parallel/pp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool dt_pp_cut_valid(const dt_model *m, int k) {
    const int n = dt_model_num_nodes(m), loss = dt_model_loss_node(m);
    if (k < 1 || k >= n || (loss >= 0 && k > loss)) return false;
    /* the crossing values need memory of their own: not a graph input, nor an alias of one */
    if (dt_model_node_kind(m, dt_model_node_owner(m, k - 1)) == DT_LAYER_INPUT) return false;
    if (dt_model_node_fused(m, k - 1)) return false; /* its values are computed with the next node's */
    int in[2];
    return dt_model_cut_inputs(m, k, in, 2) == 1 && in[0] == k - 1;
}

/* "3 (name), 7 (name), ..." of the valid cuts, for messages. */
static const char *valid_list(const dt_model *m) {
    static char buf[1024];
    size_t k = 0;
    buf[0] = 0;
    for (int i = 1; i < dt_model_num_nodes(m) && k < sizeof buf - 1; i++)
        if (dt_pp_cut_valid(m, i))
            k += (size_t)snprintf(buf + k, sizeof buf - k, "%s%d (%s)", k ? ", " : "", i, dt_model_node_name(m, i));
    return buf[0] ? buf : "none";
}

/* The node a split item names: an index, or a node's name. -1 if none. */
static int split_node(const dt_model *m, const char *item) {
    char *end;
    long v = strtol(item, &end, 10);
    if (*item && !*end) return v >= 0 && v < dt_model_num_nodes(m) ? (int)v : -1;
    for (int i = 0; i < dt_model_num_nodes(m); i++)
        if (!strcmp(dt_model_node_name(m, i), item)) return i;
    return -1;
}

static dt_status parse_split(const dt_model *m, int K, const char *split, int *first) {
    char buf[160];
    snprintf(buf, sizeof buf, "%s", split);
    const size_t n = strlen(split);
    if (split[0] == ':' || (n && split[n - 1] == ':') || strstr(split, "::"))
        return dt_error(DT_EINVAL,
                        "`pp_split` %s: an empty cut; give %d stage boundar%s as N1:N2:... (node indices "
                        "or names)",
                        split, K - 1, K - 1 == 1 ? "y" : "ies");
    int c = 1;
    for (char *save = NULL, *tok = strtok_r(buf, ":", &save); tok; tok = strtok_r(NULL, ":", &save), c++) {
        if (c >= K)
            return dt_error(DT_EINVAL, "`pp_split` %s: %d stages need %d cut%s, not more", split, K, K - 1,
                            K - 1 == 1 ? "" : "s");
        int k = split_node(m, tok);
        if (k < 0 || !dt_pp_cut_valid(m, k))
            return dt_error(DT_EINVAL,
                            "`pp_split` %s: '%s' is not a valid stage boundary; valid first nodes of a "
                            "stage: %s",
                            split, tok, valid_list(m));
        if (k <= first[c - 1])
            return dt_error(DT_EINVAL, "`pp_split` %s: the cuts must increase ('%s' is not after the previous one)",
                            split, tok);
        first[c] = k;
    }
    if (c != K)
        return dt_error(DT_EINVAL, "`pp_split` %s: %d stages need %d cuts (N1:N2:...), got %d", split, K, K - 1, c - 1);
    return DT_OK;
}

/* Minimises the most expensive stage: best[i][j] = the cheapest max over stages 0..i when stage i
 * ends at valid cut v[j]. */
static dt_status balance(const dt_model *m, int K, const double *pre, int *first) {
    const int n = dt_model_num_nodes(m);
    int *v = malloc(sizeof(int) * (size_t)(n + 1)), nv = 0;
    double *best = malloc(sizeof(double) * (size_t)(n + 1) * (size_t)K);
    int *from = malloc(sizeof(int) * (size_t)(n + 1) * (size_t)K);
    if (!v || !best || !from) {
        free(v), free(best), free(from);
        return dt_error(DT_ENOMEM, "pipeline cut: out of memory");
    }
    for (int k = 1; k < n; k++)
        if (dt_pp_cut_valid(m, k)) v[nv++] = k;
    v[nv++] = n; /* the end of the last stage */
    dt_status st = DT_OK;
    if (nv < K) {
        st = dt_error(DT_EINVAL, "`pp` %d: the model has only %d valid stage boundar%s (%s); use at most %d stages", K,
                      nv - 1, nv - 1 == 1 ? "y" : "ies", valid_list(m), nv);
        goto done;
    }
    for (int j = 0; j < nv; j++) best[j] = pre[v[j]], from[j] = -1;
    for (int i = 1; i < K; i++)
        for (int j = 0; j < nv; j++) {
            best[i * nv + j] = 1e300, from[i * nv + j] = -1;
            for (int q = 0; q < j; q++) {
                if (best[(i - 1) * nv + q] >= 1e300) continue;
                double c = pre[v[j]] - pre[v[q]], mx = c > best[(i - 1) * nv + q] ? c : best[(i - 1) * nv + q];
                if (mx < best[i * nv + j]) best[i * nv + j] = mx, from[i * nv + j] = q;
            }
        }
    first[K] = n;
    for (int i = K - 1, j = nv - 1; i > 0; i--) {
        j = from[i * nv + j];
        first[i] = v[j];
    }
done:
    free(v), free(best), free(from);
    return st;
}

/* The flops cut, remembered per stage count for the model last asked about: a plan of every rank
 * (--dry-run), or of many layouts (the planner), asks for the same cuts again. */
static dt_status flops_cut(const dt_model *m, int pp, int *first) {
    static _Thread_local struct {
        const dt_model *m;
        char spec[256];
        int nodes;
        bool have[DT_PP_MAX_STAGES + 1];
        int first[DT_PP_MAX_STAGES + 1][DT_PP_MAX_STAGES + 1];
    } c;
    const int n = dt_model_num_nodes(m);
    if (c.m != m || c.nodes != n || strncmp(c.spec, dt_model_spec(m), sizeof c.spec)) { /* another model */
        memset(c.have, 0, sizeof c.have);
        c.m = m, c.nodes = n;
        snprintf(c.spec, sizeof c.spec, "%s", dt_model_spec(m));
    }
    if (!c.have[pp]) {
        DT_TRY(dt_pp_cut(m, pp, "", NULL, c.first[pp]));
        c.have[pp] = true;
    }
    memcpy(first, c.first[pp], (size_t)(pp + 1) * sizeof *first);
    return DT_OK;
}

dt_status dt_pp_mem_plan(dt_model *m, dt_mem_share *sh) {
    if (sh->pp <= 1) return DT_OK;
    if (sh->pp > DT_PP_MAX_STAGES)
        return dt_error(DT_EINVAL, "memory plan: pp %d: at most %d stages", sh->pp, DT_PP_MAX_STAGES);
    int first[DT_PP_MAX_STAGES + 1];
    DT_TRY(flops_cut(m, sh->pp, first));
    return dt_mem_part_values(m, first[sh->stage], first[sh->stage + 1], sh->tp, &sh->mine);
}

dt_status dt_pp_cut(const dt_model *m, int K, const char *split, const double *cost, int *first) {
    const int n = dt_model_num_nodes(m);
    first[0] = 0, first[K] = n;
    if (K == 1) return DT_OK;
    if (split && split[0]) return parse_split(m, K, split, first);
    double *pre = malloc(sizeof(double) * (size_t)(n + 1));
    if (!pre) return dt_error(DT_ENOMEM, "pipeline cut: out of memory");
    pre[0] = 0;
    for (int i = 0; i < n; i++) pre[i + 1] = pre[i] + (cost ? cost[i] : dt_model_node_flops(m, i, 1));
    dt_status st = balance(m, K, pre, first);
    free(pre);
    return st;
}
