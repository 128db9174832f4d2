/* Records and the writers that put them in files: one JSON line and one
 * TensorBoard event per record, each written whole with one write(2), so a
 * process killed at any moment leaves whole lines and whole records behind.
 * A write that fails (a full disk, the file size limit) is cut back to the
 * last whole record. Async loggers hand records to a writer thread through a
 * bounded queue; the thread writes what is queued at least once per flush
 * interval. */
#define _GNU_SOURCE /* O_PATH */
#include "formats/logsink.h"

#include "formats/json.h"
#include "util/beneath.h"
#include "util/memory.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- records */

void ck_log_rec_init(ck_log_rec *r, int64_t step, double time)
{
    memset(r, 0, sizeof *r);
    r->step = step;
    r->time = time;
}

void ck_log_rec_free(ck_log_rec *r)
{
    free(r->buf);
    memset(r, 0, sizeof *r);
}

static void rec_put(ck_log_rec *r, const void *x, size_t n)
{
    if (r->failed) return;
    if (ck_grow(&r->buf, &r->cap, r->len + n, 1, 512)) {
        r->failed = 1;
        return;
    }
    memcpy(r->buf + r->len, x, n);
    r->len += n;
}

static void rec_head(ck_log_rec *r, char type, const char *key, size_t klen)
{
    uint32_t kl = key ? (uint32_t)klen : 0;
    rec_put(r, &type, 1);
    rec_put(r, &kl, 4);
    if (kl) rec_put(r, key, kl);
}

void ck_log_rec_num(ck_log_rec *r, const char *key, size_t klen, double v)
{
    rec_head(r, 'n', key, klen);
    rec_put(r, &v, 8);
}

void ck_log_rec_int(ck_log_rec *r, const char *key, size_t klen, int64_t v)
{
    rec_head(r, 'i', key, klen);
    rec_put(r, &v, 8);
}

void ck_log_rec_str(ck_log_rec *r, const char *key, size_t klen, const char *s, size_t slen)
{
    uint32_t n = (uint32_t)slen;
    rec_head(r, 's', key, klen);
    rec_put(r, &n, 4);
    rec_put(r, s, slen);
}

void ck_log_rec_bool(ck_log_rec *r, const char *key, size_t klen, int v)
{
    unsigned char b = v != 0;
    rec_head(r, 'b', key, klen);
    rec_put(r, &b, 1);
}

void ck_log_rec_image(ck_log_rec *r, const char *key, size_t klen, int w, int h, const void *png, size_t len)
{
    if (len > UINT32_MAX) {
        r->failed = 1;
        return;
    }
    uint32_t head[3] = {(uint32_t)w, (uint32_t)h, (uint32_t)len};
    rec_head(r, 'g', key, klen);
    rec_put(r, head, sizeof head);
    rec_put(r, png, len);
}

void ck_log_rec_open(ck_log_rec *r, const char *key, size_t klen, int array) { rec_head(r, array ? 'a' : 'o', key, klen); }

void ck_log_rec_close(ck_log_rec *r)
{
    char c = 'c';
    rec_put(r, &c, 1);
}

/* ---- JSON */

