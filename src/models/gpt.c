/* The GPT builder (llm.c / nanoGPT style, written over the graph's ops): token and learned
 * position embeddings, L pre-LN blocks (ln_1 -> c_attn -> causal attention -> c_proj -> residual
 * add; ln_2 -> c_fc -> GELU -> c_proj -> residual add), a final layer norm and an output head tied
 * to the token embedding, then softmax cross-entropy against the next tokens. Node names are
 * nanoGPT's module paths, so tensors are named as in its state_dict. The sharded variant builds
 * one tensor-parallel rank's part of it (Megatron-LM's layout; parallel/tp.c slices and runs it);
 * whole and shard alike carry the tensor-parallel marks (dt_model_mark_tp) that tell parallel/
 * how: c_attn (q, k, v in three parts) and c_fc column-parallel, both c_proj row-parallel, the
 * token embedding and the tied head vocabulary-parallel. */
#include "nn/graph_parallel.h"
#include "dtrain/models.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const dt_gpt_config GPT_DEFAULT = {.L = 4, .H = 4, .C = 128, .T = 64, .V = 256};

bool dt_model_spec_is_gpt(const char *spec) {
    return spec && !strncmp(spec, "gpt", 3) && (spec[3] == '\0' || spec[3] == ':');
}

void dt_gpt_format(char *buf, size_t cap, const dt_gpt_config *c) {
    snprintf(buf, cap, "gpt:L=%d,H=%d,C=%d,T=%d,V=%d", c->L, c->H, c->C, c->T, c->V);
}

static dt_status check_config(const char *spec, const dt_gpt_config *c) {
    const char *hint = "; example: `model` gpt:L=4,H=4,C=128,T=64";
    if (c->L < 1 || c->L > 256) return dt_error(DT_EINVAL, "`model` %s: L=%d blocks (need 1..256)%s", spec, c->L, hint);
    if (c->H < 1 || c->C < 1 || c->C % c->H)
        return dt_error(DT_EINVAL, "`model` %s: C=%d must be a positive multiple of the H=%d heads%s", spec, c->C, c->H,
                        hint);
    if (c->T < 1 || c->T > 65536)
        return dt_error(DT_EINVAL, "`model` %s: T=%d context (need 1..65536)%s", spec, c->T, hint);
    if (c->V < 2 || c->V > 1 << 24)
        return dt_error(DT_EINVAL, "`model` %s: V=%d vocabulary (need 2..16777216)%s", spec, c->V, hint);
    return DT_OK;
}

dt_status dt_gpt_parse(const char *spec, dt_gpt_config *c) {
    *c = GPT_DEFAULT;
    if (!dt_model_spec_is_gpt(spec))
        return dt_error(DT_EINVAL, "`model` %s: not a gpt spec (gpt:L=..,H=..,C=..,T=..)", spec);
    const char *p = spec[3] ? spec + 4 : spec + 3;
    while (*p) {
        char key[8] = {0};
        int klen = (int)strcspn(p, "=,");
        if (klen == 0 || klen >= (int)sizeof key || p[klen] != '=')
            return dt_error(DT_EINVAL, "`model` %s: expected KEY=VALUE at '%s' (keys L, H, C, T, V)", spec, p);
        memcpy(key, p, (size_t)klen);
        char *end;
        long v = strtol(p + klen + 1, &end, 10);
        if (end == p + klen + 1 || (*end && *end != ','))
            return dt_error(DT_EINVAL, "`model` %s: %s needs an integer value", spec, key);
        int *dst = !strcmp(key, "L")   ? &c->L
                   : !strcmp(key, "H") ? &c->H
                   : !strcmp(key, "C") ? &c->C
                   : !strcmp(key, "T") ? &c->T
                   : !strcmp(key, "V") ? &c->V
                                       : NULL;
        if (!dst) return dt_error(DT_EINVAL, "`model` %s: unknown key '%s' (keys L, H, C, T, V)", spec, key);
        if (v < INT32_MIN || v > INT32_MAX)
            return dt_error(DT_EINVAL, "`model` %s: %s=%ld is out of range", spec, key, v);
        *dst = (int)v;
        p = *end ? end + 1 : end;
    }
    return check_config(spec, c);
}

