/* The cases of cuda_ops_test.c (included once, after its helpers): the step primitives, then every
 * slot of the kernel table that the cuda device fills. */

#define CPU (dt_device_cpu())
#define CO (dt_device_cpu()->ops)
#define GO (c->g->ops)

/* ---- primitives ---- */

static void prim_elementwise(ctx *c) {
    const size_t n = 100003;
    buf x = zeros(c, n);
    CO->fill_f32(CPU, F(x), -1.25f, n), GO->fill_f32(c->g, G(x), -1.25f, n);
    CHECK(c, "fill_f32", 0, 0, x);
    buf y = mk(c, n, -2, 2), z = mk(c, n, -2, 2);
    CO->accumulate(CPU, F(y), F(z), n), GO->accumulate(c->g, G(y), G(z), n);
    CHECK(c, "accumulate", 0, 0, y);
    CO->scale(CPU, F(y), 0.37f, n), GO->scale(c->g, G(y), 0.37f, n);
    CHECK(c, "scale", 0, 0, y);
    for (int bad = 0; bad < 2; bad++) {
        if (bad) F(z)[n / 2] = INFINITY, GO->upload(c->g, (float *)z.d + n / 2, &F(z)[n / 2], sizeof(float));
        int32_t flag_h = 7, flag_g = 7;
        buf fl = mk_bytes(c, &flag_g, sizeof flag_g);
        CO->unscale(CPU, F(z), 0.5f, n, &flag_h), GO->unscale(c->g, G(z), 0.5f, n, fl.d);
        GO->synchronize(c->g);
        GO->download(c->g, &flag_g, fl.d, sizeof flag_g);
        const bool ok = flag_g == flag_h && flag_h == bad;
        CHECK(c, bad ? "unscale (an inf: untouched)" : "unscale (finite)", 0, 0, z);
        if (!ok) c->fails++, printf("unscale: flag %d on cuda, %d on cpu, want %d  FAIL\n", flag_g, flag_h, bad);
        drop(c, &fl);
    }
    double want = 0, got = 0;
    buf out = mk_bytes(c, &got, sizeof got);
    CO->sqnorm(CPU, &want, F(y), n), GO->sqnorm(c->g, out.d, G(y), n);
    GO->synchronize(c->g);
    GO->download(c->g, &got, out.d, sizeof got);
    const double e = fabs(got - want);
    report(c, "sqnorm (double)", e <= 1e-12 * fabs(want), e, e / fabs(want), 0, 1e-12);
    drop(c, &out), drop(c, &x), drop(c, &y), drop(c, &z);
}

/* The casts on values with every special: NaN, inf, subnormals, halfway cases, overflow. */
static void prim_casts(ctx *c) {
    const size_t n = 65536 + 16;
    float *v = malloc(n * sizeof *v);
    uint16_t *h = malloc(n * sizeof *h);
    for (size_t i = 0; i < 65536; i++) {
        uint32_t u = (uint32_t)i << 16 | (uint32_t)(i * 0x9E37u & 0xffffu);
        memcpy(&v[i], &u, 4);
        h[i] = (uint16_t)i;
    }
    const float special[16] = {NAN,      -NAN,     INFINITY,       -INFINITY,      0.0f,    -0.0f,   1e-40f, -1e-45f,
                               65504.0f, 65520.0f, 1.00048828125f, 1.00146484375f, 3.0e-8f, 6.0e-8f, 1e38f,  -2.5f};
    memcpy(v + 65536, special, sizeof special);
    for (int i = 0; i < 16; i++) h[65536 + i] = (uint16_t)(0x7c00 + i);
    buf f = mk_bytes(c, v, n * 4), b16 = mk_bytes(c, NULL, n * 2), hb = mk_bytes(c, h, n * 2), w = zeros(c, n);
    CO->cast_f32_bf16(CPU, b16.h, F(f), n), GO->cast_f32_bf16(c->g, b16.d, G(f), n);
    GO->synchronize(c->g);
    report(c, "cast_f32_bf16 (bitwise)", same_bytes(c, &b16), 0, 0, 0, 0);
    CO->cast_f32_f16(CPU, b16.h, F(f), n), GO->cast_f32_f16(c->g, b16.d, G(f), n);
    GO->synchronize(c->g);
    report(c, "cast_f32_f16 (bitwise)", same_bytes(c, &b16), 0, 0, 0, 0);
    CO->cast_bf16_f32(CPU, F(w), hb.h, n), GO->cast_bf16_f32(c->g, G(w), hb.d, n);
    GO->synchronize(c->g);
    report(c, "cast_bf16_f32 (bitwise)", same_bytes(c, &w), 0, 0, 0, 0);
    CO->cast_f16_f32(CPU, F(w), hb.h, n), GO->cast_f16_f32(c->g, G(w), hb.d, n);
    GO->synchronize(c->g);
    report(c, "cast_f16_f32 (bitwise)", same_bytes(c, &w), 0, 0, 0, 0);
    drop(c, &f), drop(c, &b16), drop(c, &hb), drop(c, &w);
    free(v), free(h);
}

