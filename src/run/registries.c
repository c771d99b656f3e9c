/* The registries of the training stack seen from outside (dtrain/train.h dt_registry_entry_at):
 * strategies (parallel/registry.c), compressors (parallel/compress.c), transports
 * (comm/transports.c) and devices (device/device.c), each entry's name, option syntax and help,
 * so that the CLI's usage text and the man page are made from the registries themselves. */
#include "comm/transport.h"
#include "device/device.h"
#include "dtrain/train.h"
#include "parallel/grad_sync.h"
#include "parallel/strategy.h"

bool dt_registry_entry_at(dt_registry r, int i, dt_registry_entry *out) {
    int n = 0;
    *out = (dt_registry_entry){0};
    if (i < 0) return false;
    switch (r) {
    case DT_REGISTRY_STRATEGY: {
        const dt_strategy_entry *const *e = dt_strategy_entries(&n);
        if (i < n) *out = (dt_registry_entry){e[i]->name, e[i]->options, e[i]->help};
        break;
    }
    case DT_REGISTRY_COMPRESSOR: {
        const dt_compressor *const *c = dt_compressors(&n);
        if (i < n) *out = (dt_registry_entry){c[i]->name, c[i]->options, c[i]->help};
        break;
    }
    case DT_REGISTRY_TRANSPORT: {
        const dt_transport_kind *const *k = dt_transport_kinds(&n);
        if (i < n) *out = (dt_registry_entry){k[i]->name, k[i]->options, k[i]->help};
        break;
    }
    case DT_REGISTRY_DEVICE: {
        const dt_device_kind *const *k = dt_device_kinds(&n);
        if (i < n) *out = (dt_registry_entry){k[i]->name, k[i]->options, k[i]->help};
        break;
    }
    }
    return i < n;
}
