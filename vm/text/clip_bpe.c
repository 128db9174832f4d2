/* The CLIP byte-level BPE tokenizer (vm/text/clip_bpe.h): vocabulary and
 * merge tables (from vocab.json + merges.txt, tokenizer.json or CLIP's bpe
 * file, charged and polled as they are built), the slow tokenizer's text
 * cleanup on ICU (with ftfy's fix_text or BasicTokenizer's), CLIP's
 * pre-tokenizing pattern, byte-to-unicode and the merges. */
#include "text/clip_bpe.h"
#include "util/memory.h"
#include "util/text.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* ---- a string -> int32 hash table over an arena of key bytes */

typedef struct entry {
    uint32_t off, len;
    int32_t val;
    uint32_t hash;
} entry;

typedef struct table {
    entry *e;
    size_t cap, n; /* cap: a power of two; 0 marks an empty slot by len == UINT32_MAX */
} table;

typedef struct special {
    uint32_t off, len;
    int32_t id;
} special;

struct ck_clip_bpe {
    char *arena;
    size_t alen, acap;
    table vocab, ranks;
    int32_t bos, eos, unk;
    int32_t nvocab;
    special specials[8];
    int nspecial;
    int fix;       /* CK_CLIP_FIX_* */
    uint64_t seed; /* of the hash: a file cannot be made to collide in it */
    ck_text_guard g;
    size_t charged;   /* to g, given back when freed */
    char refused[256]; /* g's message when it refused a charge */
    char byte_enc[256][3]; /* CLIP's byte-to-unicode table: each byte's character in UTF-8 */
    unsigned char byte_enc_len[256];
};

static uint64_t process_seed;
static pthread_once_t seed_once = PTHREAD_ONCE_INIT;

static void make_seed(void)
{
    uint64_t s = 0;
    if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t)sizeof s) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        s = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)&s;
    }
    process_seed = s;
}

/* FNV-1a from a secret basis, then mixed: slots that hostile keys cannot aim at */
static uint32_t hash_bytes(uint64_t seed, const char *s, size_t n)
{
    uint64_t h = seed ^ 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001B3ull;
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 33;
    return (uint32_t)h;
}

/* n bytes charged to the tokenizer's guard before they are allocated */
static int charge(ck_clip_bpe *t, size_t n, const char *what)
{
    if (ck_text_take(&t->g, n, what, t->refused, sizeof t->refused)) return -1;
    t->charged += n;
    return 0;
}

static void uncharge(ck_clip_bpe *t, size_t n)
{
    ck_text_give(&t->g, n);
    t->charged -= n;
}

/* bytes appended to the arena; their offset, or UINT32_MAX when out of memory */
static uint32_t arena_put(ck_clip_bpe *t, const char *s, size_t n)
{
    if (t->alen + n + 1 > t->acap) {
        size_t cap = t->acap ? t->acap : 1 << 16;
        while (cap < t->alen + n + 1) cap *= 2;
        if (cap > UINT32_MAX) return UINT32_MAX;
        if (charge(t, cap - t->acap, "the tokenizer's token bytes")) return UINT32_MAX;
        char *a = realloc(t->arena, cap);
        if (!a) {
            uncharge(t, cap - t->acap);
            return UINT32_MAX;
        }
        t->arena = a;
        t->acap = cap;
    }
    uint32_t off = (uint32_t)t->alen;
    memcpy(t->arena + off, s, n);
    t->arena[off + n] = 0;
    t->alen += n + 1;
    return off;
}

static entry *slot_of(const ck_clip_bpe *t, const table *tb, const char *s, size_t n, uint32_t h)
{
    size_t mask = tb->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        entry *e = &tb->e[i];
        if (e->len == UINT32_MAX) return e;
        if (e->hash == h && e->len == n && !memcmp(t->arena + e->off, s, n)) return e;
    }
}

static int table_grow(ck_clip_bpe *t, table *tb)
{
    size_t cap = tb->cap ? tb->cap * 2 : 1024;
    if (cap > SIZE_MAX / sizeof(entry)) return -1;
    if (charge(t, cap * sizeof(entry), "the tokenizer's tables")) return -1;
    entry *e = malloc(cap * sizeof *e);
    if (!e) {
        uncharge(t, cap * sizeof(entry));
        return -1;
    }
    for (size_t i = 0; i < cap; i++) e[i].len = UINT32_MAX;
    table nt = {e, cap, tb->n};
    for (size_t i = 0; i < tb->cap; i++) {
        if (tb->e[i].len == UINT32_MAX) continue;
        entry *d = slot_of(t, &nt, t->arena + tb->e[i].off, tb->e[i].len, tb->e[i].hash);
        *d = tb->e[i];
    }
    free(tb->e);
    uncharge(t, tb->cap * sizeof(entry));
    *tb = nt;
    return 0;
}

/* key -> val. A key already present keeps its value, or takes val when
 * last (as a Python dict built from a list keeps the last). 0 added, 1
 * present, -1 out of memory (or refused by the guard: t->refused says). */
static int table_put(ck_clip_bpe *t, table *tb, const char *s, size_t n, int32_t val, int last)
{
    if ((tb->n + 1) * 2 > tb->cap && table_grow(t, tb)) return -1;
    uint32_t h = hash_bytes(t->seed, s, n);
    entry *e = slot_of(t, tb, s, n, h);
    if (e->len != UINT32_MAX) {
        if (last) e->val = val;
        return 1;
    }
    uint32_t off = arena_put(t, s, n);
    if (off == UINT32_MAX) return -1;
    e->off = off;
    e->len = (uint32_t)n;
    e->val = val;
    e->hash = h;
    tb->n++;
    return 0;
}

static int32_t table_get(const ck_clip_bpe *t, const table *tb, const char *s, size_t n)
{
    if (!tb->cap) return -1;
    entry *e = slot_of(t, tb, s, n, hash_bytes(t->seed, s, n));
    return e->len == UINT32_MAX ? -1 : e->val;
}