static uint32_t rd32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* A number as the line holds it: NaN and infinities as strings (JSON has
 * none), whole values as integers, others in at most 15 significant digits
 * (CK_LOG_DIGITS, the line's jansson precision: %g drops the zeros past a
 * value's own). A float (what tensors hold) becomes the double nearest its
 * 7-digit text, or 9-digit where 7 do not read back as that float, so it is
 * written that short and reads back as itself; a double reads back within
 * 1e-15 of itself (timings and means: no 17-digit noise on every line). */
#define CK_LOG_DIGITS 15
static json_t *number(double v)
{
    if (isnan(v)) return json_string("NaN");
    if (isinf(v)) return json_string(v > 0 ? "Infinity" : "-Infinity");
    if (v == floor(v) && fabs(v) < 1e15) return json_integer((json_int_t)v);
    if ((double)(float)v == v) {
        char t[32];
        snprintf(t, sizeof t, "%.7g", v);
        if (strtof(t, NULL) != (float)v) snprintf(t, sizeof t, "%.9g", v);
        v = strtod(t, NULL);
    }
    return json_real(v);
}

/* the record's values as a tree: an object for the top level */
static json_t *rec_tree(const ck_log_rec *r)
{
    json_t *stack[64];
    int depth = 0;
    json_t *root = json_object();
    if (!root) return NULL;
    stack[0] = root;
    for (size_t i = 0; i < r->len;) {
        unsigned char type = r->buf[i++];
        if (type == 'c') {
            if (depth > 0) depth--;
            continue;
        }
        uint32_t kl = rd32(r->buf + i);
        const char *key = (const char *)r->buf + i + 4;
        i += 4 + kl;
        json_t *v = NULL;
        switch (type) {
        case 'o': v = json_object(); break;
        case 'a': v = json_array(); break;
        case 'n': {
            double d;
            memcpy(&d, r->buf + i, 8);
            i += 8;
            v = number(d);
            break;
        }
        case 'i': {
            int64_t n;
            memcpy(&n, r->buf + i, 8);
            i += 8;
            v = json_integer((json_int_t)n);
            break;
        }
        case 's': {
            uint32_t n = rd32(r->buf + i);
            v = ck_json_text((const char *)r->buf + i + 4, n);
            i += 4 + n;
            break;
        }
        case 'b':
            v = json_boolean(r->buf[i]);
            i += 1;
            break;
        case 'g': /* an image: its sizes, not its bytes */
            v = json_object();
            if (v && (json_object_set_new(v, "width", json_integer(rd32(r->buf + i))) ||
                      json_object_set_new(v, "height", json_integer(rd32(r->buf + i + 4))) ||
                      json_object_set_new(v, "png_bytes", json_integer(rd32(r->buf + i + 8))))) {
                json_decref(v);
                v = NULL;
            }
            i += 12 + rd32(r->buf + i + 8);
            break;
        default: break;
        }
        json_t *parent = stack[depth];
        int rc = !v ? -1 : json_is_array(parent) ? json_array_append(parent, v) : ck_json_set(parent, key, kl, json_incref(v));
        if (rc || ((type == 'o' || type == 'a') && depth + 1 >= 64)) {
            json_decref(v);
            json_decref(root);
            return NULL;
        }
        if (type == 'o' || type == 'a') stack[++depth] = v;
        json_decref(v);
    }
    return root;
}

int ck_log_rec_json(const ck_log_rec *r, char **out, size_t *len, size_t *cap)
{
    json_t *fields = rec_tree(r);
    if (!fields) return -1;
    /* step and the capture time head the line; the time keeps its microseconds
     * (%.6f), which no one jansson precision writes for every time. The
     * fields' object follows, its opening brace turned into the comma after
     * the time. */
    char head[80];
    int hl = r->step >= 0 ? snprintf(head, sizeof head, "{\"step\":%lld,\"time\":%.6f", (long long)r->step, r->time)
                          : snprintf(head, sizeof head, "{\"time\":%.6f", r->time);
    size_t at = *len + (size_t)hl;
    int rc = ck_json_put(head, (size_t)hl, out, len, cap) || ck_json_append(fields, JSON_COMPACT | JSON_REAL_PRECISION(CK_LOG_DIGITS), out, len, cap);
    json_decref(fields);
    if (rc) return -1;
    if ((*out)[at + 1] == '}') { /* no fields: "{}" closes the head */
        (*out)[at] = '}';
        *len = at + 1;
    } else {
        (*out)[at] = ',';
    }
    return ck_json_put("\n", 1, out, len, cap);
}

/* ---- the logger */

struct ck_logger {
    int fd_jsonl, fd_tb;
    int dir_fd; /* while ck_log_open runs: the directory it opened itself */
    char *path_jsonl, *path_tb;
    int async, fsync_each;
    double interval;
    /* the writer's buffers (the caller's in sync mode) */
    char *json;
    size_t json_len, json_cap;
    unsigned char *ev;
    size_t ev_len, ev_cap;
    /* async: the queue */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t wake, space, done;
    ck_log_rec *q;
    int cap, head, count, stop, flush_req;
    uint64_t submitted, written;
    int failed;
    char err[256];
};

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* all n bytes with as few write(2) calls as the kernel allows */
static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t k = write(fd, c, n);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        c += k;
        n -= (size_t)k;
    }
    return 0;
}

/* One record appended whole to fd, or nothing: a record that would pass the
 * process's file size limit is not begun (past it the kernel would cut the
 * write and raise SIGXFSZ, which kills by default), and one that fails partway
 * (ENOSPC, EIO) is truncated back to the file's length before it. On failure
 * writes "cannot write 'path': reason ..." to lg->err and returns -1. */
