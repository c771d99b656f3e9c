/* libFuzzer target: the parameter server's side of its protocol. Each input is a server set-up
 * (workers, fixed or dynamic assignment, overlap, where the run starts) followed by push headers
 * from chosen workers, as a hostile or corrupted worker could send them; every header goes through
 * the server's own check (dt_ps_push_check) and, when accepted, its bookkeeping
 * (dt_ps_push_record: staleness bins, epoch figures, units in, clocks). A crash, an
 * out-of-bounds index or an unbounded allocation is a bug. */
#include "fuzz/fuzz_common.h"
#include "parallel/ps_server.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t workers, flags, epochs, start_epoch;
    uint16_t units, batch;
} fuzz_setup;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_setup f;
    if (size < sizeof f) return 0;
    memcpy(&f, data, sizeof f);
    data += sizeof f, size -= sizeof f;
    const int W = 1 + f.workers % 8;
    ps_state p = {.S = 1, .W = W, .me = 0, .dynamic = f.flags & 1, .overlap = (f.flags & 3) == 3};
    p.staleness = -1;
    dt_serve_config cfg = {.batch = 1 + f.batch % 512, .epochs = 1 + f.epochs % 8};
    cfg.start_epoch = f.start_epoch % cfg.epochs;
    cfg.units_per_epoch = 1 + f.units % 1024;
    cfg.start_step_in_epoch = (f.flags >> 2) % (1 + cfg.units_per_epoch / W);
    server sv = {.p = &p, .cfg = &cfg, .idx = 0};
    sv.units = cfg.units_per_epoch;
    sv.total = p.dynamic ? INT64_MAX : cfg.epochs * cfg.units_per_epoch;
    sv.ep0 = cfg.start_epoch, sv.nep = cfg.epochs - cfg.start_epoch;
    if (dt_ps_books_alloc(&sv) != DT_OK) return 0;
    pthread_mutex_init(&sv.mu, NULL);
    pthread_cond_init(&sv.cv, NULL);
    for (int k = 0; k < W * 2; k++) sv.pending[k] = k < W ? k : -1; /* worker w starts holding seq w */
    while (size >= 1 + sizeof(ps_push)) {
        int w = data[0] % W;
        ps_push m;
        memcpy(&m, data + 1, sizeof m);
        data += 1 + sizeof m, size -= 1 + sizeof m;
        pthread_mutex_lock(&sv.mu);
        if (dt_ps_push_check(&sv, w, &m) == DT_OK) dt_ps_push_record(&sv, w, &m);
        pthread_mutex_unlock(&sv.mu);
    }
    dt_ps_books_free(&sv);
    pthread_cond_destroy(&sv.cv);
    pthread_mutex_destroy(&sv.mu);
    return 0;
}