int32_t ck_clip_bpe_id(const ck_clip_bpe *t, const char *tok, size_t n) { return table_get(t, &t->vocab, tok, n); }
int32_t ck_clip_bpe_vocab_size(const ck_clip_bpe *t) { return t->nvocab; }
int32_t ck_clip_bpe_bos(const ck_clip_bpe *t) { return t->bos; }
int32_t ck_clip_bpe_eos(const ck_clip_bpe *t) { return t->eos; }
void ck_clip_bpe_set_fix(ck_clip_bpe *t, int fix) { t->fix = fix; }
int ck_clip_bpe_fix(const ck_clip_bpe *t) { return t->fix; }

void ck_clip_bpe_free(ck_clip_bpe *t)
{
    if (!t) return;
    free(t->arena);
    free(t->vocab.e);
    free(t->ranks.e);
    ck_text_give(&t->g, t->charged + sizeof *t);
    free(t);
}

/* bytes_to_unicode: the printable bytes ! .. ~, ¡ .. ¬, ® .. ÿ stand for
 * themselves; the other 68, in byte order, for U+0100 on */
static int printable(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); }

static void make_byte_enc(ck_clip_bpe *t)
{
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int cp = printable(b) ? b : next++;
        if (cp < 0x80) {
            t->byte_enc[b][0] = (char)cp;
            t->byte_enc_len[b] = 1;
        } else {
            t->byte_enc[b][0] = (char)(0xC0 | (cp >> 6));
            t->byte_enc[b][1] = (char)(0x80 | (cp & 0x3F));
            t->byte_enc_len[b] = 2;
        }
    }
}

static ck_clip_bpe *new_bpe(const ck_text_guard *g, char *err, size_t errlen)
{
    ck_text_guard none = {0};
    if (ck_text_take(g, sizeof(ck_clip_bpe), "a tokenizer", err, errlen)) return NULL;
    ck_clip_bpe *t = calloc(1, sizeof *t);
    if (!t) {
        ck_text_give(g, sizeof(ck_clip_bpe));
        ck_errf(err, errlen, "out of memory");
        return NULL;
    }
    t->g = g ? *g : none;
    make_byte_enc(t);
    t->bos = t->eos = t->unk = -1;
    t->fix = CK_CLIP_FIX_FTFY;
    pthread_once(&seed_once, make_seed);
    t->seed = process_seed;
    return t;
}

/* a table could not grow: the guard's refusal, or out of memory */
static void oom(ck_clip_bpe *t, char *err, size_t errlen, const char *what)
{
    if (t->refused[0]) ck_errf(err, errlen, "%s", t->refused);
    else ck_errf(err, errlen, "out of memory reading %s", what);
}

/* every so many entries: 1 when the guard says stop (err set) */
static int poll_every(ck_clip_bpe *t, size_t i, char *err, size_t errlen)
{
    return (i & 4095) == 4095 && ck_text_poll(&t->g, 4096, err, errlen);
}

static int is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/* the merge (a, b) ranked rank; vocab_too: also a joined to b as the next
 * vocabulary entry (CLIP's own build). -1 with err set. */
static int put_merge(ck_clip_bpe *t, const char *a, size_t na, const char *b, size_t nb, int32_t rank, int vocab_too,
                     char *key, char *err, size_t errlen, const char *where)
{
    memcpy(key, a, na);
    key[na] = ' ';
    memcpy(key + na + 1, b, nb);
    if (table_put(t, &t->ranks, key, na + 1 + nb, rank, 0) < 0) {
        oom(t, err, errlen, where);
        return -1;
    }
    if (vocab_too) {
        memmove(key + na, key + na + 1, nb);
        if (table_put(t, &t->vocab, key, na + nb, t->nvocab, 1) < 0) {
            oom(t, err, errlen, where);
            return -1;
        }
        t->nvocab++;
    }
    return 0;
}

#define MAX_MERGE_KEY 1024

/* The merges of lines [from, from + CK_CLIP_MAX_MERGES) of text split on
 * '\n', ranked in order; each line must be two tokens. vocab_too: also add
 * each merge joined to the vocabulary (CLIP's own build). */
static int read_merges(ck_clip_bpe *t, const char *text, size_t len, int vocab_too, char *err, size_t errlen)
{
    size_t pos = 0;
    long line = 0;
    int32_t rank = 0;
    char key[MAX_MERGE_KEY];
    while (pos <= len && rank < CK_CLIP_MAX_MERGES) {
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len;
        line++;
        if (line >= 2) {
            const char *s = text + pos, *e = text + end;
            const char *part[3];
            size_t plen[3];
            int np = 0;
            while (s < e) {
                while (s < e && is_ascii_space(*s)) s++;
                if (s == e) break;
                const char *w = s;
                while (s < e && !is_ascii_space(*s)) s++;
                if (np < 3) {
                    part[np] = w;
                    plen[np] = (size_t)(s - w);
                }
                np++;
            }
            if (np == 0 && !nl) break; /* the file's end */
            if (np != 2) {
                ck_errf(err, errlen, "merges line %ld is not two tokens", line);
                return -1;
            }
            if (plen[0] + plen[1] + 1 > sizeof key) {
                ck_errf(err, errlen, "merges line %ld is longer than %zu bytes", line, sizeof key);
                return -1;
            }
            if (put_merge(t, part[0], plen[0], part[1], plen[1], rank, vocab_too, key, err, errlen, "the merges"))
                return -1;
            if (poll_every(t, (size_t)rank, err, errlen)) return -1;
            rank++;
        }
        if (!nl) break;
        pos = end + 1;
    }
    return 0;
}

