/* Log sinks: records (a step, the time they were captured, nested named
 * values) written as JSONL lines and TensorBoard event files, either by the
 * caller (sync) or by a writer thread behind a bounded queue (async). Knows
 * nothing of Lua; the library prints nothing: errors come back as text. */
#ifndef CK_LOGSINK_H
#define CK_LOGSINK_H

#include <stddef.h>
#include <stdint.h>

/* A record under construction: a flat encoding of a tree of named values
 * (objects, arrays, numbers, strings, booleans, images) that the writer turns
 * into one JSON line and one TensorBoard event. The record owns copies of
 * everything put in it (an image's PNG bytes too). */
typedef struct ck_log_rec {
    double time;   /* capture time, seconds since the epoch */
    int64_t step;  /* -1: none */
    unsigned char *buf;
    size_t len, cap;
    int failed;    /* out of memory while building */
} ck_log_rec;

void ck_log_rec_init(ck_log_rec *r, int64_t step, double time);
void ck_log_rec_free(ck_log_rec *r);
/* Values under the current object (key NULL inside an array). */
void ck_log_rec_num(ck_log_rec *r, const char *key, size_t klen, double v);
void ck_log_rec_int(ck_log_rec *r, const char *key, size_t klen, int64_t v);
void ck_log_rec_str(ck_log_rec *r, const char *key, size_t klen, const char *s, size_t slen);
void ck_log_rec_bool(ck_log_rec *r, const char *key, size_t klen, int v);
/* An image: w x h pixels encoded as the len PNG bytes at png (copied). The
 * JSON line shows {"width": w, "height": h, "png_bytes": len}; the event holds
 * a Summary.Image with the bytes. len past 4 GiB marks the record failed. */
void ck_log_rec_image(ck_log_rec *r, const char *key, size_t klen, int w, int h, const void *png, size_t len);
void ck_log_rec_open(ck_log_rec *r, const char *key, size_t klen, int array);
void ck_log_rec_close(ck_log_rec *r);

/* One JSON line for r (with its newline) appended to *out (malloc'd, grown). */
int ck_log_rec_json(const ck_log_rec *r, char **out, size_t *len, size_t *cap);

typedef struct ck_log_opts {
    const char *dir;        /* where the files go (must exist); named in messages */
    int confined;           /* 1: the files go into dir_fd (a directory the caller opened, O_PATH will do),
                             * each opened beneath it: a symlink there that leads out is refused */
    int dir_fd;
    int jsonl;              /* write DIR/<jsonl_name> (appended to when it exists) */
    const char *jsonl_name; /* default "metrics.jsonl" */
    int tensorboard;        /* write DIR/events.out.tfevents.<time>.<host>.<pid>.<n>, a new file per writer */
    int async;              /* a writer thread behind a bounded queue */
    double flush_interval;  /* async: seconds between the writer's rounds (default 1) */
    int queue;              /* async: records the queue holds (default 1024); a full queue blocks the caller */
    int fsync;              /* sync: fsync after every record (survives power loss, costs a disk flush) */
} ck_log_opts;

typedef struct ck_logger ck_logger;

/* NULL with err on failure. */
ck_logger *ck_log_open(const ck_log_opts *o, char *err, size_t errlen);
/* Takes r (its buffer now belongs to the logger; r is left empty). Sync: written
 * before it returns. Async: queued; waits while the queue is full. 0, or -1 with
 * err (a failed write, here or earlier in the writer). */
int ck_log_submit(ck_logger *lg, ck_log_rec *r, char *err, size_t errlen);
/* Everything submitted so far is written to the files (and, with sync, to disk). */
int ck_log_flush(ck_logger *lg, int sync, char *err, size_t errlen);
/* Flushes, fsyncs, stops the writer, closes the files, frees lg. 0 or -1 with err. */
int ck_log_close(ck_logger *lg, char *err, size_t errlen);
const char *ck_log_jsonl_path(const ck_logger *lg);
const char *ck_log_events_path(const ck_logger *lg);
/* records submitted, and written to the files */
void ck_log_counts(ck_logger *lg, uint64_t *submitted, uint64_t *written);

/* vm/formats/logtb.c: TensorBoard's file format. CRC-32C (Castagnoli) and TFRecord's
 * masked form of it. */
uint32_t ck_tb_crc32c(const void *data, size_t n);
uint32_t ck_tb_crc32c_masked(const void *data, size_t n);
/* One TFRecord holding an Event: wall_time, step, and either file_version
 * (when given) or a Summary with a simple_value per number in r and an image
 * (Summary.Image: height, width, colorspace from the PNG's header, the PNG
 * bytes) per image, in the record's order (tags are the names joined by '/').
 * Appended to *out; 0 records nothing (no numbers, no images). */
int ck_tb_event(const ck_log_rec *r, const char *file_version, unsigned char **out, size_t *len, size_t *cap);

/* An event read back: tags and values point into the reader's buffer. */
typedef struct ck_tb_value {
    const char *tag;
    size_t tag_len;
    float value;
} ck_tb_value;

/* A Summary.Value that holds an image: its sizes, colorspace (0 when absent)
 * and encoded bytes */
typedef struct ck_tb_image {
    const char *tag;
    size_t tag_len;
    int64_t width, height, colorspace;
    const unsigned char *png;
    size_t png_len;
} ck_tb_image;

typedef struct ck_tb_read_event {
    double wall_time;
    int64_t step;
    const char *file_version; /* NULL unless present */
    size_t file_version_len;
    ck_tb_value *values; /* the Summary's values that hold no image */
    int nvalues;
    ck_tb_image *images;
    int nimages;
} ck_tb_read_event;

/* Reads the whole records of an event file: fn is called per event. A record
 * whose CRC does not match, or an Event that does not parse, is an error
 * (-1, err); a cut tail (a partial last record) is not: *tail gets its bytes. */
int ck_tb_read(const unsigned char *data, size_t n, int (*fn)(void *ud, const ck_tb_read_event *e), void *ud,
               size_t *tail, char *err, size_t errlen);

#endif