static void prim_optim(ctx *c) {
    const size_t n = 50001;
    const dt_step_args sgds[3] = {{.lr = 0.1f, .weight_decay = 0.01f},
                                  {.lr = 0.05f, .momentum = 0.9f, .first_step = true, .weight_decay = 1e-4f},
                                  {.lr = 0.05f, .momentum = 0.9f, .nesterov = true}};
    const char *sgd_names[3] = {"sgd_step (plain, wd)", "sgd_step (momentum, first)", "sgd_step (nesterov)"};
    buf p = mk(c, n, -1, 1), g = mk(c, n, -1, 1), m = mk(c, n, -0.1f, 0.1f), v = mk(c, n, 0, 0.01f);
    for (int i = 0; i < 3; i++) {
        CO->sgd_step(CPU, &sgds[i], F(p), F(g), F(m), n), GO->sgd_step(c->g, &sgds[i], G(p), G(g), G(m), n);
        CHECK(c, sgd_names[i], 0, 0, p, m);
    }
    /* moments that decay into the subnormal range: the flush to zero must match the CPU's */
    for (size_t i = 0; i < n; i += 7) F(m)[i] = 1e-39f, F(v)[i] = 1e-41f, F(g)[i] = 0;
    GO->upload(c->g, m.d, m.h, m.bytes), GO->upload(c->g, v.d, v.h, v.bytes), GO->upload(c->g, g.d, g.h, g.bytes);
    const dt_step_args adams[2] = {
        {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f, .t = 0},
        {.lr = 3e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .decoupled = true, .t = 41}};
    const char *adam_names[2] = {"adam_step (L2)", "adam_step (adamw, t=42)"};
    for (int i = 0; i < 2; i++) {
        CO->adam_step(CPU, &adams[i], F(p), F(g), F(m), F(v), n);
        GO->adam_step(c->g, &adams[i], G(p), G(g), G(m), G(v), n);
        CHECK(c, adam_names[i], 0, 0, p, m, v);
    }
    drop(c, &p), drop(c, &g), drop(c, &m), drop(c, &v);
}

static void run_primitives(ctx *c) {
    prim_elementwise(c);
    prim_casts(c);
    prim_optim(c);
}

/* ---- kernel slots ---- */

#define BOTH(slot, cpu_args, gpu_args) (c->cpu->slot cpu_args, c->gpu->slot gpu_args)