static int append_whole(ck_logger *lg, int fd, const char *path, const void *p, size_t n)
{
    struct stat st;
    if (fstat(fd, &st)) {
        snprintf(lg->err, sizeof lg->err, "cannot write '%s': %s", path, strerror(errno));
        return -1;
    }
    off_t before = st.st_size;
    struct rlimit fsz;
    if (S_ISREG(st.st_mode) && getrlimit(RLIMIT_FSIZE, &fsz) == 0 && fsz.rlim_cur != RLIM_INFINITY &&
        (unsigned long long)before + n > (unsigned long long)fsz.rlim_cur) {
        snprintf(lg->err, sizeof lg->err, "cannot write '%s': %s (the file size limit); the file ends with the last whole record",
                 path, strerror(EFBIG));
        return -1;
    }
    if (write_all(fd, p, n) == 0) return 0;
    int e = errno;
    /* a device or pipe has no length to go back to; a regular file does */
    int cut = S_ISREG(st.st_mode) && ftruncate(fd, before) == 0;
    snprintf(lg->err, sizeof lg->err, "cannot write '%s': %s%s", path, strerror(e),
             cut ? "; the file ends with the last whole record" : "");
    return -1;
}

/* writes one record to every file; sets lg->err on failure */
static int write_rec(ck_logger *lg, const ck_log_rec *r)
{
    if (r->failed) {
        snprintf(lg->err, sizeof lg->err, "out of memory while building a log record");
        return -1;
    }
    if (lg->fd_jsonl >= 0) {
        lg->json_len = 0;
        if (ck_log_rec_json(r, &lg->json, &lg->json_len, &lg->json_cap)) {
            snprintf(lg->err, sizeof lg->err, "out of memory while formatting a log record");
            return -1;
        }
        if (append_whole(lg, lg->fd_jsonl, lg->path_jsonl, lg->json, lg->json_len)) return -1;
        if (lg->fsync_each && fdatasync(lg->fd_jsonl)) {
            snprintf(lg->err, sizeof lg->err, "cannot sync '%s': %s", lg->path_jsonl, strerror(errno));
            return -1;
        }
    }
    if (lg->fd_tb >= 0) {
        lg->ev_len = 0;
        int k = ck_tb_event(r, NULL, &lg->ev, &lg->ev_len, &lg->ev_cap);
        if (k < 0) {
            snprintf(lg->err, sizeof lg->err, "out of memory while encoding an event");
            return -1;
        }
        if (k > 0 && append_whole(lg, lg->fd_tb, lg->path_tb, lg->ev, lg->ev_len)) return -1;
        if (k > 0 && lg->fsync_each && fdatasync(lg->fd_tb)) {
            snprintf(lg->err, sizeof lg->err, "cannot sync '%s': %s", lg->path_tb, strerror(errno));
            return -1;
        }
    }
    return 0;
}

static void add_seconds(struct timespec *ts, double s)
{
    clock_gettime(CLOCK_REALTIME, ts);
    double whole = floor(s);
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec += (long)((s - whole) * 1e9);
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* The writer: sleeps a flush interval (or until the queue is half full, a
 * flush is asked for, or the logger closes), then writes everything queued. */
static void *writer_main(void *ud)
{
    ck_logger *lg = ud;
    ck_log_rec *batch = malloc(sizeof *batch * (size_t)lg->cap);
    pthread_mutex_lock(&lg->mu);
    for (;;) {
        struct timespec deadline;
        add_seconds(&deadline, lg->interval);
        while (!lg->stop && !lg->flush_req && lg->count < (lg->cap + 1) / 2) {
            if (pthread_cond_timedwait(&lg->wake, &lg->mu, &deadline) == ETIMEDOUT) break;
        }
        int n = 0;
        while (lg->count > 0 && batch) {
            batch[n++] = lg->q[lg->head];
            lg->head = (lg->head + 1) % lg->cap;
            lg->count--;
        }
        pthread_cond_broadcast(&lg->space);
        int stop = lg->stop && lg->count == 0, failed = lg->failed;
        pthread_mutex_unlock(&lg->mu);
        for (int i = 0; i < n; i++) {
            if (!failed && write_rec(lg, &batch[i])) failed = 1;
            ck_log_rec_free(&batch[i]);
        }
        pthread_mutex_lock(&lg->mu);
        if (!batch && !lg->failed) {
            snprintf(lg->err, sizeof lg->err, "out of memory in the log writer");
            failed = 1;
        }
        if (failed) lg->failed = 1;
        lg->written += (uint64_t)n;
        pthread_cond_broadcast(&lg->done);
        if (stop || (!batch && lg->stop)) break;
    }
    pthread_mutex_unlock(&lg->mu);
    free(batch);
    return NULL;
}

static char *dup_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s/%s", dir, name);
    return s;
}

