/* Reading a tokenizer's files (vocab.json, merges.txt, tokenizer.json, a
 * bpe_simple_vocab .txt.gz, the config JSON) as input that may be hostile:
 * every size a file declares (its length, a gzip member's) is checked
 * against a cap before anything is allocated, every buffer is charged to a
 * budget before it is made, and the work polls between pieces so that a
 * stop (Ctrl-C, a callback's budget) takes effect at once. Knows nothing of
 * Lua: the binding (vm/lua/lua_text.c) gives the budget and the poll.
 * Messages say what is wrong, not which file: the caller names it. */
#ifndef CK_TEXT_FILE_H
#define CK_TEXT_FILE_H

#include <jansson.h>

#include <stddef.h>

/* the most a tokenizer file may hold, read or decompressed (the largest
 * real ones: a few MB) */
#define CK_TEXT_MAX_FILE ((size_t)256 << 20)

/* What reading may consume and how it stops. take charges n bytes before
 * they are allocated (0, or -1 with a message in err), give returns them;
 * poll is called every so often with the work done since (about a byte or
 * an entry each) and returns nonzero to stop. Any of them NULL: none. */
typedef struct ck_text_guard {
    int (*take)(void *ud, size_t n, const char *what, char *err, size_t errlen);
    void (*give)(void *ud, size_t n);
    void *ud;
    int (*poll)(void *pud, long long work);
    void *pud;
} ck_text_guard;

/* the message of work a poll stopped (the binding raises its own error) */
#define CK_TEXT_STOPPED "stopped"

/* g may be NULL in all of these. */
int ck_text_take(const ck_text_guard *g, size_t n, const char *what, char *err, size_t errlen);
void ck_text_give(const ck_text_guard *g, size_t n);
/* nonzero: stop (err gets CK_TEXT_STOPPED) */
int ck_text_poll(const ck_text_guard *g, long long work, char *err, size_t errlen);

/* A file's bytes (NUL-terminated) and what they are charged. */
typedef struct ck_text_buf {
    char *p;
    size_t len, charged;
} ck_text_buf;
void ck_text_buf_free(const ck_text_guard *g, ck_text_buf *b);

/* The whole of fd (a regular file of at most cap bytes) into out, read a
 * piece at a time. 0, or -1 with a message. */
int ck_text_read_fd(int fd, size_t cap, const ck_text_guard *g, ck_text_buf *out, char *err, size_t errlen);

/* Whether the n bytes at s start as gzip does. */
int ck_text_is_gzip(const char *s, size_t n);

/* The n bytes at in (gzip, several members allowed) decompressed into out,
 * at most cap bytes: the size the last member declares is checked first,
 * and the output grows, charged, as it comes. 0, or -1 with a message. */
int ck_text_gunzip(const char *in, size_t n, size_t cap, const ck_text_guard *g, ck_text_buf *out, char *err,
                   size_t errlen);

/* The JSON text s (n bytes) parsed by jansson, duplicate keys refused,
 * handed to it a piece at a time with a poll between pieces. NULL with a
 * message ("line L: what"). The values are jansson's: a caller that charges
 * them does so around this call (vm/lua/lua_ck.h's ck_lua_json_charge), and
 * learns from *read (NULL: not wanted) how much of the text they came from
 * when a charge stopped the parse. */
json_t *ck_text_json(const char *s, size_t n, const ck_text_guard *g, size_t *read, char *err, size_t errlen);

#endif
