"""The C declarations dtrain's Python binding uses and the loading of libdtrain.so (cffi, ABI
mode): only opaque handles, plain C types and the public structs dt_param_info, dt_input_norm and
dt_model_source, whose layouts are fixed."""
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
void dt_train_options_destroy(dt_train_options *o);
dt_status dt_train_options_set(dt_train_options *o, const char *key, const char *value);
void dt_train_options_set_data(dt_train_options *o, dt_dataset *train, dt_dataset *test);
dt_train_config *dt_train_options_config(dt_train_options *o);
const char *dt_train_options_keys(void);
dt_status dt_train_local(const dt_train_config *cfg, int workers, double timeout_s);

dt_status dt_trainer_create(dt_trainer **t, const dt_train_config *cfg);
void dt_trainer_destroy(dt_trainer *t);
dt_status dt_trainer_run(dt_trainer *t);
dt_status dt_trainer_evaluate(dt_trainer *t, float *loss, float *acc);
dt_status dt_trainer_save(dt_trainer *t, const char *path);
dt_model *dt_trainer_model(dt_trainer *t);
int64_t dt_trainer_step(const dt_trainer *t);

dt_status dt_model_load(dt_model **m, const char *checkpoint);
void dt_model_destroy(dt_model *m);
const char *dt_model_spec(const dt_model *m);
int dt_model_num_tensors(const dt_model *m);
const dt_param_info *dt_model_tensor(const dt_model *m, int i);
float *dt_model_params(dt_model *m);
float *dt_model_buffers(dt_model *m);

dt_status dt_dataset_create(dt_dataset **out, int dtype, const void *x, const int32_t *y,
                            size_t n, int C, int H, int W, int classes);
void dt_dataset_destroy(dt_dataset *ds);
typedef struct {
    bool on;
    float mean, std;
} dt_input_norm;
typedef struct {
    const char *checkpoint;
    const char *weights;
    const char *model;
    const char *device;
} dt_model_source;
dt_status dt_model_open(dt_model **m, const dt_model_source *src, int C, int H, int W, dt_input_norm *norm);
dt_status dt_model_predict(dt_model *m, const void *x, int64_t n, float *logits);
int dt_model_in_size(const dt_model *m);
int dt_model_out_size(const dt_model *m);
int dt_model_classes(const dt_model *m);
int dt_model_in_dtype(const dt_model *m);
dt_status dt_evaluate_checkpoint(const char *checkpoint, const char *data, int batch, float *loss, float *acc,
                                 int64_t *samples, const char **split);
"""

DT_F32 = 0
DT_I32 = 4
DT_U8 = 6

ffi = cffi.FFI()
ffi.cdef(CDEF)

HERE = os.path.dirname(os.path.abspath(__file__))
# what `pip install ./python` puts into the package: the build's libdtrain.so and dtrain command
NATIVE = os.path.join(HERE, "_native")
# a source tree's build directory, for `PYTHONPATH=python` in a checkout
TREE_BUILD = os.path.join(HERE, "..", "..", "build")


def _candidates():
    env = os.environ.get("DTRAIN_LIB")
    if env:
        yield env
    yield os.path.join(NATIVE, "libdtrain.so")
    yield os.path.join(TREE_BUILD, "libdtrain.so")
    found = ctypes.util.find_library("dtrain")
    if found:
        yield found
    yield "libdtrain.so.0"


def load():
    """Opens libdtrain: $DTRAIN_LIB, the copy inside the installed package, a source tree's
    build/ beside the package, or the system's (make install); returns (lib, path)."""
    errors = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            continue
        try:
            return ffi.dlopen(path), path
        except OSError as e:
            errors.append("%s: %s" % (path, e))
    raise OSError("cannot load libdtrain: reinstall the package from a built tree (make; pip install ./python), "
                  "run `make install`, or set DTRAIN_LIB=/path/to/libdtrain.so (tried: %s)"
                  % "; ".join(errors or ["nothing found"]))


lib, path = load()
