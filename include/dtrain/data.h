/* dtrain data layer: IDX, CSV, NumPy .npy, text (bytes) and token-file readers, an in-memory
 * data set kept in its compact dtype, a deterministic shuffling/sharding sampler and a prefetching batch loader. */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include "dtrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- IDX files (MNIST format) ------------------------------------------------------------- *
 * Big-endian header: 0x00 0x00 TYPE NDIM, NDIM u32 dims, then the data. Raw or gzip'd (detected
 * by the magic bytes 1f 8b). TYPE: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64. */

#define DT_IDX_MAX_DIMS 255

typedef struct {
    dt_dtype dtype;                /* DT_U8, DT_I8, DT_I16, DT_I32, DT_F32 or DT_F64 */
    int ndim;                      /* 0..255 */
    int64_t dims[DT_IDX_MAX_DIMS]; /* dims[0] is the number of items */
    size_t count;                  /* number of elements: product of dims */
    void *data;                    /* count elements in host byte order; owned (dt_idx_free) */
} dt_idx;

/* Reads a whole IDX file (raw or gzip'd) into out. On error out is zeroed and the message names
 * the file and the problem: DT_ENOENT missing, DT_EIO unreadable, DT_EFORMAT bad magic, dtype,
 * truncation or trailing data, DT_ENOMEM. */
dt_status dt_idx_read(const char *path, dt_idx *out);
/* Frees out->data and zeroes *out; safe on a zeroed struct. */
void dt_idx_free(dt_idx *idx);

/* ---- data sets ---------------------------------------------------------------------------- *
 * A data set holds n samples of shape (C,H,W) in their compact stored dtype (u8 images stay u8)
 * and int32 labels in [0, classes). Samples are converted to f32 only when a batch is built:
 * value = (raw * scale - mean) / std, with scale = 1/255 for 8-bit integer images (1 otherwise)
 * and mean = 0, std = 1 unless dt_dataset_set_normalize was called. */

typedef struct dt_dataset dt_dataset;

/* Opens a train set and (if test != NULL) its test set. path is one of:
 *  - "fashion-mnist" or "mnist": IDX directory $DTRAIN_DATASETS/<name> (default
 *    /usr/share/datasets/<name>); DT_ENOENT says what to install when it is missing;
 *  - a directory holding train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte
 *    and t10k-labels-idx1-ubyte (each raw or with .gz appended);
 *  - "npy:..." or a directory holding x_train.npy: NumPy arrays (dt_dataset_open_npy_spec);
 *  - a file ending in .csv or .csv.gz (default dt_csv_options). The test set is the sibling file
 *    whose name has "train" replaced by "test" (mnist_train.csv -> mnist_test.csv) when the name
 *    contains "train" and that file exists; otherwise *test is set to NULL.
 * Train and test share one class count (the larger). An IDX directory without both t10k files is
 * a training set alone (*test NULL). On error both outputs are NULL. A text spec
 * (dt_data_is_text) is DT_EINVAL: text sets open with dt_dataset_open_text. */
dt_status dt_dataset_open(dt_dataset **train, dt_dataset **test, const char *path);
/* Opens one data set from an IDX image file and an IDX label file (same item count). Image shape:
 * 1 dim -> (1,1,1), 2 dims (n,W) -> (1,1,W), 3 dims (n,H,W) -> (1,H,W), 4 dims (n,C,H,W);
 * more dims fold into C. Labels: an IDX file with one dim, of integers (class labels) or of floats
 * (regression targets, dt_dataset_has_targets; decoded privately, not through the cache). Integer
 * labels go through the shared decoded cache below. */
dt_status dt_dataset_open_idx(dt_dataset **out, const char *images_path, const char *labels_path);