/* bias: none, 16-byte aligned (the BIAS epilogue), or 4 bytes past it (broadcast, then beta 1) */
static void k_linear(ctx *c) {
    const int B = 37, C = 129, OC = 65;
    const char *fwd[3] = {"linear_forward", "linear_forward (bias epilogue)", "linear_forward (unaligned bias)"};
    const char *bwd[3] = {"linear_backward (din dw)", "linear_backward (din dw db)", "linear_backward (unaligned)"};
    for (int mode = 0; mode < 3; mode++) {
        buf in = mk(c, (size_t)B * C, -1, 1), w = mk(c, (size_t)OC * C, -0.2f, 0.2f), b = mk(c, OC + 1, -1, 1);
        buf out = zeros(c, (size_t)B * OC), dout = mk(c, (size_t)B * OC, -1, 1), din = mk(c, (size_t)B * C, 5, 6);
        buf dw = mk(c, (size_t)OC * C, -1, 1), db = mk(c, OC + 1, -1, 1);
        const int off = mode == 2;
        float *bc = mode ? F(b) + off : NULL, *bg = mode ? G(b) + off : NULL;
        float *dbc = mode ? F(db) + off : NULL, *dbg = mode ? G(db) + off : NULL;
        BOTH(linear_forward, (F(out), F(in), F(w), bc, NULL, B, C, OC), (G(out), G(in), G(w), bg, NULL, B, C, OC));
        CHECK(c, fwd[mode], 1e-5, 1e-4, out);
        BOTH(linear_backward, (F(din), F(dw), dbc, F(dout), F(in), F(w), NULL, B, C, OC),
             (G(din), G(dw), dbg, G(dout), G(in), G(w), NULL, B, C, OC));
        CHECK(c, bwd[mode], 1e-5, 1e-4, din, dw, db);
        drop(c, &in), drop(c, &w), drop(c, &b), drop(c, &out), drop(c, &dout), drop(c, &din), drop(c, &dw),
            drop(c, &db);
    }
    report(c, "linear_bf16_values (false: f32 paths)", !c->gpu->linear_bf16_values || !c->gpu->linear_bf16_values(), 0,
           0, 0, 0);
}

static void k_conv(ctx *c) {
    const int shapes[3][7] = {{4, 3, 28, 28, 16, 3, 1}, {4, 16, 14, 14, 32, 3, 2}, {2, 8, 9, 9, 8, 1, 1}};
    const int pads[3] = {1, 0, 0};
    for (int s = 0; s < 3; s++) {
        const int B = shapes[s][0], C = shapes[s][1], H = shapes[s][2], W = shapes[s][3], OC = shapes[s][4];
        const int K = shapes[s][5], st = shapes[s][6], pad = pads[s];
        const int OH = (H + 2 * pad - K) / st + 1, OW = (W + 2 * pad - K) / st + 1;
        const size_t ni = (size_t)B * C * H * W, no = (size_t)B * OC * OH * OW, nw = (size_t)OC * C * K * K;
        buf in = mk(c, ni, -1, 1), w = mk(c, nw, -0.3f, 0.3f), b = mk(c, OC, -1, 1), out = zeros(c, no);
        buf dout = mk(c, no, -1, 1), din = zeros(c, ni), dw = mk(c, nw, -1, 1), db = mk(c, OC, -1, 1);
        buf wc = zeros(c, c->cpu->conv2d_workspace(B, C, H, W, OC, K, st, pad) + 1);
        buf wg = zeros(c, c->gpu->conv2d_workspace(B, C, H, W, OC, K, st, pad) + 1);
        BOTH(conv2d_forward, (F(out), F(in), F(w), F(b), F(wc), B, C, H, W, OC, K, st, pad),
             (G(out), G(in), G(w), G(b), G(wg), B, C, H, W, OC, K, st, pad));
        char name[64];
        snprintf(name, sizeof name, "conv2d_forward (K%d s%d p%d)", K, st, pad);
        CHECK(c, name, 1e-4, 1e-4, out);
        BOTH(conv2d_backward, (F(din), F(dw), F(db), F(dout), F(in), F(w), F(wc), B, C, H, W, OC, K, st, pad),
             (G(din), G(dw), G(db), G(dout), G(in), G(w), G(wg), B, C, H, W, OC, K, st, pad));
        snprintf(name, sizeof name, "conv2d_backward (K%d s%d p%d)", K, st, pad);
        CHECK(c, name, 1e-4, 1e-4, din, dw, db);
        drop(c, &in), drop(c, &w), drop(c, &b), drop(c, &out), drop(c, &dout), drop(c, &din), drop(c, &dw);
        drop(c, &db), drop(c, &wc), drop(c, &wg);
    }
}