static int add_special_id(ck_clip_bpe *t, const char *tok, size_t n, int32_t id)
{
    for (int i = 0; i < t->nspecial; i++)
        if (t->specials[i].len == n && !memcmp(t->arena + t->specials[i].off, tok, n)) return 0;
    if (t->nspecial == 8 || n == 0) return -1;
    uint32_t off = arena_put(t, tok, n);
    if (off == UINT32_MAX) return -1;
    /* kept longest first: the split takes the longest that matches */
    int i = t->nspecial++;
    while (i > 0 && t->specials[i - 1].len < n) {
        t->specials[i] = t->specials[i - 1];
        i--;
    }
    t->specials[i] = (special){off, (uint32_t)n, id};
    return 0;
}

int ck_clip_bpe_add_special(ck_clip_bpe *t, const char *tok, size_t n)
{
    int32_t id = ck_clip_bpe_id(t, tok, n);
    if (id < 0) return -1;
    return add_special_id(t, tok, n, id);
}

/* BOS, EOS (the unknown token too) and both as special tokens; what names
 * the vocabulary in a message */
static int finish(ck_clip_bpe *t, const char *what, char *err, size_t errlen)
{
    static const char sot[] = "<|startoftext|>", eot[] = "<|endoftext|>";
    t->bos = ck_clip_bpe_id(t, sot, sizeof sot - 1);
    t->eos = ck_clip_bpe_id(t, eot, sizeof eot - 1);
    if (t->bos < 0 || t->eos < 0) {
        ck_errf(err, errlen, "%s has no %s", what, t->bos < 0 ? sot : eot);
        return -1;
    }
    t->unk = t->eos;
    if (add_special_id(t, sot, sizeof sot - 1, t->bos) || add_special_id(t, eot, sizeof eot - 1, t->eos)) {
        oom(t, err, errlen, what);
        return -1;
    }
    /* built: the guard's poll (the caller's, for this load) is not kept */
    t->g.poll = NULL;
    t->g.pud = NULL;
    return 0;
}

/* the entries of a vocab object (token -> id in [0, 2^31)); what names it */
static int read_vocab(ck_clip_bpe *t, const json_t *v, const char *what, char *err, size_t errlen)
{
    if (!json_is_object(v)) {
        ck_errf(err, errlen, "%s is not an object of token -> id", what);
        return -1;
    }
    const char *k;
    size_t kl, i = 0;
    json_t *val;
    json_object_keylen_foreach((json_t *)v, k, kl, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id > INT32_MAX) {
            ck_errf(err, errlen, "%s: the id of \"%.60s\" is not an integer in [0, 2^31)", what, k);
            return -1;
        }
        if (kl >= UINT32_MAX / 2 || table_put(t, &t->vocab, k, kl, (int32_t)id, 1) < 0) {
            oom(t, err, errlen, what);
            return -1;
        }
        t->nvocab++;
        if (poll_every(t, i++, err, errlen)) return -1;
    }
    return 0;
}

ck_clip_bpe *ck_clip_bpe_from_vocab(const json_t *vocab, const char *merges, size_t mlen, const ck_text_guard *g,
                                    char *err, size_t errlen)
{
    ck_clip_bpe *t = new_bpe(g, err, errlen);
    if (!t) return NULL;
    if (read_vocab(t, vocab, "vocab.json", err, errlen)) goto bad;
    /* the slow tokenizer reads merges.txt with .strip(): leading blank
     * lines do not count as the header */
    while (mlen && (*merges == '\n' || is_ascii_space(*merges))) merges++, mlen--;
    if (read_merges(t, merges, mlen, 0, err, errlen)) goto bad;
    if (finish(t, "vocab.json", err, errlen)) goto bad;
    return t;
bad:
    ck_clip_bpe_free(t);
    return NULL;
}

ck_clip_bpe *ck_clip_bpe_from_files(const char *vocab, size_t vlen, const char *merges, size_t mlen,
                                    const ck_text_guard *g, char *err, size_t errlen)
{
    char why[256];
    json_t *v = ck_text_json(vocab, vlen, g, NULL, why, sizeof why);
    if (!v) {
        if (!strcmp(why, CK_TEXT_STOPPED)) ck_errf(err, errlen, "%s", why);
        else ck_errf(err, errlen, "vocab.json is not JSON (%s)", why);
        return NULL;
    }
    ck_clip_bpe *t = ck_clip_bpe_from_vocab(v, merges, mlen, g, err, errlen);
    json_decref(v);
    return t;
}

/* a string member of obj that may be absent or null: 1 with *s set, 0
 * absent or null, -1 present but no string */
static int opt_string(const json_t *obj, const char *key, const char **s)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return -1;
    *s = json_string_value(v);
    return 1;
}