/* ---- shared decoded cache (IDX data sets) ------------------------------------------------- *
 * N worker processes of one machine share ONE read-only copy of a decoded IDX data set instead
 * of each decoding its own: dt_dataset_open / dt_dataset_open_idx decode an images/labels pair
 * once into a cache file and every process maps it (MAP_SHARED, PROT_READ). The files stay and
 * are reused by later runs, which then start without decoding (Fashion-MNIST: 47.3 MB train +
 * 7.9 MB test: the samples as u8, int32 labels and a 4 KiB header; opening both takes ~20 ms
 * warm instead of ~200 ms of gunzip).
 *  - Where: /dev/shm (RAM), or the directory in env DTRAIN_DATA_CACHE (created 0700 if missing;
 *    use a local file system); unset, empty or 1 = /dev/shm; DTRAIN_DATA_CACHE=0 turns the cache
 *    off (each process decodes into private memory).
 *  - Name: dtrain-data-<16 hex>.v1, the hex a hash of the effective uid and the canonical paths of
 *    the two files (so a changed source replaces its own entry); dtrain-data-<hex>.lock is the
 *    builders' lock. Files are mode 0600 and owned by the user: workers run as one user, and a
 *    data set that its owner can read must not become readable by others through /dev/shm.
 *    Files of other users are never trusted.
 *  - Contents: a header (magic "DTDCACHE", version, byte order, IDX dtype, shape, counts, each
 *    source's path, size, mtime, ctime, inode, device and CRC32 of its first and last 64 KiB,
 *    CRC32 of the payload, CRC32 of the header), then the samples (page aligned), then labels.
 *  - Bounded: at most DTRAIN_DATA_CACHE_MAX entries per user (default 8); building a new one
 *    removes the least recently opened beyond that. A lock file exists only while its builder
 *    runs (it is removed before being released, also after a failed decode).
 *  - Rebuilt (atomically: decode into a temp file, rename over) when missing, when a source's
 *    identity differs (rewritten, touched, replaced), or when the file is damaged: wrong magic,
 *    version or size, header or payload checksum mismatch. Every open checks the full payload
 *    CRC (~17 ms for Fashion-MNIST). Processes that start together serialise on the lock: one
 *    decodes, the others wait (sleeping, up to 300 s) and map its file. A rewrite of a source
 *    in place that keeps its size, both 64 KiB ends and its mtime/ctime tick is not noticed.
 *  - Never fails a run: when the directory is missing or not writable, the entry would leave
 *    less than a quarter of the file system free, or anything else goes wrong, the data set is
 *    decoded privately and a line is logged at info level (DTRAIN_LOG=info).
 *  - Entries whose source files are gone are removed when a new entry is built. `dtrain cache ls`
 *    lists the files, `dtrain cache clear` removes them (processes that have them mapped keep
 *    working; never truncate or edit one in place: processes mapping it would fault). CSV data
 *    sets are always private. */

/* The cache file the data set's samples are mapped from, or "" when they are private memory. */
const char *dt_dataset_cache_file(const dt_dataset *ds);

/* One of this user's files in the cache directory (dt_cache_list). */
typedef enum { DT_CACHE_ENTRY, DT_CACHE_LOCK, DT_CACHE_TEMP } dt_cache_kind;
typedef struct {
    const char *name;   /* file name in the directory */
    dt_cache_kind kind; /* a decoded data set, a builder's lock, a build in progress (or dead) */
    uint64_t bytes;
    double idle_s;      /* since it was last opened */
    const char *source; /* entries: the images file it was decoded from; else "" */
    bool busy;          /* a lock or temp file whose builder is alive */
} dt_cache_file;

/* The cache directory into dir[cap] (false when DTRAIN_DATA_CACHE=0 turns the cache off), and
 * fn (may be NULL) called for each of this user's dtrain-data-* files in it. `dtrain cache ls`. */
bool dt_cache_list(char *dir, size_t cap, void (*fn)(void *ctx, const dt_cache_file *f), void *ctx);
/* Removes this user's cache files that no live builder holds: entries (processes that map one
 * keep working), stale locks, dead builders' temp files. *removed and *bytes (may be NULL) get
 * what was removed. `dtrain cache clear`. */