/* One node named "<prefix>.<what>". */
static int node(dt_model *m, const char *prefix, const char *what, const dt_layer_spec *s, int a, int b) {
    char name[48];
    snprintf(name, sizeof name, "%s%s%s", prefix, *prefix ? "." : "", what);
    int in[2] = {a, b};
    return dt_graph_node(m, name, s, -1, in, b >= 0 ? 2 : 1);
}

/* Marks node i for tensor parallelism (a failed node, -1, leaves the graph's sticky error). */
static int mark(dt_model *m, int i, dt_tp_mark k, int parts) {
    if (i >= 0) (void)dt_model_mark_tp(m, i, k, parts);
    return i;
}

static dt_layer_spec op(dt_layer_kind kind, int out, float std) {
    dt_layer_spec s = dt_layer_default(kind);
    s.out = out, s.init_std = std;
    return s;
}

/* x + c_proj(attention(c_attn(ln_1(x)))), then x + c_proj(gelu(c_fc(ln_2(x)))); with tp > 1 the
 * shard of one tensor-parallel rank: H/tp heads (c_attn 3C/tp wide), c_fc 4C/tp wide, the two
 * c_proj reading C/tp and 4C/tp features (their outputs are partial sums, reduced by parallel/). */
static int block(dt_model *m, const dt_gpt_config *c, int i, int x, int tp) {
    char p[32];
    snprintf(p, sizeof p, "transformer.h.%d", i);
    const float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)c->L);
    dt_layer_spec ln = dt_layer_default(DT_LAYER_LAYERNORM), att = dt_layer_default(DT_LAYER_ATTENTION);
    att.heads = c->H / tp;
    dt_layer_spec qkv = op(DT_LAYER_LINEAR, 3 * c->C / tp, std), proj = op(DT_LAYER_LINEAR, c->C, proj_std);
    dt_layer_spec fc = op(DT_LAYER_LINEAR, 4 * c->C / tp, std), gelu = dt_layer_default(DT_LAYER_GELU);
    dt_layer_spec add = dt_layer_default(DT_LAYER_ADD);
    int a = node(m, p, "ln_1", &ln, x, -1);
    a = mark(m, node(m, p, "attn.c_attn", &qkv, a, -1), DT_TP_MARK_COLUMN, 3); /* q, k and v: by heads */
    a = node(m, p, "attn.attention", &att, a, -1);
    a = mark(m, node(m, p, "attn.c_proj", &proj, a, -1), DT_TP_MARK_ROW, 1);
    x = node(m, p, "residual_attn", &add, x, a);
    int f = node(m, p, "ln_2", &ln, x, -1);
    f = mark(m, node(m, p, "mlp.c_fc", &fc, f, -1), DT_TP_MARK_COLUMN, 1);
    f = node(m, p, "mlp.gelu", &gelu, f, -1);
    f = mark(m, node(m, p, "mlp.c_proj", &proj, f, -1), DT_TP_MARK_ROW, 1);
    return node(m, p, "residual_mlp", &add, x, f);
}

/* The whole GPT (tp 1) or one tensor-parallel rank's shard of it (no loss node then). */
static dt_status create(dt_model **out, const dt_gpt_config *c, int tp, bool defer) {
    *out = NULL;
    char spec[128];
    dt_gpt_format(spec, sizeof spec, c);
    DT_TRY(check_config(spec, c));
    dt_model *m;
    DT_TRY(dt_graph_create(&m));
    int idx = dt_graph_input(m, "idx", DT_I32, 1, &c->T);
    int targets = dt_graph_input(m, "targets", DT_I32, 1, &c->T);
    dt_layer_spec wte = op(DT_LAYER_EMBEDDING, c->C, 0.02f), wpe = wte;
    wte.num = c->V / tp;
    wpe.num = c->T, wpe.pos = true;
    dt_layer_spec add = dt_layer_default(DT_LAYER_ADD), ln = dt_layer_default(DT_LAYER_LAYERNORM);
    int tok = mark(m, node(m, "transformer", "wte", &wte, idx, -1), DT_TP_MARK_VOCAB, 1);
    int pos = node(m, "transformer", "wpe", &wpe, idx, -1);
    int x = node(m, "transformer", "embed", &add, tok, pos);
    for (int i = 0; i < c->L; i++) x = block(m, c, i, x, tp);
    x = node(m, "transformer", "ln_f", &ln, x, -1);
    dt_layer_spec head = op(DT_LAYER_MATMUL_T, c->V / tp, 0.02f);
    head.tie = "transformer.wte.weight";
    int logits = mark(m, node(m, "", "lm_head", &head, x, -1), DT_TP_MARK_VOCAB, 1);
    dt_layer_spec xe = dt_layer_default(DT_LAYER_XENT);
    xe.ignore_index = -1; /* nanoGPT's: a target of -1 does not count */
    int loss = tp == 1 ? node(m, "", "loss", &xe, logits, targets) : -1;
    if (defer) dt_graph_defer_placement(m);
    dt_status s = dt_graph_finish(m, logits, loss, spec);
    if (s != DT_OK) {
        dt_model_destroy(m);
        return s;
    }
    *out = m;
    return DT_OK;
}

