/* Federated learning (issue 17): the wire protocol, client-side local training, server-side
 * aggregation (FedAvg / FedProx), secure aggregation (Bonawitz et al. 2017) and DP-FedAvg with a
 * Renyi-DP accountant. Sits beside parallel/ and run/: uses nn/, optim/, data/, core/ only. */
#ifndef DT_FL_H
#define DT_FL_H

#include "dtrain/core.h"
#include "dtrain/data.h"
#include "dtrain/nn.h"

#include <stddef.h>
#include <stdint.h>

/* ---- framing ------------------------------------------------------------------------------ *
 * A frame is a 20-byte header then `length` payload bytes. Header (little endian):
 *   magic u32 "DTFL" | version u16 | type u16 | length u32 | crc32(payload) u32 | crc32(header[0..16)) u32
 * The header is checked whole (magic, version, known type, length <= the receiver's limit,
 * header CRC) before any payload memory is allocated; the payload CRC is checked once it is in. */
#define DT_FL_MAGIC 0x4c465444u /* "DTFL" */
#define DT_FL_VERSION 1
#define DT_FL_HEADER 20
/* Largest payload any peer accepts: 4 B per parameter for 16M parameters plus a small header. */
#define DT_FL_MAX_PAYLOAD ((uint32_t)(64u << 20) + 4096u)
/* Largest model a message may carry (parameters). */
#define DT_FL_MAX_PARAMS (16u << 20)
#define DT_FL_MAX_CLIENTS 1024
/* Connections not yet past HELLO the server holds at most (default of --max-pending), and the
 * seconds each has to complete its HELLO (default of --hello-timeout). */
#define DT_FL_MAX_PENDING 128
#define DT_FL_MAX_PENDING_LIMIT 4096
#define DT_FL_HELLO_TIMEOUT 10.0
/* HELLO's payload (client id u64, sample count u32): the largest frame accepted before it. */
#define DT_FL_HELLO_SIZE 12

typedef enum {
    DT_FL_HELLO = 1,     /* client -> server: id, sample count */
    DT_FL_MODEL = 2,     /* server -> client: round, training settings, global parameters */
    DT_FL_UPDATE = 3,    /* client -> server: round, sample count, parameter delta (f32) */
    DT_FL_BYE = 4,       /* server -> client: training is over */
    DT_FL_SA_KEYS = 5,   /* client -> server: X25519 public keys (secure aggregation) */
    DT_FL_SA_ROSTER = 6, /* server -> client: the round's participants and their public keys */
    DT_FL_SA_SHARES = 7, /* client -> server: encrypted Shamir shares, one per other participant */
    DT_FL_SA_MASKED = 8, /* client -> server: masked fixed-point update (u32 words) */
    DT_FL_SA_UNMASK = 9, /* server -> client: who survived; client -> server: the shares asked for */
    DT_FL_TYPE_MAX = 9
} dt_fl_type;

/* Writes the header of a frame of `type` with payload[0..len) into hdr[DT_FL_HEADER]. */
void dt_fl_header_encode(uint8_t *hdr, uint16_t type, const void *payload, uint32_t len);
/* Checks a received header: magic, version, type, length <= max_len, header CRC. DT_EFORMAT
 * with a message naming the bad field otherwise. *type and *len get the fields. */
dt_status dt_fl_header_decode(const uint8_t *hdr, uint32_t max_len, uint16_t *type, uint32_t *len, uint32_t *crc);

/* An incremental frame reader over a byte stream (a non-blocking socket, or fuzz input). */
typedef struct {
    uint8_t hdr[DT_FL_HEADER];
    uint32_t have; /* bytes of the current frame received (header included) */
    uint16_t type;
    uint32_t len, crc;
    uint8_t *payload; /* allocated once the header checks out */
    uint32_t max_len;
} dt_fl_reader;

