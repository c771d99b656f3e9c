/* Text generation with a GPT graph: the context (the last T tokens, left-aligned, the rest
 * padded; causal attention keeps the padding out of view) runs forward, the logits of the last
 * real position are divided by the temperature, cut to the top k and sampled with the
 * counter-based RNG keyed by (seed, token index), so a run is reproducible. The model may run
 * on any device: the last position's logits are downloaded (one row a token) and sampled here. */
#include "dtrain/models.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Index of a draw from softmax(logits / temperature) restricted to the k largest (k <= 0: all). */
static int sample_logits(const float *logits, int V, float temperature, int top_k, float u, float *probs) {
    if (temperature <= 0) { /* greedy */
        int best = 0;
        for (int i = 1; i < V; i++)
            if (logits[i] > logits[best]) best = i;
        return best;
    }
    float cut = -FLT_MAX;
    if (top_k > 0 && top_k < V) { /* the k-th largest logit: the smallest of a running top-k */
        memcpy(probs, logits, (size_t)V * sizeof(float));
        for (int k = 0; k < top_k; k++) {
            int best = k;
            for (int i = k + 1; i < V; i++)
                if (probs[i] > probs[best]) best = i;
            float t = probs[k];
            probs[k] = probs[best], probs[best] = t;
        }
        cut = probs[top_k - 1];
    }
    float mx = -FLT_MAX;
    for (int i = 0; i < V; i++)
        if (logits[i] >= cut && logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int i = 0; i < V; i++) {
        probs[i] = logits[i] >= cut ? expf((logits[i] - mx) / temperature) : 0.0f;
        sum += probs[i];
    }
    double r = u * sum, acc = 0;
    int last = 0;
    for (int i = 0; i < V; i++) {
        if (probs[i] <= 0) continue;
        acc += probs[i];
        last = i;
        if (acc > r) return i;
    }
    return last;
}

dt_status dt_gpt_generate(dt_model *m, const int32_t *prompt, int nprompt, int ntokens, const dt_sample_config *sc,
                          void (*on_token)(void *ctx, int32_t token), void *ctx) {
    const int T = dt_model_in_size(m), V = dt_model_classes(m);
    if (dt_model_in_dtype(m) != DT_I32 || dt_model_out_size(m) != T * V)
        return dt_error(DT_EINVAL, "sample: model '%s' is not a language model (it takes no token ids)",
                        dt_model_spec(m));
    if (nprompt < 1) return dt_error(DT_EINVAL, "sample: the prompt is empty; give `prompt` at least one character");
    for (int i = 0; i < nprompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return dt_error(DT_EINVAL, "sample: prompt token %d at position %d is outside the vocabulary [0, %d)",
                            prompt[i], i, V);
    int32_t *ctxbuf = calloc((size_t)T + (size_t)nprompt + (size_t)ntokens, sizeof *ctxbuf);
    float *probs = malloc(2 * (size_t)V * sizeof *probs), *logits = probs + V; /* logits: the downloaded row */
    if (!ctxbuf || !probs) {
        free(ctxbuf), free(probs);
        return dt_error(DT_ENOMEM, "sample: out of memory");
    }
    memcpy(ctxbuf, prompt, (size_t)nprompt * sizeof *ctxbuf);
    int len = nprompt;
    int32_t *window = ctxbuf + (size_t)nprompt + (size_t)ntokens; /* T slots after the text */
    dt_status s = DT_OK;
    for (int k = 0; k < ntokens && s == DT_OK; k++) {
        int start = len > T ? len - T : 0, n = len - start;
        memset(window, 0, (size_t)T * sizeof *window);
        memcpy(window, ctxbuf + start, (size_t)n * sizeof *window);
        dt_feed f = {.x = window, .n = 1};
        if ((s = dt_model_run(m, &f, false, 0, NULL)) != DT_OK) break;
        dt_model_read_output(m, (size_t)(n - 1) * V, (size_t)V, logits); /* the model's device: one row */
        float u = dt_rng_uniform(sc->seed, dt_rng_key(DT_RNG_USER + 1, 0), (uint64_t)k);
        int32_t tok = sample_logits(logits, V, sc->temperature, sc->top_k, u, probs);
        ctxbuf[len++] = tok;
        if (on_token) on_token(ctx, tok);
    }
    free(ctxbuf), free(probs);
    return s;
}
