/* Training configs by name and value, for bindings (Python's cffi in ABI mode, other FFIs) that
 * should not depend on the layout of dt_train_config: an owned config whose fields are set by
 * the `dtrain train` flag names ("epochs", "lr", "max-steps", ...) from strings, and a call that
 * trains it on N local workers. */
#ifndef DTRAIN_TRAIN_OPTIONS_H
#define DTRAIN_TRAIN_OPTIONS_H

#include "dtrain/data.h"
#include "dtrain/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_train_options dt_train_options;

/* A config with dt_train_defaults(); it owns the strings set into it. End it with _destroy. */
dt_status dt_train_options_create(dt_train_options **o);
/* NULL is a no-op. In-memory data sets given to it are borrowed, not freed. */
void dt_train_options_destroy(dt_train_options *o);
/* Sets the field of `dtrain train --KEY VALUE` (a leading "--" and '_' for '-' are accepted).
 * Flags without a value ("normalize", "nesterov") take "1"/"0". "optimizer" resets the optimizer's
 * settings to that optimizer's defaults: set it before "momentum", "weight-decay", ... DT_EINVAL
 * naming the key and the value when the key is unknown (the message lists the keys) or the value
 * does not parse. */
dt_status dt_train_options_set(dt_train_options *o, const char *key, const char *value);
/* Trains on in-memory data sets instead of "data" (dt_train_config.train_set/test_set, borrowed;
 * test may be NULL). */
void dt_train_options_set_data(dt_train_options *o, dt_dataset *train, dt_dataset *test);
/* The config, owned by o (valid until o is freed or set again): pass it to dt_trainer_create. */
dt_train_config *dt_train_options_config(dt_train_options *o);
/* The keys dt_train_options_set takes, space-separated; static storage. */
const char *dt_train_options_keys(void);

/* Trains cfg (comm is set per worker; callbacks are not called) on `workers` local worker
 * processes with dt_launch_workers, waiting at most timeout_s (0: none). Rank 0 writes cfg->save
 * and cfg->metrics. workers 1 trains in this process. Errors as dt_launch_workers. */
dt_status dt_train_local(const dt_train_config *cfg, int workers, double timeout_s);

#ifdef __cplusplus
}
#endif
#endif
