/* The CLIP tokenizer's core (vm/text/clip_bpe.c) without Lua: strict UTF-8
 * checking, merges applied by rank, the vocabulary CLIP builds from a bpe
 * file, frames and kohya-ss chunks at their edges, and random text (every
 * plane, control characters, special tokens) that must tokenize without
 * fault into tokens that spell the text's cleaned form back. The
 * token-for-token comparison with transformers is tests/lua/test_tokenizer.lua. */
#include "check.h"

#include "text/clip_bpe.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* a small bpe file: the header, then merges */
static const char BPE[] = "\"bpe_simple_vocab_16e6.txt#version: 0.2\n"
                          "c a\n"
                          "ca t</w>\n"
                          "a a\n"
                          "aa a</w>\n"
                          "d o\n"
                          "do g</w>\n";

typedef struct got {
    int32_t ids[4096];
    char text[65536];
    size_t n, tlen;
} got;

static int collect(void *ud, int32_t id, const char *tok, size_t n)
{
    got *g = ud;
    if (g->n < 4096) g->ids[g->n++] = id;
    if (g->tlen + n + 1 < sizeof g->text) {
        memcpy(g->text + g->tlen, tok, n);
        g->tlen += n;
        g->text[g->tlen++] = ' '; /* no token holds a space byte */
        g->text[g->tlen] = 0;
    }
    return 0;
}

static long long polled;
static void poll(void *ud, long long work)
{
    (void)ud;
    polled += work;
}

static got run(const ck_clip_bpe *t, const char *s, ck_clip_scratch *sc)
{
    got g;
    memset(&g, 0, sizeof g);
    ck_clip_bpe_run(t, s, strlen(s), sc, collect, &g, poll, NULL);
    return g;
}

