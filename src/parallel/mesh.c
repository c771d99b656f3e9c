/* The DP x PP x TP mesh (mesh.h): coordinates of a rank and three communicator splits. */
#include "parallel/mesh.h"

#include <stdio.h>
#include <string.h>

void dt_mesh_coords(int rank, int tp, int pp, int *tp_rank, int *pp_rank, int *dp_rank) {
    *tp_rank = rank % tp;
    *pp_rank = rank / tp % pp;
    *dp_rank = rank / (tp * pp);
}

void dt_mesh_data_part(int rank, int size, int tp, int pp, int *data_rank, int *data_world) {
    if (size % (tp * pp) != 0) return;
    int tr, pr;
    dt_mesh_coords(rank, tp, pp, &tr, &pr, data_rank);
    *data_world = size / (tp * pp);
}

int dt_mesh_rank(int tp, int pp, int tp_rank, int pp_rank, int dp_rank) {
    return (dp_rank * pp + pp_rank) * tp + tp_rank;
}

/* "1, 2 or 4": the divisors of n. */
static void divisors(int n, char *out, size_t cap) {
    size_t k = 0;
    out[0] = 0;
    for (int d = 1; d <= n && k < cap; d++)
        if (n % d == 0) k += (size_t)snprintf(out + k, cap - k, "%s%d", k ? ", " : "", d);
}

dt_status dt_mesh_create(dt_mesh *m, dt_comm *world, int tp, int pp) {
    memset(m, 0, sizeof *m);
    const int size = world ? dt_comm_size(world) : 1, rank = world ? dt_comm_rank(world) : 0;
    if (tp < 1 || pp < 1 || size % (tp * pp) != 0) {
        char ok[256];
        divisors(size, ok, sizeof ok);
        return dt_error(DT_EINVAL,
                        "`tp` %d x `pp` %d = %d ranks per model copy must divide the world size %d (the rest "
                        "are data parallel); tp x pp may be %s",
                        tp, pp, tp * pp, size, ok);
    }
    m->tp = tp, m->pp = pp, m->dp = size / (tp * pp);
    dt_mesh_coords(rank, tp, pp, &m->tp_rank, &m->pp_rank, &m->dp_rank);
    if (!world) return DT_OK;
    /* each split is collective over the world: every rank calls all three (an axis of one rank is
     * a communicator of one, so the trainer's balancer can take the dp axis whatever its size) */
    const int tp_color = m->dp_rank * pp + m->pp_rank, pp_color = m->dp_rank * tp + m->tp_rank,
              dp_color = m->pp_rank * tp + m->tp_rank;
    dt_status s = dt_comm_split(world, tp_color, m->tp_rank, &m->tp_comm);
    if (s == DT_OK) s = dt_comm_split(world, pp_color, m->pp_rank, &m->pp_comm);
    if (s == DT_OK) s = dt_comm_split(world, dp_color, m->dp_rank, &m->dp_comm);
    if (s != DT_OK) {
        dt_mesh_free(m);
        return dt_error_wrap(s, "building the %d (dp) x %d (pp) x %d (tp) mesh", size / (tp * pp), pp, tp);
    }
    return DT_OK;
}

void dt_mesh_free(dt_mesh *m) {
    dt_comm_destroy(m->tp_comm);
    dt_comm_destroy(m->pp_comm);
    dt_comm_destroy(m->dp_comm);
    m->tp_comm = m->pp_comm = m->dp_comm = NULL;
}