void dt_cache_clear(int *removed, uint64_t *bytes);

typedef enum { DT_CSV_AUTO = 0, DT_CSV_NO, DT_CSV_YES } dt_csv_flag;

/* CSV options; a zeroed struct is the default. */
typedef struct {
    int label_col;      /* column holding the label: 0 = first (default); negative counts from
                         * the end (-1 = last) */
    dt_csv_flag header; /* first line is a header: AUTO = when one of its fields is not a number */
    dt_csv_flag scale;  /* divide features by 255: AUTO = when every feature is an integer in
                         * [0,255] (pixel data) */
    int shape[3];       /* (C,H,W) of a sample, product = number of features; zeros = (1,1,F) */
    int classes;        /* 0 = max label + 1; otherwise every label must be < classes */
} dt_csv_options;

/* Reads a CSV (or gzip'd CSV) file of numeric rows: one label column, the rest features. Features
 * are stored as u8 when every value is an integer in [0,255], else as f32. opt may be NULL.
 * Errors name the file, the line and the column (DT_EFORMAT), or the missing file (DT_ENOENT). */
dt_status dt_dataset_open_csv(dt_dataset **out, const char *path, const dt_csv_options *opt);

/* ---- NumPy .npy arrays -------------------------------------------------------------------- *
 * A features array and a labels array written by np.save (format versions 1.0-3.0; raw, or gzip'd
 * with .gz appended). Features: uint8, int8, int16, int32, float32 or float64, C order,
 * little-endian, shape (n, ...) taken as IDX's: (n) -> (1,1,1), (n,W) -> (1,1,W), (n,H,W) ->
 * (1,H,W), (n,C,H,W), more dims fold into C; uint8 is scaled by 1/255 (pixels), as IDX and
 * dt_dataset_create do. Labels: any little-endian integer dtype, shape (n,) or (n,1), class ids in
 * [0, DT_MAX_CLASSES); classes = max label + 1. Anything else is DT_EFORMAT naming the file and
 * the np.save call that converts it (Fortran order, big-endian, structured or float labels, other
 * dtypes, a shape mismatch, a cut-short or over-long file); DT_ENOENT a missing file. */

/* Opens one data set from a features .npy file and a labels .npy file (same sample count). */
dt_status dt_dataset_open_npy(dt_dataset **out, const char *x_path, const char *y_path);
/* Opens an npy --data spec (dt_dataset_open calls it):
 *  - "npy:X.npy,Y.npy": a train set, no test set (*test NULL);
 *  - "npy:X.npy,Y.npy,XTEST.npy,YTEST.npy": train and test sets;
 *  - "npy:DIR", or a directory holding x_train.npy: DIR/x_train.npy and DIR/y_train.npy, and the
 *    test set DIR/x_test.npy and DIR/y_test.npy when they exist (Keras's load_data names).
 * Train and test share one class count (the larger). On error both outputs are NULL. */
dt_status dt_dataset_open_npy_spec(dt_dataset **train, dt_dataset **test, const char *spec);
/* True when spec starts with "npy:". */
bool dt_data_is_npy(const char *spec);
/* True when path is a directory holding x_train.npy. */
bool dt_data_is_npy_dir(const char *path);

/* Builds a data set from memory (copies x: n samples of C*H*W elements of dtype, and y). Labels
 * must be in [0, classes); classes = 0 means max label + 1. Integer 8-bit data is scaled by 1/255. */
dt_status dt_dataset_create(dt_dataset **out, dt_dtype dtype, const void *x, const int32_t *y, size_t n, int C, int H,
                            int W, int classes);

/* Frees the data set; NULL is a no-op. Loaders built on it must be freed first. */
void dt_dataset_destroy(dt_dataset *ds);

