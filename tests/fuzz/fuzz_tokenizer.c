/* libFuzzer harness for the tokenizer's file readers (vm/text/text_file.c,
 * clip_bpe.c) and its caption cleanup (ftfy.c). The first byte picks the
 * reader and its guard: gzip, vocab.json + merges.txt (split at the first
 * NUL), tokenizer.json, a bpe merges text, or a caption (tokenized with both
 * fixes by a small fixed tokenizer); the guard refuses past a limit or says
 * stop at a poll, as the input's second byte asks. Invariants: a refusal has
 * a one-line message; every byte charged is given back when the reader
 * fails or the tokenizer is freed; nothing decompressed passes the cap; a
 * loaded tokenizer tokenizes text (the input's tail and fixed strings) into
 * ids that its vocabulary gives for the tokens emitted. */
#include "text/clip_bpe.h"
#include "text/ftfy.h"
#include "text/text_file.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GZ_CAP ((size_t)1 << 20)

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_tokenizer: invariant broken: %s\n", what);
        abort();
    }
}

typedef struct counting {
    size_t taken, given, limit;
    long long polls, stop_after;
} counting;

static int c_take(void *ud, size_t n, const char *what, char *err, size_t errlen)
{
    counting *c = ud;
    if (c->limit && c->taken - c->given + n > c->limit) {
        snprintf(err, errlen, "%s would pass the limit", what);
        return -1;
    }
    c->taken += n;
    return 0;
}

static void c_give(void *ud, size_t n) { ((counting *)ud)->given += n; }

static int c_poll(void *ud, long long work)
{
    counting *c = ud;
    (void)work;
    return c->stop_after && ++c->polls >= c->stop_after;
}

typedef struct seen {
    const ck_clip_bpe *t;
    size_t n;
} seen;

static int emit(void *ud, int32_t id, const char *tok, size_t n)
{
    seen *s = ud;
    check(n > 0, "a token has bytes");
    int32_t want = ck_clip_bpe_id(s->t, tok, n);
    /* a symbol the vocabulary lacks becomes the unknown token (EOS) */
    check(id == (want >= 0 ? want : ck_clip_bpe_eos(s->t)) || id == ck_clip_bpe_bos(s->t) || id == ck_clip_bpe_eos(s->t),
          "an id is the vocabulary's for its token");
    return ++s->n > 4096;
}

static void tokenize_with(ck_clip_bpe *t, const char *text, size_t n)
{
    if (ck_clip_utf8_check(text, n) != n) return;
    ck_clip_scratch sc;
    memset(&sc, 0, sizeof sc);
    for (int fix = 0; fix < 2; fix++) {
        ck_clip_bpe_set_fix(t, fix ? CK_CLIP_FIX_NONE : CK_CLIP_FIX_FTFY);
        seen s = {t, 0};
        check(ck_clip_bpe_run(t, text, n, &sc, emit, &s, NULL, NULL) == 0, "tokenizing succeeds");
        size_t cl;
        const char *c = ck_clip_clean(text, n, ck_clip_bpe_fix(t), &sc, &cl, NULL, NULL);
        check(c && ck_clip_utf8_check(c, cl) == cl, "the cleaned text is valid UTF-8");
    }
    ck_clip_scratch_free(&sc);
}

static void tokenize(ck_clip_bpe *t, const char *tail, size_t n)
{
    static const char *const fixed[] = {"a photo of a cat", "caf\xC3\x83\xC2\xA9 &amp; \xE2\x80\x9Cquotes\xE2\x80\x9D",
                                        "<|startoftext|>x<|endoftext|>!", "\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x99\x82"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) tokenize_with(t, fixed[i], strlen(fixed[i]));
    tokenize_with(t, tail, n);
}

/* a tokenizer to clean captions with: CLIP's vocabulary of bytes and a few merges */
static ck_clip_bpe *small(void)
{
    static const char merges[] = "#version: 0.2\nc a\nca t</w>\na a\nd o\ndo g</w>\n";
    char err[256];
    return ck_clip_bpe_from_merges(merges, sizeof merges - 1, NULL, err, sizeof err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    int mode = data[0] % 5, how = data[1];
    const char *in = (const char *)data + 2;
    size_t n = size - 2;
    counting c = {0};
    if (how & 0x80) c.limit = (size_t)(how & 0x7F) << 12; /* 0 .. 508 KiB */
    else if (how & 0x40) c.stop_after = how & 0x3F;
    ck_text_guard g = {c_take, c_give, &c, c_poll, &c};
    char err[512] = "";
    ck_clip_bpe *t = NULL;
    if (mode == 0) {
        ck_text_buf out = {0};
        int rc = ck_text_gunzip(in, n, GZ_CAP, &g, &out, err, sizeof err);
        check(rc == 0 || (err[0] && !strchr(err, '\n')), "a refused gzip file has a one-line message");
        check(out.charged <= GZ_CAP + 1 && out.charged == c.taken - c.given, "decompressing stays within the cap, charged");
        if (rc == 0) {
            check(out.len <= GZ_CAP && out.p[out.len] == 0, "the text is within the cap and terminated");
            t = ck_clip_bpe_from_merges(out.p, out.len, &g, err, sizeof err);
        }
        ck_text_buf_free(&g, &out);
    } else if (mode == 1) {
        const char *nul = memchr(in, 0, n);
        size_t vn = nul ? (size_t)(nul - in) : n;
        const char *m = nul ? nul + 1 : "";
        size_t mn = nul ? n - vn - 1 : 0;
        t = ck_clip_bpe_from_files(in, vn, m, mn, &g, err, sizeof err);
    } else if (mode == 2) {
        json_t *j = ck_text_json(in, n, &g, NULL, err, sizeof err);
        check(j || (err[0] && !strchr(err, '\n')), "refused JSON has a one-line message");
        if (j) t = ck_clip_bpe_from_tokenizer_json(j, &g, err, sizeof err);
        json_decref(j);
    } else if (mode == 3) {
        t = ck_clip_bpe_from_merges(in, n, &g, err, sizeof err);
    } else {
        ck_clip_bpe *s = small();
        check(s != NULL, "the small tokenizer loads");
        tokenize_with(s, in, n);
        ck_clip_bpe_free(s);
        return 0;
    }
    if (getenv("CK_FUZZ_VERBOSE")) fprintf(stderr, "mode %d: %s\n", mode, t ? "loaded" : err);
    check(t || (err[0] && !strchr(err, '\n')), "a refused file has a one-line message");
    check(t || c.taken == c.given, "a refused file keeps nothing charged");
    if (t) {
        /* the text after the files: what the vocabulary's own tokens spell */
        tokenize(t, in, n < 256 ? n : 256);
        ck_clip_bpe_free(t);
    }
    check(c.taken == c.given, "a freed tokenizer gives every byte back");
    return 0;
}