static void k_pool(ctx *c) {
    const int ks[2][2] = {{2, 2}, {3, 2}};
    const int B = 3, C = 5, H = 13, W = 12;
    for (int i = 0; i < 2; i++) {
        const int K = ks[i][0], S = ks[i][1], OH = (H - K) / S + 1, OW = (W - K) / S + 1;
        const size_t ni = (size_t)B * C * H * W, no = (size_t)B * C * OH * OW;
        buf in = mk(c, ni, -1, 1), out = zeros(c, no), am = mk_bytes(c, NULL, no * 4), dout = mk(c, no, -1, 1);
        buf din = mk(c, ni, 3, 4);
        BOTH(maxpool2d_forward, (F(out), am.h, F(in), B, C, H, W, K, S), (G(out), am.d, G(in), B, C, H, W, K, S));
        CHECK(c, K == 2 ? "maxpool2d_forward (K2 S2)" : "maxpool2d_forward (K3 S2)", 0, 0, out);
        c->g->ops->synchronize(c->g);
        report(c, "maxpool2d argmax", same_bytes(c, &am), 0, 0, 0, 0);
        BOTH(maxpool2d_backward, (F(din), F(dout), am.h, B, C, H, W, K, S), (G(din), G(dout), am.d, B, C, H, W, K, S));
        CHECK(c, "maxpool2d_backward", 0, 0, din);
        BOTH(avgpool2d_forward, (F(out), F(in), B, C, H, W, K, S), (G(out), G(in), B, C, H, W, K, S));
        CHECK(c, "avgpool2d_forward", 0, 0, out);
        BOTH(avgpool2d_backward, (F(din), F(dout), B, C, H, W, K, S), (G(din), G(dout), B, C, H, W, K, S));
        CHECK(c, "avgpool2d_backward", 0, 0, din);
        drop(c, &in), drop(c, &out), drop(c, &am), drop(c, &dout), drop(c, &din);
    }
}

static void k_activations(ctx *c) {
    const size_t n = 70001;
    buf x = mk(c, n, -5, 5), y = zeros(c, n), g = mk(c, n, -1, 1), d = zeros(c, n);
    BOTH(relu_forward, (F(y), F(x), n), (G(y), G(x), n));
    CHECK(c, "relu_forward", 0, 0, y);
    BOTH(relu_backward, (F(d), F(g), F(x), n), (G(d), G(g), G(x), n));
    CHECK(c, "relu_backward", 0, 0, d);
    BOTH(gelu_forward, (F(y), F(x), n), (G(y), G(x), n));
    CHECK(c, "gelu_forward (erf)", 1e-6, 1e-5, y);
    BOTH(gelu_backward, (F(d), F(g), F(x), n), (G(d), G(g), G(x), n));
    CHECK(c, "gelu_backward", 1e-6, 1e-5, d);
    BOTH(tanh_forward, (F(y), F(x), n), (G(y), G(x), n));
    CHECK(c, "tanh_forward", 1e-6, 1e-5, y);
    BOTH(tanh_backward, (F(d), F(g), F(y), n), (G(d), G(g), G(y), n));
    CHECK(c, "tanh_backward", 1e-6, 1e-5, d);
    BOTH(sigmoid_forward, (F(y), F(x), n), (G(y), G(x), n));
    CHECK(c, "sigmoid_forward", 1e-6, 1e-5, y);
    BOTH(sigmoid_backward, (F(d), F(g), F(y), n), (G(d), G(g), G(y), n));
    CHECK(c, "sigmoid_backward", 1e-6, 1e-5, d);
    BOTH(add_forward, (F(y), F(x), F(g), n), (G(y), G(x), G(g), n));
    CHECK(c, "add_forward", 0, 0, y);
    buf mask = mk_bytes(c, NULL, n);
    const float ps[3] = {0.0f, 0.3f, 1.0f};
    for (int i = 0; i < 3; i++) {
        BOTH(dropout_forward, (F(y), mask.h, F(x), n, ps[i], 42, 7 + i), (G(y), mask.d, G(x), n, ps[i], 42, 7 + i));
        CHECK(c,
              i == 0   ? "dropout_forward (p 0)"
              : i == 1 ? "dropout_forward (p 0.3)"
                       : "dropout_forward (p 1)",
              0, 0, y);
        c->g->ops->synchronize(c->g);
        report(c, "dropout mask (Philox, bitwise)", same_bytes(c, &mask), 0, 0, 0, 0);
        BOTH(dropout_backward, (F(d), F(g), mask.h, n, ps[i]), (G(d), G(g), mask.d, n, ps[i]));
        CHECK(c, "dropout_backward", 0, 0, d);
    }
    drop(c, &x), drop(c, &y), drop(c, &g), drop(c, &d), drop(c, &mask);
}