ck_clip_bpe *ck_clip_bpe_from_tokenizer_json(const json_t *root, const ck_text_guard *g, char *err, size_t errlen)
{
    /* the structure first, then the tables */
    const json_t *model = json_is_object(root) ? json_object_get(root, "model") : NULL;
    if (!json_is_object(model)) {
        ck_errf(err, errlen, "tokenizer.json has no \"model\" object");
        return NULL;
    }
    const char *s = NULL;
    int r = opt_string(model, "type", &s);
    if (r < 0 || (r > 0 && strcmp(s, "BPE"))) {
        ck_errf(err, errlen, "tokenizer.json: model.type is %s%.40s%s; CLIP's tokenizer is \"BPE\"", r > 0 ? "\"" : "",
             r > 0 ? s : "not a string", r > 0 ? "\"" : "");
        return NULL;
    }
    r = opt_string(model, "end_of_word_suffix", &s);
    if (r <= 0 || strcmp(s, "</w>")) {
        ck_errf(err, errlen, "tokenizer.json: model.end_of_word_suffix is %s%.40s%s; CLIP's BPE marks a word's end with \"</w>\"",
             r > 0 ? "\"" : "", r > 0 ? s : r < 0 ? "not a string" : "absent", r > 0 ? "\"" : "");
        return NULL;
    }
    r = opt_string(model, "continuing_subword_prefix", &s);
    if (r < 0 || (r > 0 && s[0])) {
        ck_errf(err, errlen, "tokenizer.json: model.continuing_subword_prefix must be empty or null for CLIP's BPE");
        return NULL;
    }
    const json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_array(merges)) {
        ck_errf(err, errlen, "tokenizer.json: model.merges is not a list");
        return NULL;
    }
    const json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_null(added) && !json_is_array(added)) {
        ck_errf(err, errlen, "tokenizer.json: added_tokens is not a list");
        return NULL;
    }
    size_t i;
    json_t *a;
    json_array_foreach(added, i, a) {
        json_t *id = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_object(a) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) > INT32_MAX || !json_is_string(content) || !json_string_length(content)) {
            ck_errf(err, errlen, "tokenizer.json: added_tokens[%zu] is not {\"id\": an id, \"content\": a token, ...}", i);
            return NULL;
        }
    }
    ck_clip_bpe *t = new_bpe(g, err, errlen);
    if (!t) return NULL;
    if (read_vocab(t, vocab, "tokenizer.json's model.vocab", err, errlen)) goto bad;
    json_array_foreach(added, i, a) {
        json_t *content = json_object_get(a, "content");
        const char *tok = json_string_value(content);
        size_t n = json_string_length(content);
        int32_t id = (int32_t)json_integer_value(json_object_get(a, "id")), have = ck_clip_bpe_id(t, tok, n);
        if (have >= 0 && have != id) {
            ck_errf(err, errlen, "tokenizer.json: added token \"%.60s\" has id %d, its vocab entry %d", tok, (int)id, (int)have);
            goto bad;
        }
        if (have < 0) {
            if (table_put(t, &t->vocab, tok, n, id, 1) < 0) {
                oom(t, err, errlen, "tokenizer.json");
                goto bad;
            }
            t->nvocab++;
        }
    }
    char key[MAX_MERGE_KEY];
    json_t *m;
    json_array_foreach(merges, i, m) {
        if (i >= CK_CLIP_MAX_MERGES) break;
        const char *pa, *pb;
        size_t na, nb;
        if (json_is_string(m)) {
            /* "a b": tokenizers' older form, split on its one space */
            pa = json_string_value(m);
            const char *sp = memchr(pa, ' ', json_string_length(m));
            if (!sp || memchr(sp + 1, ' ', json_string_length(m) - (size_t)(sp + 1 - pa))) goto bad_merge;
            na = (size_t)(sp - pa);
            pb = sp + 1;
            nb = json_string_length(m) - na - 1;
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            pa = json_string_value(json_array_get(m, 0));
            pb = json_string_value(json_array_get(m, 1));
            na = json_string_length(json_array_get(m, 0));
            nb = json_string_length(json_array_get(m, 1));
            if (memchr(pa, ' ', na) || memchr(pb, ' ', nb)) goto bad_merge;
        } else {
            goto bad_merge;
        }
        if (!na || !nb || memchr(pa, 0, na) || memchr(pb, 0, nb)) goto bad_merge;
        if (na + nb + 1 > sizeof key) {
            ck_errf(err, errlen, "tokenizer.json: model.merges[%zu] is longer than %zu bytes", i, sizeof key);
            goto bad;
        }
        if (put_merge(t, pa, na, pb, nb, (int32_t)i, 0, key, err, errlen, "tokenizer.json")) goto bad;
        if (poll_every(t, i, err, errlen)) goto bad;
    }
    if (finish(t, "tokenizer.json's model.vocab", err, errlen)) goto bad;
    return t;
bad_merge:
    ck_errf(err, errlen, "tokenizer.json: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"] (two tokens without spaces)", i);
bad:
    ck_clip_bpe_free(t);
    return NULL;
}

ck_clip_bpe *ck_clip_bpe_from_merges(const char *text, size_t len, const ck_text_guard *g, char *err, size_t errlen)
{
    ck_clip_bpe *t = new_bpe(g, err, errlen);
    if (!t) return NULL;
    /* the byte characters in the table's order (the printable bytes, then
     * the others), then each with "</w>" */
    int order[256], no = 0;
    for (int b = 0; b < 256; b++)
        if (printable(b)) order[no++] = b;
    for (int b = 0; b < 256; b++)
        if (!printable(b)) order[no++] = b;
    for (int pass = 0; pass < 2; pass++)
        for (int o = 0; o < 256; o++) {
            int b = order[o];
            char tok[8];
            size_t n = t->byte_enc_len[b];
            memcpy(tok, t->byte_enc[b], n);
            if (pass) memcpy(tok + n, "</w>", 4), n += 4;
            if (table_put(t, &t->vocab, tok, n, t->nvocab++, 1) < 0) {
                oom(t, err, errlen, "the merges");
                goto bad;
            }
        }
    if (read_merges(t, text, len, 1, err, errlen)) goto bad;
    if (t->ranks.n == 0) {
        ck_errf(err, errlen, "no merges after the first line");
        goto bad;
    }
    if (table_put(t, &t->vocab, "<|startoftext|>", 15, t->nvocab++, 1) < 0 ||
        table_put(t, &t->vocab, "<|endoftext|>", 13, t->nvocab++, 1) < 0) {
        oom(t, err, errlen, "the merges");
        goto bad;
    }
    /* a merge that repeats an earlier token does not add an entry */
    t->nvocab = (int32_t)t->vocab.n;
    if (finish(t, "the vocabulary", err, errlen)) goto bad;
    return t;
bad:
    ck_clip_bpe_free(t);
    return NULL;
}

/* ---- scratch */

void ck_clip_scratch_free(ck_clip_scratch *s)
{
    for (size_t i = 0; i < sizeof s->buf / sizeof s->buf[0]; i++) {
        free(s->buf[i]);
        s->buf[i] = NULL;
        s->cap[i] = 0;
    }
    ck_ftfy_scratch_free(&s->ft);
}

/* slot i with room for at least n bytes (its contents kept), or NULL */
static void *grow(ck_clip_scratch *s, int i, size_t n)
{
    return ck_grow(&s->buf[i], &s->cap[i], n, 1, 256) ? NULL : s->buf[i];
}