dt_status dt_gpt_create(dt_model **out, const dt_gpt_config *c) { return create(out, c, 1, false); }

dt_status dt_gpt_check_tp(const dt_gpt_config *c, int tp) {
    if (tp >= 1 && c->H % tp == 0 && c->C % tp == 0 && c->V % tp == 0) return DT_OK;
    char ok[128] = "";
    size_t k = 0;
    for (int d = 1; d <= c->H && k < sizeof ok; d++)
        if (c->H % d == 0 && c->C % d == 0 && c->V % d == 0)
            k += (size_t)snprintf(ok + k, sizeof ok - k, "%s%d", k ? ", " : "", d);
    return dt_error(DT_EINVAL,
                    "`tp` %d: tensor parallelism splits the H=%d heads, the C=%d width (and 4C=%d of the "
                    "MLP) and the V=%d vocabulary evenly, so it must divide each; choose `tp` %s",
                    tp, c->H, c->C, 4 * c->C, c->V, ok);
}

static dt_status create_sharded(dt_model **out, const dt_gpt_config *c, int tp, bool defer) {
    *out = NULL;
    char spec[128];
    dt_gpt_format(spec, sizeof spec, c);
    DT_TRY(check_config(spec, c));
    DT_TRY(dt_gpt_check_tp(c, tp));
    return create(out, c, tp, defer);
}

dt_status dt_gpt_create_sharded(dt_model **out, const dt_gpt_config *c, int tp) {
    return create_sharded(out, c, tp, false);
}

dt_status dt_gpt_create_sharded_unplaced(dt_model **out, const dt_gpt_config *c, int tp) {
    return create_sharded(out, c, tp, true);
}

dt_status dt_model_build_unplaced(dt_model **m, const char *spec, int C, int H, int W) {
    *m = NULL;
    if (!dt_model_spec_is_gpt(spec)) return dt_model_create_spec_placed(m, spec, C, H, W, true);
    dt_gpt_config c;
    DT_TRY(dt_gpt_parse(spec, &c));
    return create(m, &c, 1, true);
}

dt_status dt_model_create_tp_shard(dt_model **m, const dt_model *whole, int tp, bool defer) {
    *m = NULL;
    const char *spec = dt_model_spec(whole);
    if (dt_model_spec_is_gpt(spec)) {
        dt_gpt_config c;
        DT_TRY(dt_gpt_parse(spec, &c));
        return create_sharded(m, &c, tp, defer);
    }
    int shape[4] = {1, 1, 1, 1};
    const int nd = dt_model_input_shape(whole, shape);
    if (nd != 3)
        return dt_error(DT_EINVAL, "model %s: tensor parallelism needs a sequential model's (C,H,W) input", spec);
    return dt_model_create_spec_shard(m, spec, shape[0], shape[1], shape[2], tp, defer);
}

dt_status dt_model_build(dt_model **m, const char *spec, int C, int H, int W) {
    *m = NULL;
    if (!dt_model_spec_is_gpt(spec)) {
        DT_TRY(dt_model_create_from_spec(m, spec, C, H, W));
    } else {
        dt_gpt_config c;
        DT_TRY(dt_gpt_parse(spec, &c));
        DT_TRY(dt_gpt_create(m, &c));
    }
    dt_model_init(*m, DT_MODEL_BUILD_SEED); /* ready to train, as an embedder expects */
    return DT_OK;
}