static void k_norms(ctx *c) {
    const int N = 67, C = 768;
    buf in = mk(c, (size_t)N * C, -3, 3), w = mk(c, C, 0.5f, 1.5f), b = mk(c, C, -1, 1), out = zeros(c, (size_t)N * C);
    buf mean = zeros(c, N), rstd = zeros(c, N), dout = mk(c, (size_t)N * C, -1, 1), din = zeros(c, (size_t)N * C);
    buf dw = mk(c, C, -1, 1), db = mk(c, C, -1, 1);
    BOTH(layernorm_forward, (F(out), F(mean), F(rstd), F(in), F(w), F(b), N, C, 1e-5f),
         (G(out), G(mean), G(rstd), G(in), G(w), G(b), N, C, 1e-5f));
    CHECK(c, "layernorm_forward", 1e-4, 1e-4, out, mean, rstd);
    BOTH(layernorm_backward, (F(din), F(dw), F(db), F(dout), F(in), F(w), F(mean), F(rstd), N, C),
         (G(din), G(dw), G(db), G(dout), G(in), G(w), G(mean), G(rstd), N, C));
    CHECK(c, "layernorm_backward", 1e-4, 1e-4, din, dw, db);
    drop(c, &in), drop(c, &w), drop(c, &b), drop(c, &out), drop(c, &mean), drop(c, &rstd), drop(c, &dout);
    drop(c, &din), drop(c, &dw), drop(c, &db);
    const int B = 8, CH = 6, HW = 49;
    const size_t n = (size_t)B * CH * HW;
    buf x = mk(c, n, -2, 3), bw = mk(c, CH, 0.5f, 1.5f), bb = mk(c, CH, -1, 1), y = zeros(c, n);
    buf m = zeros(c, CH), r = zeros(c, CH), rm = mk(c, CH, -1, 1), rv = mk(c, CH, 0.5f, 2), dy = mk(c, n, -1, 1);
    buf dx = zeros(c, n), dbw = mk(c, CH, -1, 1), dbb = mk(c, CH, -1, 1);
    BOTH(batchnorm2d_forward_train, (F(y), F(m), F(r), F(rm), F(rv), F(x), F(bw), F(bb), B, CH, HW, 0.1f, 1e-5f),
         (G(y), G(m), G(r), G(rm), G(rv), G(x), G(bw), G(bb), B, CH, HW, 0.1f, 1e-5f));
    CHECK(c, "batchnorm2d_forward_train", 1e-5, 1e-4, y, m, r, rm, rv);
    BOTH(batchnorm2d_forward_eval, (F(y), F(x), F(bw), F(bb), F(rm), F(rv), B, CH, HW, 1e-5f),
         (G(y), G(x), G(bw), G(bb), G(rm), G(rv), B, CH, HW, 1e-5f));
    CHECK(c, "batchnorm2d_forward_eval", 1e-5, 1e-4, y);
    BOTH(batchnorm2d_backward, (F(dx), F(dbw), F(dbb), F(dy), F(x), F(bw), F(m), F(r), B, CH, HW),
         (G(dx), G(dbw), G(dbb), G(dy), G(x), G(bw), G(m), G(r), B, CH, HW));
    CHECK(c, "batchnorm2d_backward", 1e-4, 1e-4, dx, dbw, dbb);
    drop(c, &x), drop(c, &bw), drop(c, &bb), drop(c, &y), drop(c, &m), drop(c, &r), drop(c, &rm), drop(c, &rv);
    drop(c, &dy), drop(c, &dx), drop(c, &dbw), drop(c, &dbb);
}