static void free_logger(ck_logger *lg)
{
    if (lg->fd_jsonl >= 0) close(lg->fd_jsonl);
    if (lg->fd_tb >= 0) close(lg->fd_tb);
    if (lg->dir_fd >= 0) close(lg->dir_fd);
    free(lg->path_jsonl);
    free(lg->path_tb);
    free(lg->json);
    free(lg->ev);
    free(lg->q);
    free(lg);
}

/* name in the log directory: beneath it when confined (no symlink leads
 * out), else as openat finds it. -1 with errno. */
static int open_in_dir(const ck_log_opts *o, int dfd, const char *name, int flags)
{
    if (o->confined) return ck_open_beneath(dfd, name, flags, 0666);
    return openat(dfd, name, flags | O_CLOEXEC, 0666);
}

static void open_failed(char *err, size_t errlen, const char *verb, const char *path)
{
    if (errno == EXDEV || errno == ELOOP)
        snprintf(err, errlen, "cannot %s '%s': refused, it is a symlink that may lead out of the log directory", verb,
                 path);
    else snprintf(err, errlen, "cannot %s '%s': %s", verb, path, strerror(errno));
}

ck_logger *ck_log_open(const ck_log_opts *o, char *err, size_t errlen)
{
    static int counter;
    ck_logger *lg = calloc(1, sizeof *lg);
    if (!lg) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    lg->fd_jsonl = lg->fd_tb = lg->dir_fd = -1;
    lg->async = o->async;
    lg->fsync_each = o->fsync && !o->async;
    lg->interval = o->flush_interval > 0 ? o->flush_interval : 1.0;
    const char *dir = o->dir && *o->dir ? o->dir : ".";
    /* every file is opened in the directory's descriptor, never by a path
     * looked up again */
    int dfd = o->confined ? o->dir_fd : open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        snprintf(err, errlen, "cannot open the log directory '%s': %s", dir, strerror(errno));
        free_logger(lg);
        return NULL;
    }
    lg->dir_fd = o->confined ? -1 : dfd; /* closed with the logger when it is ours */
    if (o->jsonl) {
        const char *jname = o->jsonl_name && *o->jsonl_name ? o->jsonl_name : "metrics.jsonl";
        lg->path_jsonl = dup_path(dir, jname);
        if (!lg->path_jsonl) goto oom;
        lg->fd_jsonl = open_in_dir(o, dfd, jname, O_WRONLY | O_CREAT | O_APPEND);
        if (lg->fd_jsonl < 0) {
            open_failed(err, errlen, "open", lg->path_jsonl);
            free_logger(lg);
            return NULL;
        }
    }
    if (o->tensorboard) {
        /* TensorBoard's own naming; the counter and O_EXCL keep writers apart */
        char host[256] = "localhost", name[512];
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = 0;
        double now = wall_now();
        for (int tries = 0; lg->fd_tb < 0; tries++) {
            int n = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
            snprintf(name, sizeof name, "events.out.tfevents.%lld.%s.%d.%d", (long long)now, host, (int)getpid(), n);
            free(lg->path_tb);
            lg->path_tb = dup_path(dir, name);
            if (!lg->path_tb) goto oom;
            lg->fd_tb = open_in_dir(o, dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_APPEND);
            if (lg->fd_tb < 0 && (errno != EEXIST || tries > 1000)) {
                open_failed(err, errlen, "create", lg->path_tb);
                free_logger(lg);
                return NULL;
            }
        }
        ck_log_rec first;
        ck_log_rec_init(&first, 0, now);
        int k = ck_tb_event(&first, "brain.Event:2", &lg->ev, &lg->ev_len, &lg->ev_cap);
        if (k < 0) goto oom;
        if (write_all(lg->fd_tb, lg->ev, lg->ev_len)) {
            snprintf(err, errlen, "cannot write '%s': %s", lg->path_tb, strerror(errno));
            free_logger(lg);
            return NULL;
        }
    }
    if (lg->async) {
        lg->cap = o->queue > 0 ? o->queue : 1024;
        lg->q = calloc((size_t)lg->cap, sizeof *lg->q);
        if (!lg->q) goto oom;
        pthread_mutex_init(&lg->mu, NULL);
        pthread_cond_init(&lg->wake, NULL);
        pthread_cond_init(&lg->space, NULL);
        pthread_cond_init(&lg->done, NULL);
        if (pthread_create(&lg->thread, NULL, writer_main, lg)) {
            snprintf(err, errlen, "cannot start the log writer thread");
            free_logger(lg);
            return NULL;
        }
        lg->started = 1;
    }
    if (lg->dir_fd >= 0) close(lg->dir_fd);
    lg->dir_fd = -1;
    return lg;
