"""The C declarations dtrain's Python binding uses and the loading of libdtrain.so (cffi, ABI
mode): only opaque handles, plain C types and dt_param_info, whose layout is public and fixed."""
import ctypes.util
import os

import cffi

CDEF = """
typedef int dt_status;
typedef struct dt_trainer dt_trainer;
typedef struct dt_model dt_model;
typedef struct dt_dataset dt_dataset;
typedef struct dt_train_options dt_train_options;
typedef struct dt_train_config dt_train_config;
typedef struct {
    char name[64];
    bool is_buffer;
    int layer;
    size_t offset;
    size_t numel;
    int ndim;
    int64_t shape[4];
} dt_param_info;

const char *dt_last_error(void);
const char *dt_status_str(dt_status s);

dt_status dt_train_options_create(dt_train_options **o);
void dt_train_options_free(dt_train_options *o);
dt_status dt_train_options_set(dt_train_options *o, const char *key, const char *value);
void dt_train_options_set_data(dt_train_options *o, dt_dataset *train, dt_dataset *test);
dt_train_config *dt_train_options_config(dt_train_options *o);
const char *dt_train_options_keys(void);
dt_status dt_train_local(const dt_train_config *cfg, int workers, double timeout_s);

dt_status dt_trainer_create(dt_trainer **t, const dt_train_config *cfg);
void dt_trainer_free(dt_trainer *t);
dt_status dt_trainer_run(dt_trainer *t);
dt_status dt_trainer_evaluate(dt_trainer *t, float *loss, float *acc);
dt_status dt_trainer_save(dt_trainer *t, const char *path);
dt_model *dt_trainer_model(dt_trainer *t);
int64_t dt_trainer_step(const dt_trainer *t);

dt_status dt_model_load(dt_model **m, const char *checkpoint);
void dt_model_free(dt_model *m);
const char *dt_model_spec(const dt_model *m);
int dt_model_num_tensors(const dt_model *m);
const dt_param_info *dt_model_tensor(const dt_model *m, int i);
float *dt_model_params(dt_model *m);
float *dt_model_buffers(dt_model *m);

dt_status dt_dataset_create(dt_dataset **out, int dtype, const void *x, const int32_t *y,
                            size_t n, int C, int H, int W, int classes);
void dt_dataset_free(dt_dataset *ds);
dt_status dt_evaluate_checkpoint(const char *checkpoint, const char *data, int batch, float *loss, float *acc,
                                 int64_t *samples, const char **split);
"""

DT_F32 = 0
DT_U8 = 6

ffi = cffi.FFI()
ffi.cdef(CDEF)


def _candidates():
    env = os.environ.get("DTRAIN_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    for build in ("build", os.environ.get("DTRAIN_BUILD", "build")):
        yield os.path.join(here, "..", "..", build, "libdtrain.so")
    found = ctypes.util.find_library("dtrain")
    if found:
        yield found
    yield "libdtrain.so.0"


def load():
    """Opens libdtrain: $DTRAIN_LIB, a build tree beside the package, or the system's."""
    errors = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            continue
        try:
            return ffi.dlopen(path)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
    raise OSError("cannot load libdtrain: set DTRAIN_LIB=/path/to/libdtrain.so, or run `make install` "
                  "(tried: %s)" % "; ".join(errors or ["nothing found"]))


lib = load()