void dt_fl_reader_init(dt_fl_reader *r, uint32_t max_len);
void dt_fl_reader_free(dt_fl_reader *r);
/* Consumes bytes from data[0..n): *used gets how many. Returns 1 when a whole checked frame is
 * ready (r->type, r->len, r->payload; call dt_fl_reader_take or _reset before feeding more),
 * 0 when more bytes are needed, or a negative status for a malformed frame. */
int dt_fl_reader_feed(dt_fl_reader *r, const uint8_t *data, size_t n, size_t *used);
/* Hands the ready frame's payload to the caller (free() it) and readies for the next frame. */
uint8_t *dt_fl_reader_take(dt_fl_reader *r);

/* Sends one frame on a blocking or non-blocking socket fd before the absolute deadline
 * (dt_now() seconds). DT_ETIMEDOUT or DT_EPEER (closed, reset) naming `who`. */
dt_status dt_fl_send(int fd, uint16_t type, const void *payload, uint32_t len, double deadline, const char *who);
/* Receives one frame on fd before the deadline into *payload (malloc'd, free it) / *type / *len. */
dt_status dt_fl_recv(int fd, dt_fl_reader *r, uint16_t *type, uint8_t **payload, uint32_t *len, double deadline,
                     const char *who);

/* ---- message bodies ----------------------------------------------------------------------- */

/* A bounds-checked little-endian cursor over a payload. Reads past the end set `bad`. */
typedef struct {
    const uint8_t *p;
    size_t n, off;
    int bad;
} dt_fl_cur;
/* A growable writer. */
typedef struct {
    uint8_t *p;
    size_t n, cap;
    int bad;
} dt_fl_buf;

uint32_t dt_fl_get_u32(dt_fl_cur *c);
uint64_t dt_fl_get_u64(dt_fl_cur *c);
float dt_fl_get_f32(dt_fl_cur *c);
/* Points at the next n bytes (NULL and bad when fewer remain). */
const uint8_t *dt_fl_get_bytes(dt_fl_cur *c, size_t n);
void dt_fl_put_u32(dt_fl_buf *b, uint32_t v);
void dt_fl_put_u64(dt_fl_buf *b, uint64_t v);
void dt_fl_put_f32(dt_fl_buf *b, float v);
void dt_fl_put_bytes(dt_fl_buf *b, const void *p, size_t n);
void dt_fl_buf_free(dt_fl_buf *b);

typedef struct {
    uint64_t client_id;
    uint32_t samples;
} dt_fl_hello;

/* Training settings the server sends with the model. */
typedef struct {
    uint32_t round;
    uint32_t epochs; /* local epochs E (0 with steps = 1: FedSGD, one full-batch gradient) */
    uint32_t batch;  /* local batch (0 = the whole local set) */
    float lr;
    float mu;       /* FedProx proximal weight (0 = FedAvg) */
    uint32_t flags; /* DT_FL_F_* */
    uint64_t seed;
    float clip;          /* > 0: the client clips its update to this L2 norm (DP with secure aggregation) */
    float range;         /* secure aggregation: fixed-point clamp of each value */
    uint32_t frac;       /* secure aggregation: fixed-point fraction bits */
    uint32_t n;          /* parameters */
    const float *params; /* points into the payload */
} dt_fl_model_msg;
#define DT_FL_F_SECURE 1u     /* run the secure-aggregation exchange */
#define DT_FL_F_UNWEIGHTED 2u /* secure aggregation: weight 1 instead of the sample count (DP) */

typedef struct {
    uint32_t round;
    uint32_t samples;
    uint32_t n;
    const float *delta; /* points into the payload (f32 little endian, aligned copy made by caller) */
} dt_fl_update_msg;

