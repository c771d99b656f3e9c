/* The runtime version query (dt_version): the library's own version, which an embedder linked
 * against a shared libdtrain can compare with the DTRAIN_VERSION of the headers it compiled with. */
#include "dtrain/core.h"
#include "dtrain/dtrain.h" /* DTRAIN_VERSION only: the one place the version is written */

const char *dt_version(void) { return DTRAIN_VERSION; }