/* Number of samples. */
size_t dt_dataset_len(const dt_dataset *ds);
/* Sample shape (C,H,W); any pointer may be NULL. */
void dt_dataset_shape(const dt_dataset *ds, int *C, int *H, int *W);
/* Number of classes (labels lie in [0, classes)). */
int dt_dataset_classes(const dt_dataset *ds);
/* Most classes a data set may have: a larger label is refused with an error naming its sample. */
#define DT_MAX_CLASSES (1 << 24)
/* Sets the class count; DT_EINVAL naming the first sample whose label is >= classes (and for a
 * set of regression targets). */
dt_status dt_dataset_set_classes(dt_dataset *ds, int classes);
/* Whether the set holds one f32 regression target per sample instead of class labels (an IDX
 * label file of floats): dt_dataset_batch then writes each target's bits into its int32 slot
 * (memcpy them out), for a model whose loss is mse; dt_dataset_classes is 0. */
bool dt_dataset_has_targets(const dt_dataset *ds);
/* The stored dtype of samples (DT_U8 for MNIST images). */
dt_dtype dt_dataset_dtype(const dt_dataset *ds);
/* The file(s) the data set came from, for messages ("" when built from memory). */
const char *dt_dataset_source(const dt_dataset *ds);

/* Sets normalisation: batch values become (scaled - mean) / std. std must be > 0. mean = 0,
 * std = 1 turns it off. Not thread-safe against a running loader: set it before creating one.
 * Text data sets (token ids) accept only mean 0, std 1 (a no-op); anything else is DT_EINVAL
 * naming --normalize. */
dt_status dt_dataset_set_normalize(dt_dataset *ds, float mean, float std);
/* Mean and standard deviation of all scaled sample values (before normalisation), over the
 * whole data set; any output may be NULL. Text data sets give mean 0, std 1 (the identity: token
 * ids are not normalised). */
void dt_dataset_stats(const dt_dataset *ds, double *mean, double *std);
/* Splits a feature data set for --val-split: round(n * fraction) samples drawn by a (seed)-keyed
 * permutation go to *val, the rest to *train (both in the original order, with ds's scale,
 * normalisation and classes; ds is unchanged). The parts are views that read ds's samples (no
 * copy) and keep ds alive: ds may be freed before them (each is freed with dt_dataset_destroy).
 * Threads may split one set at once. The same seed gives the same split.
 * DT_EINVAL for a fraction outside (0, 1) that leaves a side empty, or a text data set. */
dt_status dt_dataset_split(const dt_dataset *ds, double fraction, uint64_t seed, dt_dataset **train, dt_dataset **val);

/* Assembles a batch: x (n,C,H,W) f32 and y (n) int32 for samples indices[0..n). x or y may be
 * NULL to skip it. DT_EINVAL naming the position when an index is >= dt_dataset_len, and on a
 * text data set (use dt_dataset_batch_tokens). Thread-safe (reads only). */
dt_status dt_dataset_batch(const dt_dataset *ds, const uint32_t *indices, int n, float *x, int32_t *y);

/* ---- text data sets (bytes as tokens) ----------------------------------------------------- *
 * A text data set is a file read as raw bytes 0..255 (vocabulary 256). Sample i is the window of
 * T+1 consecutive bytes starting at s = i*T: input bytes [s, s+T), targets bytes [s+1, s+T+1).
 * There are n = (len - 1) / T windows (len: bytes of the set), so inputs do not overlap and every
 * byte but the first is a target exactly once per epoch (the last (len-1) % T bytes are unused).
 * The file is split by bytes: the first len - floor(len * val_fraction) are the train set, the
 * rest the validation set; no window crosses the split. The file is mapped read-only (or, for a
 * pipe or other unmappable file, read once into memory); windows are never copied. Do not
 * truncate a file that a run maps (its readers would fault); replace it (rename) instead.
 * For a text set: dt_dataset_shape = (1,1,T), dt_dataset_classes = 256 (dt_dataset_set_classes
 * may raise it, or lower it down to the largest byte + 1), dt_dataset_len = n windows,
 * dt_dataset_dtype = DT_U8, dt_dataset_source = the file, dt_dataset_cache_file = the generated
 * KJV file when that is what it maps (else ""). Batches are built by dt_dataset_batch_tokens or a
 * loader (which then fills dt_batch.tok and .y with T values per sample). */