dt_status dt_fl_hello_encode(dt_fl_buf *b, const dt_fl_hello *h);
dt_status dt_fl_hello_decode(const uint8_t *p, uint32_t len, dt_fl_hello *h);
dt_status dt_fl_model_encode(dt_fl_buf *b, const dt_fl_model_msg *m);
/* Decodes a model message; n is checked against DT_FL_MAX_PARAMS and the payload length. */
dt_status dt_fl_model_decode(const uint8_t *p, uint32_t len, dt_fl_model_msg *m);
dt_status dt_fl_update_encode(dt_fl_buf *b, const dt_fl_update_msg *u);
/* Decodes an update; expect_n > 0 requires exactly that many parameters. */
dt_status dt_fl_update_decode(const uint8_t *p, uint32_t len, uint32_t expect_n, dt_fl_update_msg *u);

/* ---- local training and aggregation ------------------------------------------------------- */

/* Trains a copy of the global parameters on a client's data: E epochs of SGD at lr over batches
 * of `batch` (0: the whole set) shuffled by (seed, round, epoch); with mu > 0 the FedProx term
 * mu/2 |w - w_global|^2 is added to the loss. epochs = 0 is FedSGD: one gradient step on the whole
 * set. delta[n] gets w_local - w_global; *loss the mean training loss of the last epoch. */
dt_status dt_fl_local_train(dt_model *m, const dt_dataset *ds, const float *global, const dt_fl_model_msg *cfg,
                            float *delta, float *loss);

/* Weighted FedAvg accumulation: acc[n] += w * delta[n]. */
void dt_fl_accumulate(double *acc, const float *delta, size_t n, double w);
/* Scales delta to L2 norm at most clip (clip <= 0: no-op); returns the norm before clipping. */
double dt_fl_clip(float *delta, size_t n, double clip);

/* Evaluates the model with params on ds: *acc (fraction correct) and *loss (mean). */
dt_status dt_fl_evaluate(dt_model *m, const dt_dataset *ds, double *acc, double *loss);

/* ---- partitions --------------------------------------------------------------------------- */

/* Splits the n samples of labels[] (classes) among k clients: "iid" (a shuffled even cut),
 * "shards:S" (sorted by label, cut into k*S shards, S per client: McMahan et al.) or
 * "dirichlet:A" (per class, proportions ~ Dir(A): Hsu et al. 2019). owner[i] gets sample i's
 * client. Deterministic in seed. DT_EINVAL naming the spec when malformed. */
dt_status dt_fl_partition(const char *spec, const int32_t *labels, size_t n, int classes, int k, uint64_t seed,
                          int *owner);

/* ---- Renyi-DP accountant (subsampled Gaussian mechanism) ---------------------------------- */

/* RDP of one step of the Poisson-subsampled Gaussian mechanism with sampling rate q and noise
 * multiplier sigma at integer order alpha >= 2 (Mironov, Talwar, Zhang 2019, Sec. 3.3). */
double dt_fl_rdp_step(double q, double sigma, int alpha);
/* epsilon after `steps` steps for delta, minimised over orders 2..256 (conversion of
 * Mironov 2017, Prop. 3). *best_alpha (may be NULL) gets the order. */
double dt_fl_dp_epsilon(double q, double sigma, int64_t steps, double delta, int *best_alpha);

/* ---- connections (server side, non-blocking) ---------------------------------------------- */

/* Parses "HOST:PORT" (IPv4 name or address; port 0 = any, for the listener) into addr. */
struct sockaddr_in;
dt_status dt_fl_parse_addr(const char *spec, const char *flag, struct sockaddr_in *addr);

/* ---- server ------------------------------------------------------------------------------- */

