/* libFuzzer target: model spec strings (dt_spec_parse), as typed on the command line or read from
 * a checkpoint's dtrain.model_spec. Every spec that parses must format to a canonical string that
 * parses again to the same layers. Hangs (an empty argument name once spun forever) fail on -timeout. */
#include "dtrain/nn.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    char *s = malloc(size + 1);
    memcpy(s, data, size);
    s[size] = '\0';
    dt_layer_spec a[DT_MAX_LAYERS], b[DT_MAX_LAYERS];
    int na, nb;
    if (dt_spec_parse(s, a, DT_MAX_LAYERS, &na) == DT_OK) {
        char buf[8192];
        dt_spec_format(buf, sizeof buf, a, na);
        if (dt_spec_parse(buf, b, DT_MAX_LAYERS, &nb) != DT_OK || nb != na) abort(); /* canonical form must parse */
        for (int i = 0; i < na; i++)
            if (a[i].kind != b[i].kind || a[i].out != b[i].out || a[i].k != b[i].k || a[i].stride != b[i].stride ||
                a[i].pad != b[i].pad || a[i].bias != b[i].bias)
                abort();
    }
    free(s);
    return 0;
}