/* True when spec names a text data set: "text:FILE", "kjv" or "tokens:DIR". */
bool dt_data_is_text(const char *spec);
/* True when spec names pre-tokenized token files: "tokens:DIR". */
bool dt_data_is_tokens(const char *spec);
/* Opens a text data set. spec is
 *  - "text:FILE": any file, read as bytes;
 *  - "kjv": the King James Bible (~4.4 MB, 73 distinct bytes): $DTRAIN_DATASETS/kjv.txt
 *    (default /usr/share/datasets/kjv.txt) when it exists, else the output of
 *    `bible -f Gen1:1-Rev22:21` (Debian's bible-kjv), generated once into the data cache
 *    directory (see the shared decoded cache above: /dev/shm or $DTRAIN_DATA_CACHE) as
 *    dtrain-kjv-<uid>.txt, written atomically (temp file, fsync, rename), mode 0600, and rebuilt
 *    when /usr/lib/bible.data is newer; with DTRAIN_DATA_CACHE=0 (or when the cache cannot be
 *    written) the text is generated into private memory on each open. No `bible`: DT_ENOENT
 *    saying to install bible-kjv (scripts/install-deps).
 *  - "tokens:DIR": pre-tokenized 16-bit tokens (a GPT-2 BPE corpus, ...), in either layout:
 *    nanoGPT's prepare.py output, DIR/train.bin and DIR/val.bin (raw little-endian uint16, as
 *    np.uint16 .tofile writes), or llm.c's shards, DIR/..._train_....bin and DIR/..._val_....bin (each a
 *    header of 256 little-endian int32: magic 20240520, version 1, token count; then the uint16
 *    tokens), taken in name order as one stream. val.bin / the _val_ shards are *val (when
 *    val_fraction > 0; val_fraction 0 means none); without them the last val_fraction of the
 *    train tokens is held out as for text. DIR may also name one such file. The vocabulary
 *    (dt_dataset_classes) is each set's largest token + 1; dt_dataset_set_classes raises it (a
 *    model's V), or refuses a V below a token, naming it. dt_dataset_dtype is DT_I16 (the stored
 *    width; tokens are read unsigned). A set in one file is mapped; several shards are read
 *    into memory. Errors: DT_ENOENT (no such directory, or none of those files in it),
 *    DT_EFORMAT naming the file (an odd byte count, a shard without its header, another
 *    version, a header whose count does not match the size).
 * T >= 1 is the window (the model's context length). val_fraction in [0, 0.5] (callers default
 * to 0.1) is the share of the file's bytes, at its end, that form *val; 0 sets *val = NULL. val
 * may be NULL (the train set is the same either way). Errors name the file or flag and what to
 * do: DT_ENOENT missing file, DT_EIO unreadable, DT_EINVAL empty file, a set with fewer than 2
 * windows, T < 1, val_fraction outside [0, 0.5] (--val-fraction), a set of more than 2^32-1
 * windows. On error both outputs are NULL. Free both with dt_dataset_destroy, in any order. */
dt_status dt_dataset_open_text(dt_dataset **train, dt_dataset **val, const char *spec, int T, double val_fraction);
/* True for a data set opened by dt_dataset_open_text. */
bool dt_dataset_is_text(const dt_dataset *ds);
/* The window T of a text data set, or 0 for a feature (image/CSV) data set. */
int dt_dataset_window(const dt_dataset *ds);
/* Assembles a text batch for windows indices[0..n): tok (n,T) input bytes and tgt (n,T) the
 * next bytes, as int32. Either output may be NULL to skip it. DT_EINVAL naming the position when
 * an index is >= dt_dataset_len, and on a feature data set (use dt_dataset_batch). Thread-safe
 * (reads only). */