typedef struct {
    const char *listen;     /* "ADDR:PORT" */
    int rounds;             /* rounds to run in all (a resumed run continues to this) */
    int clients_per_round;  /* C */
    int min_clients;        /* connected clients needed before a round starts (default C) */
    int start_clients;      /* ... before the first round of this process (default min_clients) */
    double round_timeout;   /* seconds a round waits for updates */
    double wait_timeout;    /* seconds to wait for min_clients to connect */
    double hello_timeout;   /* seconds a new connection has to complete HELLO (0: DT_FL_HELLO_TIMEOUT) */
    int max_clients;        /* registered clients at most; a HELLO beyond is refused (0: DT_FL_MAX_CLIENTS) */
    int max_pending;        /* connections before HELLO at most; the oldest makes way (0: DT_FL_MAX_PENDING) */
    int retries;            /* a round with no usable update is run again up to this often */
    uint32_t epochs, batch; /* local training; epochs 0 = FedSGD */
    float lr, mu;
    uint64_t seed;
    double dp_clip, dp_noise, dp_delta; /* DP-FedAvg: clip 0 = off */
    int secure;                         /* secure aggregation */
    int sa_threshold;                   /* Shamir threshold t (0: a majority of the round) */
    double sa_range;                    /* fixed-point: |update value| clamped to this */
    const char *checkpoint;             /* global model file written after each round (NULL: none) */
    int resume;                         /* continue from checkpoint */
    const char *metrics;                /* JSONL per round (NULL: none) */
    int eval_every;                     /* evaluate every N rounds (and the last) */
    int quiet;
} dt_fl_server_config;

/* Round results, for the metrics line and for fl-sim's benchmark. */
typedef struct {
    int round, sampled, updates, dropped, retries;
    int late;                     /* of dropped: sampled clients dropped for missing the round's deadline */
    double acc, loss, eps;        /* eps < 0: no DP */
    double wall_s;                /* whole round */
    double server_cpu_s;          /* the server thread's CPU time in the round, evaluation excluded */
    uint64_t bytes_in, bytes_out; /* payload+header bytes, all clients */
} dt_fl_round_stats;

typedef struct dt_fl_server dt_fl_server;
typedef void (*dt_fl_round_fn)(void *ctx, const dt_fl_round_stats *st);

/* Binds the listener and takes the initial global model from m (or the checkpoint on resume).
 * m and test (may be NULL: no evaluation) stay owned by the caller and must outlive the server. */
dt_status dt_fl_server_create(dt_fl_server **s, const dt_fl_server_config *cfg, dt_model *m, const dt_dataset *test);
/* The port the listener got (for ":0"). */
int dt_fl_server_port(const dt_fl_server *s);
/* Runs the rounds; fn (may be NULL) is called after each. Ends by telling every client BYE. */
dt_status dt_fl_server_run(dt_fl_server *s, dt_fl_round_fn fn, void *ctx);
void dt_fl_server_destroy(dt_fl_server *s);

/* ---- client ------------------------------------------------------------------------------- */

typedef enum {
    DT_FL_FAULT_NONE,
    DT_FL_FAULT_DIE,
    DT_FL_FAULT_SILENT,
    DT_FL_FAULT_GARBAGE,
    DT_FL_FAULT_DROP_AFTER_MASK
} dt_fl_fault;

typedef struct {
    const char *server; /* "ADDR:PORT" */
    uint64_t client_id;
    double connect_timeout; /* give up after failing this long to reach the server, or to get a message on a session */
    double idle_timeout;    /* give up when the server sends nothing this long */
    dt_fl_fault fault;      /* test hook: misbehave on the first model received */
    int quiet;
} dt_fl_client_config;

/* Connects, trains on each model received and sends the update, until the server says BYE.
 * While the server is away, or closes the connection before sending anything, it retries after
 * 0.1 s doubling to 2 s (each wait drawn from [w/2, w) by client id), one log line per closed
 * session. m is the client's model (same spec as the server's), ds its local data. *rounds (may
 * be NULL) gets the updates sent. DT_ETIMEDOUT naming the server when no session got a message
 * from it for connect_timeout seconds since the first failure in a row. */
dt_status dt_fl_client_run(const dt_fl_client_config *cfg, dt_model *m, const dt_dataset *ds, int *rounds);

#endif
