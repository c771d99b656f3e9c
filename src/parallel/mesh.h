/* The DP x PP x TP mesh: the world's ranks laid out as a grid, each axis a communicator made by
 * dt_comm_split (Megatron-LM's order, TP innermost so that a tensor-parallel group is ranks that
 * are next to each other, on one host):
 *     rank = (dp_i * PP + pp_i) * TP + tp_i
 * A strategy takes the communicator of its own axis: tensor parallel the tp one, a pipeline
 * strategy the pp one, DDP the dp one. An axis of one rank has a communicator of one. */
#ifndef DT_PARALLEL_MESH_H
#define DT_PARALLEL_MESH_H

#include "dtrain/comm.h"

typedef struct {
    int tp, pp, dp;                       /* axis sizes; tp * pp * dp = the world size */
    int tp_rank, pp_rank, dp_rank;        /* this rank's coordinates */
    dt_comm *tp_comm, *pp_comm, *dp_comm; /* owned; NULL only for a world of one process */
} dt_mesh;

/* This rank's coordinates in a mesh of tp x pp (dp = the rest) from its world rank. */
void dt_mesh_coords(int rank, int tp, int pp, int *tp_rank, int *pp_rank, int *dp_rank);
/* The data part of a rank in a mesh of tp x pp: every rank of one model copy (its stages and
 * their tp ranks) trains the same samples, so the data is split over the dp axis only (*data_rank
 * = the dp coordinate of *data_world = size / (tp * pp)). A size that tp x pp does not divide
 * leaves both as they are (the strategy then refuses it, saying what divides). */
void dt_mesh_data_part(int rank, int size, int tp, int pp, int *data_rank, int *data_world);
/* The world rank at coordinates (tp_rank, pp_rank, dp_rank). */
int dt_mesh_rank(int tp, int pp, int tp_rank, int pp_rank, int dp_rank);

/* Splits world (borrowed; NULL = one process) into the mesh of tp x pp x (the rest) data-parallel
 * ranks. Collective over world. DT_EINVAL when tp * pp does not divide the world size, saying
 * which sizes do. */
dt_status dt_mesh_create(dt_mesh *m, dt_comm *world, int tp, int pp);
/* Frees the axis communicators; a zeroed mesh is a no-op. */
void dt_mesh_free(dt_mesh *m);

#endif