dt_status dt_dataset_batch_tokens(const dt_dataset *ds, const uint32_t *indices, int n, int32_t *tok, int32_t *tgt);

/* ---- sampler ------------------------------------------------------------------------------ *
 * The global order of an epoch is a pure function of (seed, epoch): N workers see exactly the
 * shuffle that 1 worker sees. Sharding: the order is cut into global batches of batch*world
 * samples; rank r takes the r-th contiguous block of `batch` samples of each. The last,
 * incomplete global batch (rem samples) is dropped when drop_last; otherwise it is spread as
 * evenly as possible, rank r getting rem/world (+1 for r < rem%world) contiguous samples, so a
 * rank may get an empty final batch when rem < world. Every rank has the same number of batches
 * and each index appears exactly once per epoch across ranks (without drop_last). */

/* Writes the epoch's global order of 0..n-1 into order: identity when !shuffle, else a uniform
 * Fisher-Yates permutation drawn from dt_rng_u64(seed, dt_rng_key(DT_RNG_SHUFFLE, epoch), ...). */
void dt_sampler_order(uint32_t *order, size_t n, uint64_t seed, uint64_t epoch, bool shuffle);
/* Batches per epoch for every rank (0 when drop_last and n < batch*world). */
size_t dt_sampler_batches(size_t n, int batch, int world, bool drop_last);
/* Rank's batch b is order[*start .. *start + *count). b < dt_sampler_batches(). */
void dt_sampler_batch_range(size_t n, int batch, int rank, int world, size_t b, size_t *start, size_t *count);
/* Rank's part of global batch b under an uneven cut: counts[world] samples per rank of a complete
 * global batch (G = their sum); rank r takes the block after the first sum(counts[0..r)) of each
 * global batch of G. The last incomplete one (rem samples) is cut in the same proportions: rank r
 * starts at floor(sum(counts[0..r)) * rem / G). Every index still appears exactly once. */
void dt_sampler_cut_range(size_t n, const int *counts, int rank, int world, size_t b, size_t *start, size_t *count);
/* Writes rank's whole part of an epoch (its batches in order) into out (room for n) and returns
 * its length. */
size_t dt_sampler_shard(uint32_t *out, const uint32_t *order, size_t n, int batch, int rank, int world, bool drop_last);

/* ---- prefetching loader ------------------------------------------------------------------- */

typedef struct dt_loader dt_loader;

/* Batches a loader prefetches when its config says prefetch -1 (each is one buffer of max_batch). */
#define DT_LOADER_DEFAULT_PREFETCH 3

/* The prefetch for a rank's training loader: 0 (batches built on the rank's own thread) where
 * `ranks` ranks of `threads` threads each take all `cpus` CPUs they may run on together, so that a
 * loader thread would only preempt its rank; else -1 (the default). cpus 0 means unknown: -1. */
int dt_loader_prefetch_for(int ranks, int threads, int cpus);

typedef struct {
    int batch;      /* samples per rank per step (> 0) */
    bool shuffle;   /* shuffle every epoch (by seed, epoch) */
    bool drop_last; /* drop the last incomplete global batch */
    uint64_t seed;
    int rank, world;  /* this rank's part of the global order; world 0 is taken as 1 */
    int prefetch;     /* batches assembled ahead by a background thread; 0 = none (synchronous),
                       * negative = default (3) */
    int max_batch;    /* room per batch for an uneven cut (dt_loader_set_cut); 0 = batch */
    size_t epoch_len; /* samples per epoch: 0 = all n; else the first epoch_len entries of the
                       * (seed, epoch) order of all n samples, so each epoch draws different
                       * samples and N ranks still share 1 rank's global order
                       * (--epoch-windows); at most n */
} dt_loader_config;

