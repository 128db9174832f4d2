/* libFuzzer harness for ckrun's sentencepiece model reader
 * (vm/text/spm_model.h) and what stands on it: every input is a model file.
 * A refusal must be one line, and give back every byte it charged. A model
 * that reads has every piece inside the input and valid; its character map,
 * when it checks, is looked up with keys cut from the input, every answer
 * inside the map. A model the T5 tokenizer accepts is written for
 * libsentencepiece, which ckrun's reader must accept and the library must
 * load, and captions (fixed ones and the input's last bytes) go through the
 * whole pipeline and the library's search. Under AddressSanitizer a check
 * that let a bad offset through reads out of bounds. */
#include "text/spm_model.h"
#include "text/spm_shim.h"
#include "text/spm_tok.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_spm: invariant broken: %s\n", what);
        abort();
    }
}

/* charges counted: what is taken must all come back; large takes refused,
 * as a memory limit would */
static size_t charged;

static int take(void *ud, size_t n, const char *what, char *err, size_t errlen)
{
    (void)ud;
    if (n > ((size_t)256 << 20)) {
        snprintf(err, errlen, "%s would pass the memory limit", what);
        return -1;
    }
    charged += n;
    return 0;
}

static void give(void *ud, size_t n)
{
    (void)ud;
    check(n <= charged, "gives back no more than was taken");
    charged -= n;
}

static const ck_spm_charge charge = {take, give, NULL};

static long long polled;
static void poll(void *ud, long long work)
{
    (void)ud;
    polled += work;
}

static void one_line(const char *err)
{
    check(err[0] != 0, "a refusal says why");
    check(strchr(err, '\n') == NULL, "a refusal is one line");
}

typedef struct ctx {
    const ck_spmp *lib;
    int ntok;
    size_t ids;
} ctx;

static int on_special(void *ud, int32_t id)
{
    ctx *c = ud;
    check(id >= 0 && id < c->ntok, "a special token's id is in the vocabulary");
    c->ids++;
    return 0;
}

static int on_ids(void *ud, const int *ids, size_t n)
{
    ctx *c = ud;
    for (size_t i = 0; i < n; i++) check(ids[i] >= 0 && ids[i] <= c->ntok, "the library's ids are the written model's");
    c->ids += n;
    return 0;
}

static int on_piece(void *ud, const char *s, size_t n)
{
    ctx *c = ud;
    check(n >= 3 && memcmp(s, "\xE2\x96\x81", 3) == 0, "every piece for the model starts with U+2581");
    check(ck_spm_utf8_check((const uint8_t *)s, n) == n, "every piece for the model is valid UTF-8");
    char err[256];
    const int rc = ck_spmp_encode(c->lib, s, n, on_ids, c, err, sizeof err);
    check(rc == 0, "the library segments every piece");
    return 0;
}

static void through_the_pipeline(const ck_spm_tok *t, const uint8_t *data, size_t size)
{
    const size_t plen = ck_spm_tok_proto(t, NULL, 0);
    uint8_t *proto = malloc(plen);
    check(proto && ck_spm_tok_proto(t, proto, plen) == plen, "the written model has the size counted");
    ck_spm_model back;
    char err[512];
    check(ck_spm_model_read(&back, proto, plen, NULL, NULL, NULL, err, sizeof err) == 0, "ckrun reads what it writes");
    check(back.npieces == t->n + 1 && back.pieces[t->unk].type == CK_SPM_UNKNOWN, "the written model holds the vocabulary");
    ck_spm_model_free(&back);
    ck_spmp *lib = ck_spmp_load(proto, plen, err, sizeof err);
    free(proto);
    check(lib != NULL, "libsentencepiece loads what ckrun writes");

    static const char *const caps[] = {
        "a cat sitting on a sofa", "\xEF\xBC\xA1\xCC\x81 A\xE3\x80\x80 b\xE2\x80\x8B\xC2\x85", "<extra_id_0></s>x<pad><unk>",
        "\xEF\xAC\x81nance  \t\xE2\x96\x81\xE2\x96\x81 a\xCC\x80\xCC\x81\xCC\x82", "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xE4\xB8\xAD"};
    ck_spm_scratch s;
    memset(&s, 0, sizeof s);
    s.charge = &charge;
    ctx c = {lib, t->n, 0};
    const ck_spm_sink sink = {on_special, on_piece, &c};
    for (size_t i = 0; i < sizeof caps / sizeof *caps; i++)
        check(ck_spm_tok_split(t, caps[i], strlen(caps[i]), &s, &sink, poll, NULL, err, sizeof err) == 0, "a caption splits");
    /* the input's last bytes as a caption, where they are valid UTF-8 */
    const size_t k = size < 64 ? size : 64;
    const uint8_t *tail = data + size - k;
    if (ck_spm_utf8_check(tail, k) == k)
        check(ck_spm_tok_split(t, (const char *)tail, k, &s, &sink, poll, NULL, err, sizeof err) == 0, "the tail splits");
    ck_spm_scratch_free(&s);
    ck_spmp_unref(lib);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ck_spm_model m;
    char err[512] = "";
    charged = 0;
    if (ck_spm_model_read(&m, data, size, &charge, poll, NULL, err, sizeof err)) {
        one_line(err);
        ck_spm_model_free(&m);
        check(charged == 0, "a refused model gives back its charge");
        return 0;
    }
    for (int i = 0; i < m.npieces; i++) {
        const ck_spm_piece *p = &m.pieces[i];
        check(p->len > 0 && p->len <= CK_SPM_MAX_PIECE_BYTES && (size_t)p->off + p->len <= size, "a piece lies in the file");
        check(ck_spm_utf8_check(data + p->off, p->len) == p->len && !memchr(data + p->off, 0, p->len), "a piece is UTF-8 without NUL");
    }
    check(m.charsmap_len == 0 || (m.charsmap >= data && m.charsmap + m.charsmap_len <= data + size), "the map lies in the file");
    ck_spm_charsmap cm;
    if (m.charsmap_len && ck_spm_charsmap_check(&cm, m.charsmap, m.charsmap_len, poll, NULL, err, sizeof err) == 0) {
        /* keys of 1 to 6 bytes from every offset of the input */
        for (size_t i = 0; i < size; i++)
            for (size_t n = 1; n <= 6 && i + n <= size; n++) {
                size_t rl = 0;
                const char *r = ck_spm_charsmap_first(&cm, data + i, n, &rl);
                check(!r || (r >= cm.normalized && r + rl < cm.normalized + cm.nlen), "a replacement lies in the map");
            }
    } else if (m.charsmap_len) {
        one_line(err);
    }
    ck_spm_tok t;
    memset(&t, 0, sizeof t);
    if (ck_spm_tok_from_model(&t, &m, NULL, &charge, poll, NULL, err, sizeof err) == 0) through_the_pipeline(&t, data, size);
    else one_line(err);
    ck_spm_tok_free(&t);
    ck_spm_model_free(&m);
    check(charged == 0, "every charge is given back");
    return 0;
}
