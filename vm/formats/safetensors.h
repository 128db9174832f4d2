/* Reading and writing .safetensors files: a strict header parser that turns any
 * malformed file into a status and a message naming the file, fp16/bf16
 * conversion, and an atomic writer that never damages an existing file.
 * Neither side holds a file's data in memory: tensors are read from the file
 * when asked for and written from their source when saved, through a bounded
 * buffer, so loading or saving a 5 GB UNet costs CK_ST_IO_BUFFER on top of
 * the tensors' own memory. */
#ifndef CK_SAFETENSORS_H
#define CK_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define CK_ST_MAX_DIMS 8
/* Larger headers are refused, as the reference implementation does. */
#define CK_ST_MAX_HEADER 100000000
/* The most a file holds for reading its tensors (allocated on the first
 * read, no larger than its largest tensor) and a save holds for writing
 * them: data moves in chunks of this many bytes. */
#define CK_ST_IO_BUFFER (8u << 20)

typedef enum ck_st_dtype {
    CK_ST_F64 = 0, CK_ST_F32, CK_ST_F16, CK_ST_BF16,
    CK_ST_I64, CK_ST_I32, CK_ST_I16, CK_ST_I8, CK_ST_U8, CK_ST_BOOL,
    CK_ST_F8_E4M3, CK_ST_F8_E5M2, /* read only */
    CK_ST_DTYPE_COUNT
} ck_st_dtype;

const char *ck_st_dtype_name(ck_st_dtype d); /* "F32", ...; "?" if out of range */
size_t ck_st_dtype_size(ck_st_dtype d);      /* bytes per element; 0 if out of range */

typedef struct ck_st_file ck_st_file;

/* Tensors are owned by their file and live until ck_st_close. Their data
 * stays in the file until read. */
typedef struct ck_st_tensor {
    const char *name;
    const char *file;  /* path the file was opened with, for messages */
    ck_st_dtype dtype;
    int ndim;          /* 0 for a scalar */
    int64_t shape[CK_ST_MAX_DIMS];
    int64_t numel;     /* product of shape; 1 for a scalar, 0 if any dim is 0 */
    int64_t nbytes;
    int64_t offset;    /* of its first byte from the start of the file */
    ck_st_file *src;   /* the file its data is read from */
} ck_st_tensor;

/* Reads the 8-byte length and the header and validates them against the
 * file's size; the file stays open (one descriptor, close-on-exec) until
 * ck_st_close, and its tensors are read from it on demand: a file replaced
 * by rename meanwhile (as a save replaces it) still reads as it was opened.
 * NULL with a message on any problem; when open() itself failed, errno is
 * its errno (EMFILE: closing other files would help). */
ck_st_file *ck_st_open(const char *path, char *err, size_t errlen);
/* What a file's memory is charged to before it is allocated: the header's
 * bytes (twice while it is parsed, once while the file is open), the tables
 * of its tensors as they grow, and its read buffer on the first read. take
 * returns 0, or -1 with a message in err (the open or the read then fails
 * with it, after the path); give returns what take charged.
 * poll (may be NULL) is asked while the header is read and parsed: per
 * megabyte read, per 4096 entries parsed and between the sorts, with the work
 * done since its last call (about 1 unit per 16 bytes or per entry); nonzero
 * stops the open, which fails with "stopped" and gives everything back. It
 * must not longjmp. */
typedef struct ck_st_charge {
    int (*take)(void *ud, size_t n, const char *what, char *err, size_t errlen);
    void (*give)(void *ud, size_t n);
    void *ud;
    int (*poll)(void *poll_ud, long long work);
    void *poll_ud;
} ck_st_charge;
/* The same from fd, opened for reading by the caller (the sandbox's door),
 * which the file now owns (closed on failure too); path names it in
 * messages. fd -1 reports the open's failure from errno, as ck_st_open does.
 * Its memory is charged to *c (copied; NULL: to nothing). */
ck_st_file *ck_st_open_fd(int fd, const char *path, const ck_st_charge *c, char *err, size_t errlen);
/* The same from len bytes in memory, which are copied; name stands for the
 * path in messages (NULL: "(memory)"). */