typedef struct {
    const float *x;     /* (n, C, H, W) features; NULL for a text data set */
    const int32_t *tok; /* (n, T) input token ids for a text data set; NULL otherwise */
    const int32_t *y;   /* (n, T): labels (T = 1) or next-token targets (text) */
    int n;              /* samples in this batch (may be 0 on some ranks in a final spread batch) */
    int T;              /* values of y per sample: 1 for labels, the window for text */
    size_t index;       /* batch index within the epoch */
    uint64_t epoch;
} dt_batch;

/* Creates a loader over ds (which must outlive it), feature or text. DT_EINVAL for a bad config,
 * epoch_len > n (naming --epoch-windows) or an epoch with no complete batch. The epoch (the
 * order the sampler cuts into batches, dt_loader_batches, dt_loader_take's units) is epoch_len
 * samples when set. Call dt_loader_start_epoch before dt_loader_next. */
dt_status dt_loader_create(dt_loader **out, const dt_dataset *ds, const dt_loader_config *cfg);
/* The bytes of the private copy on huge pages that a shuffling loader of ds reads its samples
 * from (a feature set of 4-256 MiB: the shuffle's random reads are TLB misses on the shared
 * cache's 4 KiB pages), rounded up to 2 MiB huge pages; 0 when a loader of ds makes none (text,
 * smaller or larger sets). The copy is charged to the memory accounting (dt_mem_charge: it counts
 * against --mem-limit); a loader makes none where the charge does not fit a limit already set, when
 * it does not shuffle, or where madvise refuses huge pages. */
size_t dt_loader_copy_bytes(const dt_dataset *ds);
/* The bytes of that copy loader l holds: dt_loader_copy_bytes of its data set, or 0. */
size_t dt_loader_copy_held(const dt_loader *l);
/* Starts (or restarts) an epoch at batch skip_batches, abandoning any epoch in progress: a resumed
 * run gets exactly the batches it would have had. DT_EINVAL if skip_batches > dt_loader_batches. */
dt_status dt_loader_start_epoch(dt_loader *l, uint64_t epoch, size_t skip_batches);
/* Next batch of the epoch: DT_OK and *out, or DT_ENOENT at the end of the epoch. The batch's
 * memory stays valid until the next dt_loader_next / start_epoch / free. */
dt_status dt_loader_next(dt_loader *l, dt_batch *out);
/* Cuts the global batches from the next one not yet taken on among the ranks by counts[world]
 * (sum batch*world, each in [0, max_batch]; see dt_sampler_cut_range); NULL restores the even
 * cut. The order and the batches per epoch do not change, so each sample is still used exactly
 * once per epoch. Every rank must set the same cut before the same batch. Batches already
 * prefetched are rebuilt; the cut stays across epochs. DT_EINVAL for bad counts. */
dt_status dt_loader_set_cut(dt_loader *l, const int *counts);
/* Builds batch `unit` of the epoch's global order cut into batches of `batch` samples for one
 * rank (order[unit*batch, ...), the last one short), synchronously, into *out (valid until the
 * next call / start_epoch / free): for batches handed out at run time (ps dynamic assignment).
 * Stops an epoch in progress. DT_EINVAL when unit >= ceil(n / batch), n the epoch length. */
dt_status dt_loader_take(dt_loader *l, uint64_t epoch, size_t unit, dt_batch *out);
/* Batches per epoch (the same on every rank), of epoch_len samples when set. */
size_t dt_loader_batches(const dt_loader *l);
/* Total seconds dt_loader_next spent blocked waiting for a batch (with prefetch 0: building it),
 * since creation. */
double dt_loader_wait_seconds(const dt_loader *l);
/* Stops the background thread and frees the loader; NULL is a no-op. */
void dt_loader_destroy(dt_loader *l);

#ifdef __cplusplus
}
#endif
#endif