static void k_embedding(ctx *c) {
    const int B = 4, T = 33, C = 48, V = 61, N = B * T;
    buf id = ids(c, N, V), w = mk(c, (size_t)V * C, -1, 1), out = zeros(c, (size_t)N * C);
    buf dout = mk(c, (size_t)N * C, -1, 1), dw = mk(c, (size_t)V * C, -1, 1), pw = mk(c, (size_t)T * C, -1, 1);
    buf dpw = mk(c, (size_t)T * C, -1, 1);
    BOTH(embedding_forward, (F(out), id.h, F(w), N, C), (G(out), id.d, G(w), N, C));
    CHECK(c, "embedding_forward", 0, 0, out);
    BOTH(embedding_backward, (F(dw), F(dout), id.h, N, C), (G(dw), G(dout), id.d, N, C));
    CHECK(c, "embedding_backward (rows in order)", 0, 0, dw);
    BOTH(pos_embedding_forward, (F(out), F(pw), B, T, C), (G(out), G(pw), B, T, C));
    CHECK(c, "pos_embedding_forward", 0, 0, out);
    BOTH(pos_embedding_backward, (F(dpw), F(dout), B, T, C), (G(dpw), G(dout), B, T, C));
    CHECK(c, "pos_embedding_backward", 0, 0, dpw);
    drop(c, &id), drop(c, &w), drop(c, &out), drop(c, &dout), drop(c, &dw), drop(c, &pw), drop(c, &dpw);
}

static void k_attention(ctx *c) {
    const int B = 3, T = 45, C = 64, NH = 4;
    const size_t nq = (size_t)B * T * 3 * C, no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    buf qkv = mk(c, nq, -1, 1), out = zeros(c, no), att = zeros(c, na), dout = mk(c, no, -1, 1), dqkv = zeros(c, nq);
    buf wc = zeros(c, c->cpu->attention_workspace(T, C, NH) + 1),
        wg = zeros(c, c->gpu->attention_workspace(T, C, NH) + 1);
    BOTH(attention_forward, (F(out), F(att), F(wc), F(qkv), B, T, C, NH), (G(out), G(att), G(wg), G(qkv), B, T, C, NH));
    CHECK(c, "attention_forward (out, probs)", 1e-5, 1e-4, out, att);
    BOTH(attention_backward, (F(dqkv), F(wc), F(dout), F(qkv), F(att), B, T, C, NH),
         (G(dqkv), G(wg), G(dout), G(qkv), G(att), B, T, C, NH));
    CHECK(c, "attention_backward", 1e-5, 1e-4, dqkv);
    drop(c, &qkv), drop(c, &out), drop(c, &att), drop(c, &dout), drop(c, &dqkv), drop(c, &wc), drop(c, &wg);
}