/* appends code point c to s as UTF-8 */
static size_t put_utf8(char *s, uint32_t c)
{
    if (c < 0x80) return s[0] = (char)c, 1;
    if (c < 0x800) return s[0] = (char)(0xC0 | (c >> 6)), s[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000)
        return s[0] = (char)(0xE0 | (c >> 12)), s[1] = (char)(0x80 | ((c >> 6) & 0x3F)), s[2] = (char)(0x80 | (c & 0x3F)), 3;
    s[0] = (char)(0xF0 | (c >> 18)), s[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    s[2] = (char)(0x80 | ((c >> 6) & 0x3F)), s[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* the tokens of g (space-separated, "</w>" marking a word's end) decoded
 * back to the bytes they stand for (CLIP's byte table inverted) */
static size_t decode_tokens(const got *g, char *out)
{
    int dec[512];
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        dec[printable ? b : next++] = b;
    }
    size_t k = 0;
    for (size_t i = 0; i < g->tlen;) {
        const unsigned char *p = (const unsigned char *)g->text + i;
        if (*p == ' ') { i++; continue; }
        if (!strncmp((const char *)p, "</w>", 4)) { i += 4; continue; }
        int cp;
        if (*p < 0x80) cp = *p, i += 1;
        else cp = ((p[0] & 0x1F) << 6) | (p[1] & 0x3F), i += 2;
        out[k++] = (char)dec[cp];
    }
    return k;
}

static uint32_t rng = 2463534242u;
static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

int main(void)
{
    char err[256];
    ck_clip_scratch sc;
    memset(&sc, 0, sizeof sc);

    /* UTF-8 */
    check("utf8: valid text passes", ck_clip_utf8_check("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x99\x82", 10) == 10, 0);
    check("utf8: an overlong form is refused at its start", ck_clip_utf8_check("ab\xC0\xAF", 4) == 2, 0);
    check("utf8: a surrogate is refused", ck_clip_utf8_check("\xED\xA0\x80", 3) == 0, 0);
    check("utf8: past U+10FFFF is refused", ck_clip_utf8_check("x\xF4\x90\x80\x80", 5) == 1, 0);
    check("utf8: a cut sequence is refused", ck_clip_utf8_check("xy\xE4\xB8", 4) == 2, 0);
    check("utf8: a stray continuation byte is refused", ck_clip_utf8_check("\x80", 1) == 0, 0);

    /* the vocabulary CLIP builds: 256 bytes, 256 with </w>, 6 merges, 2 specials */
    ck_clip_bpe *t = ck_clip_bpe_from_merges(BPE, sizeof BPE - 1, err, sizeof err);
    check("bpe: loads", t != NULL, 0);
    if (!t) return checks_done();
    check("bpe: 520 entries, BOS 518, EOS 519", ck_clip_bpe_vocab_size(t) == 520 && ck_clip_bpe_bos(t) == 518 &&
                                                   ck_clip_bpe_eos(t) == 519, ck_clip_bpe_vocab_size(t));
    check("bpe: '!' is id 0, 'a' 64, 'a</w>' 320 (the byte table's order)",
          ck_clip_bpe_id(t, "!", 1) == 0 && ck_clip_bpe_id(t, "a", 1) == 64 && ck_clip_bpe_id(t, "a</w>", 5) == 320, 0);
    check("bpe: the merges in order from id 512", ck_clip_bpe_id(t, "ca", 2) == 512 && ck_clip_bpe_id(t, "dog</w>", 7) == 517, 0);
    check("bpe: the space byte is U+0120 'Ġ', id 188 + 32 (after the 188 printable bytes)",
          ck_clip_bpe_id(t, "\xC4\xA0", 2) == 220, ck_clip_bpe_id(t, "\xC4\xA0", 2));

    got g = run(t, "Cat dog", &sc);
    check("merges: 'Cat dog' -> cat</w> dog</w>", !strcmp(g.text, "cat</w> dog</w> "), 0);
    g = run(t, "aaaa", &sc);
    /* a a a a</w>: (a, a) merges at 0-1, then 2-3 is (a, a</w>), which is
     * no merge: aa a a</w>, where neither (aa, a) nor (a, a</w>) is ranked */
    check("merges: 'aaaa' -> aa a a</w> (each occurrence of the best pair, left to right)", !strcmp(g.text, "aa a a</w> "), 0);
    g = run(t, "aaa", &sc);
    check("merges: 'aaa' -> aa a</w> -> aaa</w>", !strcmp(g.text, "aaa</w> "), 0);
    g = run(t, "x<|endoftext|>y", &sc);
    check("specials: split out of the raw text", g.n == 3 && g.ids[1] == 519, g.n);
    g = run(t, "<|ENDOFTEXT|>", &sc);
    check("specials: upper case is lower-cased, then the pattern's special alternative matches it whole",
          g.n == 1 && g.ids[0] == 519, g.n);
    g = run(t, "\xCE\xA3\xCE\x91\xCE\xA3", &sc); /* ΣΑΣ -> σας */
    /* σ = CF 83, α = CE B1, ς = CF 82, each byte its table character */
    check("lower: final sigma (ΣΑΣ -> σας)",
          !strcmp(g.text, "\xC3\x8F \xC4\xA5 \xC3\x8E \xC2\xB1 \xC3\x8F \xC4\xA4</w> "), 0);

    /* frames and chunks */
    int32_t ids[300], out[77 * 4];
    for (int i = 0; i < 300; i++) ids[i] = 7;
    int n = ck_clip_frame(t, ids, 0, 77, 0, out);
    check("frame: empty -> BOS EOS pad...", n == 77 && out[0] == 518 && out[1] == 519 && out[2] == 0 && out[76] == 0, n);
    n = ck_clip_frame(t, ids, 80, 77, 0, out);
    check("frame: 80 ids -> BOS 75 EOS", n == 77 && out[75] == 7 && out[76] == 519, n);
    n = ck_clip_frame(t, ids, 3, 77, -1, out);
    check("frame: no pad -> 5 entries", n == 5 && out[4] == 519, n);
    for (int len = 0; len <= 230; len++) {
        int pads[2] = {519, 0}, ok = 1;
        for (int p = 0; p < 2 && ok; p++) {
            int32_t frame[227];
            ck_clip_frame(t, ids, (size_t)len, 227, pads[p], frame);
            ck_clip_chunks(t, ids, (size_t)len, 3, pads[p], out);
            for (int c = 0; c < 3 && ok; c++) {
                int32_t want[77];
                want[0] = frame[0];
                memcpy(want + 1, frame + 1 + 75 * c, 75 * sizeof *want);
                want[76] = frame[226];
                if (pads[p] != 519) {
                    if (want[75] != 519 && want[75] != pads[p]) want[76] = 519;
                    if (want[1] == pads[p]) want[1] = 519;
                }
                ok = !memcmp(want, out + 77 * c, sizeof want);
            }
        }
        if (!ok || len == 230) {
            check("chunks: 0..230 ids, pad EOS and pad 0, as kohya cuts the 227 frame", ok, len);
            break;
        }
    }

    /* random text: no fault, and the tokens spell the cleaned text back */
    int bad = 0;
    polled = 0;
    for (int it = 0; it < 3000 && !bad; it++) {
        char s[2048];
        size_t k = 0;
        int len = (int)(next_rand() % 200);
        for (int i = 0; i < len; i++) {
            uint32_t r = next_rand(), c;
            switch (r % 8) {
            case 0: c = r >> 8 & 0x7F; break;                      /* ASCII, controls too */
            case 1: c = 0x80 + (r >> 8) % 0x780; break;             /* Latin, Greek, Cyrillic ... */
            case 2: c = 0x3000 + (r >> 8) % 0x7000; break;          /* CJK and around */
            case 3: c = 0x1F300 + (r >> 8) % 0x700; break;          /* emoji */
            case 4: c = (r >> 8) % 0x110000; break;                 /* anywhere */
            case 5: c = " \t\n'sd!,"[(r >> 8) % 9]; break;
            default: c = 'a' + (r >> 8) % 26; break;
            }
            if ((c >= 0xD800 && c <= 0xDFFF) || c == 0 || c > 0x10FFFF) c = 'x';
            if (r % 97 == 0) { memcpy(s + k, "<|endoftext|>", 13); k += 13; continue; }
            k += put_utf8(s + k, c);
        }
        s[k] = 0;
        if (ck_clip_utf8_check(s, k) != k) { bad = 1; break; }
        g = run(t, s, &sc);
        /* every id is in the vocabulary */
        for (size_t i = 0; i < g.n; i++)
            if (g.ids[i] < 0 || g.ids[i] >= ck_clip_bpe_vocab_size(t)) bad = 2;
        /* without special tokens, the tokens spell the cleaned text, less its spaces */
        if (!strstr(s, "<|endoftext|>") && g.tlen + 1 < sizeof g.text) {
            size_t cl, m = 0;
            const char *c = ck_clip_clean(s, k, &sc, &cl);
            char want[8192], back[65536];
            for (size_t i = 0; c && i < cl; i++)
                if (c[i] != ' ') want[m++] = c[i];
            size_t nb = decode_tokens(&g, back);
            if (!c || nb != m || memcmp(back, want, m)) bad = 3;
        }
    }
    check("random text over every plane: tokenizes, every id in the vocabulary, the tokens spell the cleaned text",
          !bad, bad);
    check("random text: the work was polled", polled > 0, (double)polled);

    const char *bad_files[][2] = {
        {"header only\n", "no merges"},
        {"h\na b c\n", "merges line 2 is not two tokens"},
        {"h\na b\n\nc d\n", "merges line 3 is not two tokens"},
    };
    for (int i = 0; i < 3; i++) {
        ck_clip_bpe *b = ck_clip_bpe_from_merges(bad_files[i][0], strlen(bad_files[i][0]), err, sizeof err);
        check(bad_files[i][1], !b && strstr(err, bad_files[i][1]), 0);
        ck_clip_bpe_free(b);
    }
    ck_clip_bpe *v = ck_clip_bpe_from_files("{\"a\": 0, \"a\": 1}", 16, "#v\n", 3, err, sizeof err);
    check("vocab.json: a token twice is refused", !v && strstr(err, "vocab.json"), 0);
    ck_clip_bpe_free(v);

    ck_clip_bpe_free(t);
    ck_clip_scratch_free(&sc);
    return checks_done();
}