enum { S_CP, S_U16, S_NFC, S_LOWER, S_UTF8, S_WORD, S_SYMS, S_KEY, S_HEAP, S_ROUND };

/* ---- UTF-8 */

/* the code point at s[*i] (valid UTF-8), *i moved past it */
static int32_t next_cp(const char *str, size_t n, size_t *i)
{
    const unsigned char *s = (const unsigned char *)str;
    unsigned c = s[*i];
    if (c < 0x80) {
        *i += 1;
        return (int32_t)c;
    }
    int len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    int32_t cp = (int32_t)(c & (0x3F >> (len - 1)));
    for (int k = 1; k < len && *i + k < n; k++) cp = (cp << 6) | (s[*i + k] & 0x3F);
    *i += len;
    return cp;
}

size_t ck_clip_utf8_check(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int len;
        uint32_t min;
        if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000;
        else return i;
        if (i + (size_t)len > n) return i;
        uint32_t cp = c & (0x3F >> (len - 1));
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += (size_t)len;
    }
    return n;
}

/* ---- the slow tokenizer's cleanup */

/* the general category as Python 3.11's unicodedata (Unicode 14.0) gives
 * it: ICU's, except that characters assigned later are unassigned */
static int8_t category(UChar32 c)
{
    int8_t t = u_charType(c);
    if (t != U_UNASSIGNED) {
        UVersionInfo age;
        u_charAge(c, age);
        if (age[0] > CK_CLIP_UNICODE_AGE_MAJOR ||
            (age[0] == CK_CLIP_UNICODE_AGE_MAJOR && age[1] > CK_CLIP_UNICODE_AGE_MINOR))
            return U_UNASSIGNED;
    }
    return t;
}

/* BasicTokenizer's _is_control: a C* category, but not \t \n \r */
static int is_control(UChar32 c)
{
    if (c == '\t' || c == '\n' || c == '\r') return 0;
    int8_t t = category(c);
    return t == U_CONTROL_CHAR || t == U_FORMAT_CHAR || t == U_PRIVATE_USE_CHAR || t == U_SURROGATE ||
           t == U_UNASSIGNED;
}

/* BasicTokenizer's _is_whitespace: space, \t \n \r, or Zs */
static int is_bt_space(UChar32 c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || category(c) == U_SPACE_SEPARATOR;
}

/* Python's str.isspace (what str.split splits on): bidirectional class
 * WS, B or S, or category Zs */
static int is_py_space(UChar32 c)
{
    if (category(c) == U_UNASSIGNED) return 0;
    UCharDirection d = u_charDirection(c);
    return d == U_WHITE_SPACE_NEUTRAL || d == U_BLOCK_SEPARATOR || d == U_SEGMENT_SEPARATOR ||
           u_charType(c) == U_SPACE_SEPARATOR;
}