static void k_losses(ctx *c) {
    const int N = 50, V = 1031, ignore = -100;
    buf logits = mk(c, (size_t)N * V, -8, 8), probs = zeros(c, (size_t)N * V), lab = ids(c, N, V);
    ((int32_t *)lab.h)[3] = ignore, ((int32_t *)lab.h)[17] = ignore;
    c->g->ops->upload(c->g, lab.d, lab.h, lab.bytes);
    buf loss = zeros(c, 1), d = zeros(c, (size_t)N * V);
    buf cnt = mk_bytes(c, NULL, sizeof(int32_t)), ok = mk_bytes(c, NULL, sizeof(int64_t));
    BOTH(xent_forward, (F(loss), F(probs), F(logits), lab.h, N, V, ignore, (int32_t *)cnt.h),
         (G(loss), G(probs), G(logits), lab.d, N, V, ignore, (int32_t *)cnt.d));
    /* probs of ignored rows are left as they were on both: zero here */
    CHECK(c, "xent_forward (loss, probs)", 1e-6, 1e-5, loss, probs);
    int32_t cnt_c = *(int32_t *)cnt.h, cnt_g = -2;
    c->g->ops->download(c->g, &cnt_g, cnt.d, sizeof cnt_g);
    report(c, "xent_forward counted", cnt_c == cnt_g && cnt_c == N - 2, (double)abs(cnt_c - cnt_g), 0, 0, 0);
    BOTH(xent_backward, (F(d), F(probs), lab.h, N, V, ignore, (const int32_t *)cnt.h, 2.0f),
         (G(d), G(probs), lab.d, N, V, ignore, (const int32_t *)cnt.d, 2.0f));
    CHECK(c, "xent_backward", 1e-7, 1e-5, d);
    BOTH(count_correct, ((int64_t *)ok.h, F(logits), lab.h, N, V), ((int64_t *)ok.d, G(logits), lab.d, N, V));
    int64_t ok_c = *(int64_t *)ok.h, ok_g = -1;
    c->g->ops->download(c->g, &ok_g, ok.d, sizeof ok_g);
    report(c, "count_correct", ok_c == ok_g, (double)llabs(ok_c - ok_g), 0, 0, 0);
    drop(c, &cnt), drop(c, &ok);
    const size_t n = 12345;
    buf p = mk(c, n, -2, 2), t = mk(c, n, -2, 2), dp = zeros(c, n);
    BOTH(mse_forward, (F(loss), F(p), F(t), n), (G(loss), G(p), G(t), n));
    CHECK(c, "mse_forward", 1e-6, 1e-5, loss);
    BOTH(mse_backward, (F(dp), F(p), F(t), n, 0.5f), (G(dp), G(p), G(t), n, 0.5f));
    CHECK(c, "mse_backward", 0, 0, dp);
    drop(c, &logits), drop(c, &probs), drop(c, &lab), drop(c, &loss), drop(c, &d), drop(c, &p), drop(c, &t);
    drop(c, &dp);
}

/* The slots the cuda table leaves NULL, so the graph never plans what needs them. */
static void k_absent(ctx *c) {
    const dt_kernel_table *g = c->gpu;
    if (strcmp(g->name, "cuda")) return; /* another device under test (checked): its table is the CPU's */
    const bool none = !g->conv2d_forward_blocked && !g->conv2d_backward_blocked && !g->maxpool2d_forward_blocked &&
                      !g->maxpool2d_backward_blocked && !g->conv_pool_forward && !g->conv_pool_backward &&
                      !g->linear_forward_bf16 && !g->gelu_forward_bf16 && !g->conv2d_bf16_values;
    report(c, "blocked, fused and bf16 slots absent", none, 0, 0, 0, 0);
}

static void run_kernels(ctx *c) {
    k_linear(c);
    k_conv(c);
    k_pool(c);
    k_activations(c);
    k_norms(c);
    k_embedding(c);
    k_attention(c);
    k_losses(c);
    k_absent(c);
}
