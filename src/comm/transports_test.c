/* Unit test of the transport registry (transports.c): every entry is complete (name, help,
 * options, probe, create), names resolve with and without options, options go only to entries
 * that take them, the automatic choice follows the probes (one process -> self, dtrain launch ->
 * shm, mpirun -> mpi where built, every rank on a CUDA device -> nccl where built), and the help
 * text the CLI and the man page show names every entry. */
#include "comm/transport.h"
#include "core/test.h"

#include <stdio.h>
#include <string.h>

static const char *chosen(int size, dt_launcher l, const char *device) {
    dt_transport_params p = {.size = size, .launcher = l, .device = device};
    const dt_transport_kind *k = NULL;
    if (dt_transport_choose(&p, &k) != DT_OK) return "(none)";
    return k->name;
}

static void test_entries(void) {
    int n = 0;
    const dt_transport_kind *const *kinds = dt_transport_kinds(&n);
    CHECK(n >= 3);
    const char *help = dt_comm_transport_help();
    for (int i = 0; i < n; i++) {
        const dt_transport_kind *k = kinds[i], *f = NULL;
        CHECK_MSG(k->name && *k->name && k->help && *k->help && k->options && k->probe && k->create,
                  "entry %d (%s) is incomplete", i, k->name ? k->name : "?");
        CHECK_MSG(strstr(help, k->name) && strstr(help, k->help), "help lacks %s", k->name);
        const char *opts = "x";
        CHECK(dt_transport_find(k->name, &f, &opts) == DT_OK && f == k && !strcmp(opts, ""));
        CHECK(dt_comm_transport_check(k->name) == DT_OK);
        char spec[64];
        snprintf(spec, sizeof spec, "%s:bogus=1", k->name);
        CHECK(dt_transport_find(spec, &f, &opts) == DT_OK && f == k && !strcmp(opts, "bogus=1"));
        if (!*k->options) {
            CHECK(dt_comm_transport_check(spec) == DT_EINVAL && strstr(dt_last_error(), "takes no options"));
            dt_transport *t = (dt_transport *)&t;
            dt_transport_params p = {.size = 1, .options = "bogus=1"};
            CHECK(dt_transport_create(k, &t, &p) == DT_EINVAL && t == NULL);
        }
    }
    const dt_transport_kind *f = (const dt_transport_kind *)&f;
    CHECK(dt_transport_find("tcp", &f, NULL) == DT_EINVAL && f == NULL);
    CHECK(strstr(dt_last_error(), "unknown transport 'tcp'") && strstr(dt_last_error(), "shm"));
    CHECK(dt_comm_transport_check("auto") == DT_OK && dt_comm_transport_check("") == DT_EINVAL);
    CHECK(strstr(dt_comm_transport_names(), "shm") && strstr(dt_comm_transport_names(), " or "));
}

static void test_choice(void) {
    CHECK(!strcmp(chosen(1, DT_LAUNCH_NONE, NULL), "self"));
    CHECK(!strcmp(chosen(1, DT_LAUNCH_LOCAL, NULL), "self"));
    CHECK(!strcmp(chosen(4, DT_LAUNCH_NONE, NULL), "shm"));
    CHECK(!strcmp(chosen(4, DT_LAUNCH_LOCAL, "cpu"), "shm"));
    CHECK(!strcmp(chosen(4, DT_LAUNCH_LOCAL, "checked:arena=64M"), "shm"));
#ifdef DT_HAVE_MPI
    CHECK(!strcmp(chosen(4, DT_LAUNCH_MPI, NULL), "mpi"));
    CHECK(!strcmp(chosen(1, DT_LAUNCH_MPI, NULL), "mpi")); /* srun -n 1: as before the registry */
#else
    CHECK(!strcmp(chosen(4, DT_LAUNCH_MPI, NULL), "(none)") && strstr(dt_last_error(), "built without MPI"));
#endif
#ifdef DT_HAVE_NCCL
    CHECK(!strcmp(chosen(4, DT_LAUNCH_LOCAL, "cuda"), "nccl"));
    CHECK(!strcmp(chosen(2, DT_LAUNCH_MPI, "cuda:1"), "nccl"));
    CHECK(!strcmp(chosen(1, DT_LAUNCH_LOCAL, "cuda"), "self")); /* one process: nothing to connect */
    CHECK(!strcmp(chosen(2, DT_LAUNCH_LOCAL, "cudax"), "shm"));
#else
    CHECK(!strcmp(chosen(4, DT_LAUNCH_LOCAL, "cuda"), "shm")); /* host-staged: every rank still runs */
#endif
}

int main(void) {
    test_entries();
    test_choice();
    return dt_test_summary("transports_test");
}
