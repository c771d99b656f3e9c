/* Shared by dtrain fl-server, fl-client and fl-sim: the server's flags (one table fragment),
 * their checks, and opening the model and a client's share of a data set. */
#ifndef DT_CLI_CMD_FL_H
#define DT_CLI_CMD_FL_H

#include "cli/cli.h"
#include "fl/fl.h"

typedef struct {
    dt_fl_server_config sc;
    int rounds, cpr, epochs, batch, retries, eval_every, min_clients, sa_threshold, secure, resume, quiet;
    int max_clients, max_pending;
    float lr, mu, round_timeout, wait_timeout, hello_timeout, dp_clip, dp_noise, dp_delta, sa_range;
    int64_t seed;
    const char *model, *data, *listen, *checkpoint, *metrics, *device;
} dt_fl_opts;

/* Defaults of every flag. */
void dt_fl_opts_defaults(dt_fl_opts *o);
/* The server/training flags, for a command's table (count in *n). */
#define DT_FL_SERVER_FLAGS(o)                                                                                          \
    {"model", DT_FLAG_STR, &(o)->model, "SPEC", "model spec or preset (mlp, cnn)"},                                    \
        {"data", DT_FLAG_STR, &(o)->data, "PATH", "data set (the server evaluates on its test split)"},                \
        {"rounds", DT_FLAG_INT, &(o)->rounds, "N", "federated rounds in all"},                                         \
        {"clients-per-round", DT_FLAG_INT, &(o)->cpr, "C", "clients sampled each round"},                              \
        {"min-clients", DT_FLAG_INT, &(o)->min_clients, "N", "connected clients needed to start a round (default C)"}, \
        {"local-epochs", DT_FLAG_INT, &(o)->epochs, "E", "local epochs per round; 0 = FedSGD (one full-batch step)"},  \
        {"batch", DT_FLAG_INT, &(o)->batch, "B", "local batch; 0 = the whole local set"},                              \
        {"lr", DT_FLAG_FLOAT, &(o)->lr, "LR", "local SGD learning rate"},                                              \
        {"mu", DT_FLAG_FLOAT, &(o)->mu, "MU", "FedProx proximal weight; 0 = FedAvg (keep lr*mu < 2)"},                 \
        {"seed", DT_FLAG_I64, &(o)->seed, "S", "initialisation, sampling and shuffling seed"},                         \
        {"round-timeout", DT_FLAG_FLOAT, &(o)->round_timeout, "S",                                                     \
         "seconds a round (each secure-aggregation step) waits"},                                                      \
        {"wait-timeout", DT_FLAG_FLOAT, &(o)->wait_timeout, "S", "seconds to wait for --min-clients to connect"},      \
        {"hello-timeout", DT_FLAG_FLOAT, &(o)->hello_timeout, "S", "seconds a new connection has to say HELLO"},       \
        {"max-clients", DT_FLAG_INT, &(o)->max_clients, "N", "registered clients at most; more are turned away"},      \
        {"max-pending", DT_FLAG_INT, &(o)->max_pending, "N",                                                           \
         "connections waiting for their HELLO at most (oldest goes)"},                                                 \
        {"retries", DT_FLAG_INT, &(o)->retries, "N", "times a round without a usable update is run again"},            \
        {"eval-every", DT_FLAG_INT, &(o)->eval_every, "N", "evaluate the global model every N rounds (and the last)"}, \
        {"checkpoint", DT_FLAG_STR, &(o)->checkpoint, "FILE", "global model written after every round"},               \
        {"resume", DT_FLAG_BOOL, &(o)->resume, NULL, "continue from --checkpoint (its round count)"},                  \
        {"metrics", DT_FLAG_STR, &(o)->metrics, "FILE", "append one JSON line per round"},                             \
        {"secure-agg", DT_FLAG_BOOL, &(o)->secure, NULL, "secure aggregation (Bonawitz et al. 2017)"},                 \
        {"sa-threshold", DT_FLAG_INT, &(o)->sa_threshold, "T", "Shamir threshold; 0 = a majority of the round"},       \
        {"sa-range", DT_FLAG_FLOAT, &(o)->sa_range, "R", "secure aggregation: each update value is clamped to +-R"},   \
        {"dp-clip", DT_FLAG_FLOAT, &(o)->dp_clip, "C", "DP-FedAvg: clip each client's update to L2 norm C; 0 = off"},  \
        {"dp-noise", DT_FLAG_FLOAT, &(o)->dp_noise, "SIGMA", "DP-FedAvg: Gaussian noise std SIGMA*C on the sum"},      \
        {"dp-delta", DT_FLAG_FLOAT, &(o)->dp_delta, "D", "delta of the reported (epsilon, delta)"},                    \
        {"quiet", DT_FLAG_BOOL, &(o)->quiet, NULL, "no per-round lines"}, {                                            \
        "device", DT_FLAG_STR, &(o)->device, "DEV", DT_FL_DEVICE_HELP                                                  \
    }

#define DT_FL_DEVICE_HELP                                                                                            \
    "where the models run: cpu (default) or checked[:arena=BYTES], the CPU kernels on memory the host cannot touch " \
    "(docs/device.md)"

/* Checks the flags and fills o->sc; returns 0 or an exit status (usage error printed). */
int dt_fl_opts_check(dt_fl_opts *o);
/* Opens data (train and test) and builds + initialises the model for it. Returns 0 or an exit
 * status (error printed). */
int dt_fl_open(const dt_fl_opts *o, dt_dataset **train, dt_dataset **test, dt_model **m);
/* Moves the just-built *m onto a device of its own made from device ("cpu" or NULL: stays), which
 * the model then owns; 0, or an exit status after saying why (*m freed and NULL). */
int dt_fl_model_device(dt_model **m, const char *device);
/* Client `idx` of k's share of ds under partition spec (its own copy); exit status or 0. */
int dt_fl_client_share(const dt_dataset *ds, const char *partition, int k, int idx, uint64_t seed, dt_dataset **out);
/* Copies samples idx[0..n) of ds into a new in-memory data set (u8 data stays u8). */
dt_status dt_fl_subset(const dt_dataset *ds, const uint32_t *idx, size_t n, dt_dataset **out);

#endif