oom:
    snprintf(err, errlen, "out of memory");
    free_logger(lg);
    return NULL;
}

int ck_log_submit(ck_logger *lg, ck_log_rec *r, char *err, size_t errlen)
{
    if (!lg->async) {
        int rc = lg->failed ? -1 : write_rec(lg, r);
        ck_log_rec_free(r);
        if (rc) lg->failed = 1;
        lg->submitted++;
        if (!rc) lg->written++;
        if (rc) snprintf(err, errlen, "%s", lg->err);
        return rc;
    }
    pthread_mutex_lock(&lg->mu);
    while (lg->count == lg->cap && !lg->failed) {
        pthread_cond_signal(&lg->wake);
        pthread_cond_wait(&lg->space, &lg->mu);
    }
    if (lg->failed) {
        snprintf(err, errlen, "%s", lg->err);
        pthread_mutex_unlock(&lg->mu);
        ck_log_rec_free(r);
        return -1;
    }
    lg->q[(lg->head + lg->count) % lg->cap] = *r;
    memset(r, 0, sizeof *r);
    lg->count++;
    lg->submitted++;
    if (lg->count >= (lg->cap + 1) / 2) pthread_cond_signal(&lg->wake);
    pthread_mutex_unlock(&lg->mu);
    return 0;
}

static int sync_files(ck_logger *lg)
{
    if (lg->fd_jsonl >= 0 && fsync(lg->fd_jsonl)) return -1;
    if (lg->fd_tb >= 0 && fsync(lg->fd_tb)) return -1;
    return 0;
}

int ck_log_flush(ck_logger *lg, int sync, char *err, size_t errlen)
{
    int rc = 0;
    if (lg->async) {
        pthread_mutex_lock(&lg->mu);
        uint64_t target = lg->submitted;
        while (lg->written < target && !lg->failed) {
            lg->flush_req = 1;
            pthread_cond_signal(&lg->wake);
            pthread_cond_wait(&lg->done, &lg->mu);
        }
        lg->flush_req = 0;
        rc = lg->failed ? -1 : 0;
        if (rc) snprintf(err, errlen, "%s", lg->err);
        pthread_mutex_unlock(&lg->mu);
    } else if (lg->failed) {
        snprintf(err, errlen, "%s", lg->err);
        rc = -1;
    }
    if (!rc && sync && sync_files(lg)) {
        snprintf(err, errlen, "cannot sync the log files: %s", strerror(errno));
        rc = -1;
    }
    return rc;
}

int ck_log_close(ck_logger *lg, char *err, size_t errlen)
{
    if (!lg) return 0;
    int rc = 0;
    if (lg->started) {
        pthread_mutex_lock(&lg->mu);
        lg->stop = 1;
        pthread_cond_signal(&lg->wake);
        pthread_mutex_unlock(&lg->mu);
        pthread_join(lg->thread, NULL);
        for (; lg->count > 0; lg->count--) { /* left by a writer that failed */
            ck_log_rec_free(&lg->q[lg->head]);
            lg->head = (lg->head + 1) % lg->cap;
        }
        pthread_mutex_destroy(&lg->mu);
        pthread_cond_destroy(&lg->wake);
        pthread_cond_destroy(&lg->space);
        pthread_cond_destroy(&lg->done);
    }
    if (lg->failed) {
        snprintf(err, errlen, "%s", lg->err);
        rc = -1;
    } else if (sync_files(lg)) {
        snprintf(err, errlen, "cannot sync the log files: %s", strerror(errno));
        rc = -1;
    }
    free_logger(lg);
    return rc;
}

const char *ck_log_jsonl_path(const ck_logger *lg) { return lg->path_jsonl; }
const char *ck_log_events_path(const ck_logger *lg) { return lg->path_tb; }

void ck_log_counts(ck_logger *lg, uint64_t *submitted, uint64_t *written)
{
    if (lg->async) pthread_mutex_lock(&lg->mu);
    *submitted = lg->submitted;
    *written = lg->written;
    if (lg->async) pthread_mutex_unlock(&lg->mu);
}