ck_st_file *ck_st_open_memory(const void *buf, size_t len, const char *name, char *err, size_t errlen);
void ck_st_close(ck_st_file *f);

/* Tensors in the order of their data in the file. */
int ck_st_count(const ck_st_file *f);
const ck_st_tensor *ck_st_get(const ck_st_file *f, int i);   /* NULL if i is out of range */
const ck_st_tensor *ck_st_find(const ck_st_file *f, const char *name); /* NULL if absent */

/* __metadata__, sorted by key. */
const char *ck_st_meta(const ck_st_file *f, const char *key); /* NULL if absent */
int ck_st_meta_count(const ck_st_file *f);
int ck_st_meta_at(const ck_st_file *f, int i, const char **key, const char **value); /* -1 if out of range */

/* Reads tensor t as fp32 into dst (F32, F16, BF16, F8_E4M3, F8_E5M2 and U8
 * convert); n must equal t->numel. Data moves through the file's buffer of
 * at most CK_ST_IO_BUFFER bytes, so one file is read from one thread at a
 * time. A file that shrank since it was opened is an error naming it. */
int ck_st_read_f32(const ck_st_tensor *t, float *dst, int64_t n, char *err, size_t errlen);
/* Bytes [at, at + n) of t's data as stored (any dtype), straight into dst. */
int ck_st_read_bytes(const ck_st_tensor *t, int64_t at, void *dst, int64_t n, char *err, size_t errlen);

/* Scalar conversions: f32 -> f16 and f32 -> bf16 round to nearest even,
 * overflow to inf and keep NaN a NaN; the widening ones are exact. */
uint16_t ck_st_f32_to_f16(float x);
float ck_st_f16_to_f32(uint16_t h);
uint16_t ck_st_f32_to_bf16(float x);
float ck_st_bf16_to_f32(uint16_t h);

/* The writer takes each tensor's name, dtype and shape when it is added and
 * its values when the file is saved: the header goes first, then each
 * tensor, converted (to F32, F16, BF16 or U8) chunk by chunk into a buffer
 * of at most CK_ST_IO_BUFFER bytes and written. A bad add or meta call
 * returns -1 and is also kept: the next save fails with its message, so an
 * unchecked mistake cannot produce a file missing a tensor. Duplicate names
 * fail at save. */
typedef struct ck_st_writer ck_st_writer;

/* The fp32 values of one tensor (numel of them), asked for once at save
 * time, in the order of the file (by name), and not at all for a tensor with
 * no elements; the pointer need only stay valid until the source is asked
 * again. NULL with a message in err fails the save. */
typedef const float *(*ck_st_source)(void *ud, int index, char *err, size_t errlen);

ck_st_writer *ck_st_writer_new(void);
int ck_st_writer_meta(ck_st_writer *w, const char *key, const char *value);
/* A tensor whose values the save reads from get(ud, index). */
int ck_st_writer_add_source(ck_st_writer *w, const char *name, ck_st_dtype dtype, int ndim,
                            const int64_t *shape, ck_st_source get, void *ud, int index);
/* A tensor whose values are copied now, so callers may free data at once:
 * for small tensors (scalars, values built from Lua tables). */
int ck_st_writer_add(ck_st_writer *w, const char *name, ck_st_dtype dtype, int ndim,
                     const int64_t *shape, const float *data);
/* Writes path.tmp.<pid> beside path, fsyncs it and renames it over path;
 * on failure (a source's included) path is untouched and the temp file is
 * removed. */
int ck_st_writer_save(ck_st_writer *w, const char *path, char *err, size_t errlen);
/* The same into the directory dirfd (O_PATH will do) as name, with path
 * naming the file in messages: the temp file is name.tmp.<pid> there,
 * created with O_EXCL and renamed over name by renameat, so nothing is
 * looked up by path again. Before it, temp files of name left by saves that
 * were killed (their process is gone) or by this process are removed; no
 * other entry is touched. dirfd -1: its open failed (errno says why). */
int ck_st_writer_save_at(ck_st_writer *w, int dirfd, const char *name, const char *path, char *err, size_t errlen);
void ck_st_writer_free(ck_st_writer *w);

#endif
