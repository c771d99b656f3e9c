/* The trainer's test and benchmark aids (dt_train_config.aids): what dtrain's own tests and its
 * CLI's --slow set, kept out of the public config. Not part of the public API. */
#ifndef DT_RUN_TRAIN_AIDS_H
#define DT_RUN_TRAIN_AIDS_H

struct dt_train_aids {
    int slow_rank;     /* this rank sleeps (slow_factor - 1) x its compute time every step */
    float slow_factor; /* <= 1: off */
};
typedef struct dt_train_aids dt_train_aids;

#endif