/* BasicTokenizer's _is_chinese_char: the CJK ideograph blocks */
static int is_cjk(UChar32 c)
{
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* BasicTokenizer's cleanup (CK_CLIP_FIX_NONE) */
static const char *clean_basic(const char *text, size_t n, ck_clip_scratch *s, size_t *outlen)
{
    /* 1. removal, spaces, CJK spacing, into UTF-16 (each input byte gives at
     * most 3 code units: a 1-byte character 1, a CJK one 3 for 3 bytes) */
    if (n > (SIZE_MAX - 16) / (3 * sizeof(UChar))) return NULL;
    UChar *u = grow(s, S_U16, (3 * n + 16) * sizeof(UChar));
    if (!u) return NULL;
    int32_t ulen = 0;
    size_t i = 0;
    while (i < n) {
        UChar32 c = next_cp(text, n, &i);
        if (c == 0 || c == 0xFFFD || is_control(c)) continue;
        if (is_bt_space(c)) c = ' ';
        if (is_cjk(c)) u[ulen++] = ' ';
        U16_APPEND_UNSAFE(u, ulen, c);
        if (is_cjk(c)) u[ulen++] = ' ';
    }
    /* 2. NFC */
    UErrorCode ec = U_ZERO_ERROR;
    const UNormalizer2 *nfc = unorm2_getNFCInstance(&ec);
    if (U_FAILURE(ec)) return NULL;
    size_t cap = (size_t)ulen * 3 + 16;
    UChar *v;
    int32_t vlen;
    for (;;) {
        if (cap > INT32_MAX) return NULL;
        v = grow(s, S_NFC, cap * sizeof(UChar));
        if (!v) return NULL;
        ec = U_ZERO_ERROR;
        vlen = unorm2_normalize(nfc, u, ulen, v, (int32_t)cap, &ec);
        if (ec == U_BUFFER_OVERFLOW_ERROR) {
            cap = (size_t)vlen + 16;
            continue;
        }
        if (U_FAILURE(ec)) return NULL;
        break;
    }
    /* 3. words split on str.isspace, each lower-cased (root locale: full
     * mappings, final sigma by context within the word), joined by ' ' */
    size_t wcap = (size_t)vlen * 3 + 16;
    UChar *w = grow(s, S_LOWER, wcap * sizeof(UChar));
    if (!w) return NULL;
    int32_t wlen = 0, k = 0;
    while (k < vlen) {
        int32_t start = k, j = k;
        UChar32 c;
        U16_NEXT(v, j, vlen, c);
        if (is_py_space(c)) {
            k = j;
            continue;
        }
        int32_t end = start;
        while (end < vlen) {
            j = end;
            U16_NEXT(v, j, vlen, c);
            if (is_py_space(c)) break;
            end = j;
        }
        if (wlen) w[wlen++] = ' ';
        for (;;) {
            ec = U_ZERO_ERROR;
            int32_t room = (int32_t)(wcap - (size_t)wlen);
            int32_t got = u_strToLower(w + wlen, room, v + start, end - start, "", &ec);
            if (ec == U_BUFFER_OVERFLOW_ERROR || ec == U_STRING_NOT_TERMINATED_WARNING || got >= room) {
                wcap = wcap * 2 + (size_t)got;
                if (wcap > INT32_MAX) return NULL;
                w = grow(s, S_LOWER, wcap * sizeof(UChar));
                if (!w) return NULL;
                continue;
            }
            if (U_FAILURE(ec)) return NULL;
            wlen += got;
            break;
        }
        k = end;
    }
    /* 4. back to UTF-8 */
    size_t ocap = (size_t)wlen * 3 + 1;
    char *o = grow(s, S_UTF8, ocap);
    if (!o) return NULL;
    int32_t olen = 0;
    ec = U_ZERO_ERROR;
    u_strToUTF8(o, (int32_t)ocap, &olen, w, wlen, &ec);
    if (U_FAILURE(ec) || (size_t)olen >= ocap) return NULL;
    o[olen] = 0;
    *outlen = (size_t)olen;
    return o;
}

/* UTF-16 w (wlen units) lower-cased as a whole (root locale: full
 * mappings, final sigma by context) and made UTF-8 in S_UTF8 */
static const char *lower_utf8(UChar *w, int32_t wlen, ck_clip_scratch *s, size_t *outlen)
{
    size_t lcap = (size_t)wlen * 3 + 16;
    UChar *l;
    int32_t llen;
    for (;;) {
        if (lcap > INT32_MAX) return NULL;
        l = grow(s, S_LOWER, lcap * sizeof(UChar));
        if (!l) return NULL;
        UErrorCode ec = U_ZERO_ERROR;
        llen = u_strToLower(l, (int32_t)lcap, w, wlen, "", &ec);
        if (ec == U_BUFFER_OVERFLOW_ERROR || (size_t)llen >= lcap) {
            lcap = (size_t)llen + 16;
            continue;
        }
        if (U_FAILURE(ec)) return NULL;
        break;
    }
    size_t ocap = (size_t)llen * 3 + 1;
    char *o = grow(s, S_UTF8, ocap);
    if (!o) return NULL;
    int32_t olen = 0;
    UErrorCode ec = U_ZERO_ERROR;
    u_strToUTF8(o, (int32_t)ocap, &olen, l, llen, &ec);
    if (U_FAILURE(ec) || (size_t)olen >= ocap) return NULL;
    o[olen] = 0;
    *outlen = (size_t)olen;
    return o;
}

/* The slow tokenizer with ftfy: whitespace_clean(ftfy.fix_text(text)).lower(),
 * whitespace_clean making each run of the regex module's \s (White_Space)
 * one space and stripping str.isspace characters from the ends */
static const char *clean_ftfy(const char *text, size_t n, ck_clip_scratch *s, size_t *outlen, ck_clip_poll poll,
                              void *pud)
{
    if (n > (SIZE_MAX - 16) / sizeof(UChar32)) return NULL;
    UChar32 *cp = grow(s, S_CP, (n + 16) * sizeof(UChar32));
    if (!cp) return NULL;
    size_t ncp = 0;
    for (size_t i = 0; i < n;) cp[ncp++] = next_cp(text, n, &i);
    size_t fn;
    const UChar32 *f = ck_ftfy_fix_text(cp, ncp, &s->ft, &fn, poll, pud);
    if (!f) return NULL;
    size_t a = 0, b = fn;
    while (a < b && (u_isUWhiteSpace(f[a]) || is_py_space(f[a]))) a++;
    while (b > a && (u_isUWhiteSpace(f[b - 1]) || is_py_space(f[b - 1]))) b--;
    if (fn > (size_t)INT32_MAX / 4) return NULL;
    UChar *w = grow(s, S_U16, (2 * (b - a) + 16) * sizeof(UChar));
    if (!w) return NULL;
    int32_t wlen = 0;
    for (size_t i = a; i < b; i++) {
        if (u_isUWhiteSpace(f[i])) {
            if (!u_isUWhiteSpace(f[i - 1])) w[wlen++] = ' '; /* a run's first (i > a: the ends are stripped) */
            continue;
        }
        U16_APPEND_UNSAFE(w, wlen, f[i]);
    }
    return lower_utf8(w, wlen, s, outlen);
}

const char *ck_clip_clean(const char *text, size_t n, int fix, ck_clip_scratch *s, size_t *outlen, ck_clip_poll poll,
                          void *pud)
{
    if (fix == CK_CLIP_FIX_FTFY) return clean_ftfy(text, n, s, outlen, poll, pud);
    return clean_basic(text, n, s, outlen);
}

/* ---- CLIP's pattern */

/* the character at s[i] equals ASCII letter or mark p ignoring case as the
 * slow tokenizer's pattern (regex, IGNORECASE) does: ASCII case, and 'ſ'
 * (U+017F) for 's'; its length in *len, 0 when it does not match */
static size_t match_ci(const char *s, size_t n, size_t i, char p)
{
    unsigned char c = (unsigned char)s[i];
    if (c == (unsigned char)p || (p >= 'a' && p <= 'z' && c == (unsigned char)(p - 32))) return 1;
    if (p == 's' && i + 1 < n && c == 0xC5 && (unsigned char)s[i + 1] == 0xBF) return 2;
    return 0;
}

/* the length of lit matched at s[i] ignoring case, or 0 */
static size_t match_lit(const char *s, size_t n, size_t i, const char *lit)
{
    size_t j = i;
    for (const char *p = lit; *p; p++) {
        if (j >= n) return 0;
        size_t m = match_ci(s, n, j, *p);
        if (!m) return 0;
        j += m;
    }
    return j - i;
}

/* the pattern's \p{L} and \p{N}: ICU's categories (the regex module has its
 * own tables, newer than Python's unicodedata) */
static int is_letter(UChar32 c)
{
    int8_t t = u_charType(c);
    return t == U_UPPERCASE_LETTER || t == U_LOWERCASE_LETTER || t == U_TITLECASE_LETTER ||
           t == U_MODIFIER_LETTER || t == U_OTHER_LETTER;
}

static int is_number(UChar32 c)
{
    int8_t t = u_charType(c);
    return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

/* the pattern's \s: the White_Space property */
static int is_re_space(UChar32 c) { return u_isUWhiteSpace(c); }

/* U+0345 (combining ypogegrammeni) folds to a letter, ι: under IGNORECASE
 * the regex module matches it by no alternative, so it is skipped as a space is */
static int matches_none(UChar32 c) { return c == 0x345; }

/* The next match of CLIP's pattern in s from *pos: its start and length;
 * *special: 1 when it is one of the pattern's special-token alternatives.
 * 0 when there is none. */
static int next_piece(const char *s, size_t n, size_t *pos, size_t *start, size_t *len, int *special)
{
    static const char *const contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    size_t i = *pos;
    while (i < n) {
        size_t m;
        *special = 0;
        if ((m = match_lit(s, n, i, "<|startoftext|>")) || (m = match_lit(s, n, i, "<|endoftext|>"))) {
            *special = 1;
            goto found;
        }
        for (int k = 0; k < 7; k++)
            if ((m = match_lit(s, n, i, contractions[k]))) goto found;
        size_t j = i;
        UChar32 c = next_cp(s, n, &j);
        if (is_letter(c)) {
            size_t e = j;
            while (e < n) {
                size_t f = e;
                if (!is_letter(next_cp(s, n, &f))) break;
                e = f;
            }
            m = e - i;
            goto found;
        }
        if (is_number(c)) {
            m = j - i;
            goto found;
        }
        if (!is_re_space(c) && !matches_none(c)) {
            size_t e = j;
            while (e < n) {
                size_t f = e;
                UChar32 d = next_cp(s, n, &f);
                if (is_re_space(d) || is_letter(d) || is_number(d) || matches_none(d)) break;
                e = f;
            }
            m = e - i;
            goto found;
        }
        i = j;
        continue;
    found:
        *start = i;
        *len = m;
        *pos = i + m;
        return 1;
    }
    *pos = n;
    return 0;
}

/* ---- the merges */

/* A symbol of the word being merged: its bytes w[s, e), its neighbours in
 * the list (NONE at the ends) and a version that changes when it takes in
 * its right neighbour (0 when it was taken in). */
#define NONE UINT32_MAX
typedef struct node {
    uint32_t s, e, prev, next, ver;
} node;

/* an adjacent pair (left, right) of rank rank, as the two were when it was found */
typedef struct cand {
    int32_t rank;
    uint32_t left, right, vl, vr;
} cand;

/* the rank of the pair (a, b), or INT32_MAX */
static int32_t pair_rank(const ck_clip_bpe *t, const char *w, const node *a, const node *b, char *key)
{
    size_t la = a->e - a->s, lb = b->e - b->s;
    if (la + 1 + lb > MAX_MERGE_KEY) return INT32_MAX; /* longer than any merge read */
    memcpy(key, w + a->s, la);
    key[la] = ' ';
    memcpy(key + la + 1, w + b->s, lb);
    int32_t r = table_get(t, &t->ranks, key, la + 1 + lb);
    return r < 0 ? INT32_MAX : r;
}

/* a min-heap of candidates by rank, then by left position */
static int cand_less(const cand *a, const cand *b) { return a->rank < b->rank || (a->rank == b->rank && a->left < b->left); }

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    while (i > 0 && cand_less(&c, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* the pair (left, next[left]) as a candidate, where the merges rank it */
static void push_pair(const ck_clip_bpe *t, const char *w, const node *nd, uint32_t left, cand *h, size_t *nh, char *key)
{
    if (left == NONE || nd[left].next == NONE) return;
    uint32_t right = nd[left].next;
    int32_t r = pair_rank(t, w, &nd[left], &nd[right], key);
    if (r != INT32_MAX) heap_push(h, nh, (cand){r, left, right, nd[left].ver, nd[right].ver});
}

/* whether the pair is still as it was found */
static int still(const node *nd, const cand *c)
{
    return nd[c->left].ver == c->vl && nd[c->right].ver == c->vr && nd[c->left].next == c->right;
}

static int cmp_left(const void *a, const void *b)
{
    uint32_t x = ((const cand *)a)->left, y = ((const cand *)b)->left;
    return (x > y) - (x < y);
}

/* BPE of one piece (n bytes of cleaned text); each symbol emitted. -1 out
 * of memory, 1 stopped by emit, 0 done.
 *
 * The slow tokenizer's loop: the lowest-ranked adjacent pair, every
 * occurrence of it merged left to right (not overlapping), again until no
 * pair is ranked. Done with a heap of the pairs and a list of the symbols,
 * so a word costs n log n, not n^2: each round takes every candidate of the
 * lowest rank (all occurrences of that one pair), merges those still as
 * they were in left-to-right order, and only then adds the pairs the merges
 * made, as the slow tokenizer looks for the next pair only after a pass. */
static int bpe_piece(const ck_clip_bpe *t, const char *p, size_t n, ck_clip_scratch *s, ck_clip_emit emit,
                     void *eud, ck_clip_poll poll, void *pud)
{
    if (n >= NONE / 4) return -1;
    char *w = grow(s, S_WORD, 2 * n + 8);
    node *nd = grow(s, S_SYMS, (n + 1) * sizeof(node));
    char *key = grow(s, S_KEY, 2 * MAX_MERGE_KEY + 16);
    cand *h = grow(s, S_HEAP, (3 * n + 4) * sizeof(cand));
    cand *round = grow(s, S_ROUND, (3 * n + 4) * sizeof(cand));
    if (!w || !nd || !key || !h || !round) return -1;
    uint32_t wl = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)p[i];
        nd[i] = (node){wl, 0, i ? (uint32_t)i - 1 : NONE, i + 1 < n ? (uint32_t)i + 1 : NONE, 1};
        memcpy(w + wl, t->byte_enc[b], t->byte_enc_len[b]);
        wl += t->byte_enc_len[b];
        nd[i].e = wl;
    }
    memcpy(w + wl, "</w>", 4);
    nd[n - 1].e = wl + 4;
    size_t nh = 0;
    for (uint32_t i = 0; i + 1 < n; i++) push_pair(t, w, nd, i, h, &nh, key);
    long long work = 0;
    while (nh) {
        cand c = heap_pop(h, &nh);
        if (!still(nd, &c)) continue;
        /* the round: every candidate of this rank (all occurrences of one
         * pair: a rank names one pair), those still as found */
        size_t nr = 0;
        round[nr++] = c;
        while (nh && h[0].rank == c.rank) {
            cand d = heap_pop(h, &nh);
            if (still(nd, &d)) round[nr++] = d;
        }
        /* left to right (a merge keeps the left index, so list order is
         * index order); one that a merge to its left took in, or a
         * duplicate of one merged, is no longer as found */
        qsort(round, nr, sizeof *round, cmp_left);
        size_t merged = 0;
        for (size_t k = 0; k < nr; k++) {
            if (!still(nd, &round[k])) continue;
            uint32_t l = round[k].left, r = round[k].right;
            nd[l].e = nd[r].e;
            nd[l].next = nd[r].next;
            if (nd[r].next != NONE) nd[nd[r].next].prev = l;
            nd[r].ver = 0;
            nd[l].ver++;
            round[merged++].left = l;
        }
        /* then the pairs the merges made */
        for (size_t k = 0; k < merged; k++) {
            uint32_t l = round[k].left;
            push_pair(t, w, nd, nd[l].prev, h, &nh, key);
            push_pair(t, w, nd, l, h, &nh, key);
        }
        work += (long long)nr + 1;
        if (poll && work > 4096) {
            poll(pud, work);
            work = 0;
        }
    }
    for (uint32_t i = 0; i != NONE; i = nd[i].next) {
        int32_t id = table_get(t, &t->vocab, w + nd[i].s, nd[i].e - nd[i].s);
        if (id < 0) id = t->unk;
        if (emit(eud, id, w + nd[i].s, nd[i].e - nd[i].s)) return 1;
    }
    return 0;
}

/* one piece of raw text between special tokens: cleaned, cut, merged */
static int run_piece(const ck_clip_bpe *t, const char *text, size_t n, ck_clip_scratch *s, ck_clip_emit emit,
                     void *eud, ck_clip_poll poll, void *pud)
{
    size_t cl;
    const char *c = ck_clip_clean(text, n, t->fix, s, &cl, poll, pud);
    if (!c) return -1;
    if (poll) poll(pud, (long long)n);
    size_t pos = 0, st, len;
    int sp;
    long long work = 0;
    while (next_piece(c, cl, &pos, &st, &len, &sp)) {
        int r;
        /* the slow tokenizer's cache holds the two special tokens: a piece
         * spelled exactly so is that token */
        if (sp && len == 15 && !memcmp(c + st, "<|startoftext|>", 15)) r = emit(eud, t->bos, c + st, len);
        else if (sp && len == 13 && !memcmp(c + st, "<|endoftext|>", 13)) r = emit(eud, t->eos, c + st, len);
        else r = bpe_piece(t, c + st, len, s, emit, eud, poll, pud);
        if (r) return r;
        work += (long long)len + 16;
        if (poll && work > 4096) {
            poll(pud, work);
            work = 0;
        }
    }
    return 0;
}

int ck_clip_bpe_run(const ck_clip_bpe *t, const char *text, size_t n, ck_clip_scratch *s, ck_clip_emit emit,
                    void *emit_ud, ck_clip_poll poll, void *poll_ud)
{
    size_t from = 0, i = 0;
    while (i < n) {
        const special *hit = NULL;
        for (int k = 0; k < t->nspecial; k++) {
            const special *sp = &t->specials[k];
            if (sp->len <= n - i && !memcmp(text + i, t->arena + sp->off, sp->len)) {
                hit = sp;
                break;
            }
        }
        if (!hit) {
            i++;
            continue;
        }
        if (i > from) {
            int r = run_piece(t, text + from, i - from, s, emit, emit_ud, poll, poll_ud);
            if (r) return r < 0 ? -1 : 0;
        }
        if (emit(emit_ud, hit->id, t->arena + hit->off, hit->len)) return 0;
        i += hit->len;
        from = i;
    }
    if (n > from) {
        int r = run_piece(t, text + from, n - from, s, emit, emit_ud, poll, poll_ud);
        if (r) return r < 0 ? -1 : 0;
    }
    return 0;
}

/* ---- framing */

int ck_clip_frame(const ck_clip_bpe *t, const int32_t *ids, size_t n, int max_length, int32_t pad, int32_t *out)
{
    int k = 0;
    out[k++] = t->bos;
    size_t keep = n < (size_t)(max_length - 2) ? n : (size_t)(max_length - 2);
    for (size_t i = 0; i < keep; i++) out[k++] = ids[i];
    out[k++] = t->eos;
    if (pad >= 0)
        while (k < max_length) out[k++] = pad;
    return k;
}

void ck_clip_chunks(const ck_clip_bpe *t, const int32_t *ids, size_t n, int k, int32_t pad, int32_t *out)
{
    /* the frame fits in out (77 k >= 75 k + 2) only at its start, which
     * the chunks overwrite: the chunks are made last to first, each from
     * entries at or after where it starts */
    int len = 75 * k + 2;
    ck_clip_frame(t, ids, n, len, pad, out);
    int32_t last = out[len - 1], bos = out[0];
    for (int c = k - 1; c >= 0; c--) {
        int32_t *d = out + 77 * c;
        const int32_t *src = out + 1 + 75 * c;
        memmove(d + 1, src, 75 * sizeof *d);
        d[0] = bos;
        d[76] = last;
        if (pad != t->eos) {
            if (d[75] != t->eos && d[75] != pad) d[76] = t->eos;
            if (d[1] == pad) d[1] = t->eos;
        }
    }
}
