/* Reading and writing .safetensors files: a strict header parser that turns any
 * malformed file into a status and a message naming the file, fp16/bf16
 * conversion, and an atomic writer that never damages an existing file. */
#ifndef CK_SAFETENSORS_H
#define CK_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define CK_ST_MAX_DIMS 8
/* Larger headers are refused, as the reference implementation does. */
#define CK_ST_MAX_HEADER 100000000

typedef enum ck_st_dtype {
    CK_ST_F64 = 0, CK_ST_F32, CK_ST_F16, CK_ST_BF16,
    CK_ST_I64, CK_ST_I32, CK_ST_I16, CK_ST_I8, CK_ST_U8, CK_ST_BOOL,
    CK_ST_F8_E4M3, CK_ST_F8_E5M2, /* read only */
    CK_ST_DTYPE_COUNT
} ck_st_dtype;

const char *ck_st_dtype_name(ck_st_dtype d); /* "F32", ...; "?" if out of range */
size_t ck_st_dtype_size(ck_st_dtype d);      /* bytes per element; 0 if out of range */

/* Tensors are owned by their file and live until ck_st_close. */
typedef struct ck_st_tensor {
    const char *name;
    const char *file;  /* path the file was opened with, for messages */
    ck_st_dtype dtype;
    int ndim;          /* 0 for a scalar */
    int64_t shape[CK_ST_MAX_DIMS];
    int64_t numel;     /* product of shape; 1 for a scalar, 0 if any dim is 0 */
    int64_t nbytes;
    const void *data;  /* raw little-endian bytes; not necessarily aligned */
} ck_st_tensor;

typedef struct ck_st_file ck_st_file;

/* Reads the whole file and validates it; NULL with a message on any problem. */
ck_st_file *ck_st_open(const char *path, char *err, size_t errlen);
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

/* Converts an F32, F16 or BF16 tensor to fp32; n must equal t->numel. */
int ck_st_read_f32(const ck_st_tensor *t, float *dst, int64_t n, char *err, size_t errlen);

/* Scalar conversions: f32 -> f16 and f32 -> bf16 round to nearest even,
 * overflow to inf and keep NaN a NaN; the widening ones are exact. */
uint16_t ck_st_f32_to_f16(float x);
float ck_st_f16_to_f32(uint16_t h);
uint16_t ck_st_f32_to_bf16(float x);
float ck_st_bf16_to_f32(uint16_t h);

/* The writer copies (and converts) data at add time, so callers may free
 * their buffers at once. A bad add or meta call returns -1 and is also kept:
 * the next save fails with its message, so an unchecked mistake cannot
 * produce a file missing a tensor. Duplicate names fail at save. */
typedef struct ck_st_writer ck_st_writer;

ck_st_writer *ck_st_writer_new(void);
int ck_st_writer_meta(ck_st_writer *w, const char *key, const char *value);
int ck_st_writer_add(ck_st_writer *w, const char *name, ck_st_dtype dtype, int ndim,
                     const int64_t *shape, const float *data);
/* Writes path.tmp.<pid> beside path, fsyncs it and renames it over path;
 * on failure path is untouched and the temp file is removed. */
int ck_st_writer_save(ck_st_writer *w, const char *path, char *err, size_t errlen);
void ck_st_writer_free(ck_st_writer *w);

#endif
