/* The CLIP tokenizer's core (vm/text/clip_bpe.c, ftfy.c, text_file.c)
 * without Lua: strict UTF-8 checking, merges applied by rank, the vocabulary
 * CLIP builds from a bpe file, tokenizer.json's structure checked, frames and
 * kohya-ss chunks at their edges, ftfy's fixes, random text (every plane,
 * control characters, special tokens) that must tokenize without fault into
 * tokens that spell the text's cleaned form back, and hostile files made
 * here (gzip bombs, lying sizes, long JSON): every buffer charged to the
 * guard before it is made and given back, every size checked against its cap
 * first, and the work polled so that a stop ends it. The token-for-token
 * comparison with transformers is tests/lua/test_tokenizer.lua. */
#include "check.h"

#include "text/clip_bpe.h"
#include "text/ftfy.h"
#include "text/text_file.h"

#include <zlib.h>

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* a guard that counts what is taken and given, refuses past limit (0:
 * none), and says stop at its stop_after-th poll (0: never) */
typedef struct counting {
    size_t taken, given, limit, largest;
    long long polls, work, stop_after;
} counting;

static int c_take(void *ud, size_t n, const char *what, char *err, size_t errlen)
{
    counting *c = ud;
    if (c->limit && c->taken - c->given + n > c->limit) {
        snprintf(err, errlen, "%s would pass the test's limit", what);
        return -1;
    }
    c->taken += n;
    if (n > c->largest) c->largest = n;
    return 0;
}

static void c_give(void *ud, size_t n) { ((counting *)ud)->given += n; }

static int c_poll(void *ud, long long work)
{
    counting *c = ud;
    c->polls++;
    c->work += work;
    return c->stop_after && c->polls >= c->stop_after;
}

static ck_text_guard guard_of(counting *c) { return (ck_text_guard){c_take, c_give, c, c_poll, c}; }

/* a gzip member of the n bytes at s, into a malloc'd buffer (*outn bytes) */
static unsigned char *gzip_of(const void *s, size_t n, size_t *outn)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY) != Z_OK) return NULL;
    size_t cap = deflateBound(&z, (uLong)n) + 64;
    unsigned char *out = malloc(cap);
    z.next_in = (unsigned char *)s;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    int rc = deflate(&z, Z_FINISH);
    *outn = cap - z.avail_out;
    deflateEnd(&z);
    if (rc != Z_STREAM_END) {
        free(out);
        return NULL;
    }
    return out;
}

/* the UTF-32 of the UTF-8 string s into out; the count */
static size_t u32(const char *s, UChar32 *out)
{
    size_t k = 0, n = strlen(s);
    for (size_t i = 0; i < n;) {
        unsigned c = (unsigned char)s[i];
        int l = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        UChar32 cp = l == 1 ? (UChar32)c : (UChar32)(c & (0x3Fu >> (l - 1)));
        for (int j = 1; j < l; j++) cp = (cp << 6) | (s[i + j] & 0x3F);
        out[k++] = cp;
        i += (size_t)l;
    }
    return k;
}

/* ftfy's fix_text of the UTF-8 string in equals want */
static int fixes_to(ck_ftfy_scratch *fs, const char *in, const char *want)
{
    UChar32 a[512], b[512];
    size_t na = u32(in, a), nb = u32(want, b), ng;
    const UChar32 *g = ck_ftfy_fix_text(a, na, fs, &ng, NULL, NULL);
    return g && ng == nb && !memcmp(g, b, nb * sizeof *b);
}

static uint32_t rng = 2463534242u;
static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

/* the slow tokenizer's merge loop as it reads, on strings: the lowest-ranked
 * adjacent pair, every occurrence merged left to right, again until none is
 * ranked; the symbols joined by spaces into out */
static void bpe_reference(char merges[][2][64], int nm, const char *word, char *out)
{
    char sym[256][128];
    int ns = 0, n = (int)strlen(word);
    for (int i = 0; i < n; i++) snprintf(sym[ns++], sizeof sym[0], "%c%s", word[i], i == n - 1 ? "</w>" : "");
    for (;;) {
        int best = nm, at = -1;
        for (int i = 0; i + 1 < ns; i++)
            for (int r = 0; r < best; r++)
                if (!strcmp(sym[i], merges[r][0]) && !strcmp(sym[i + 1], merges[r][1])) best = r, at = i;
        if (at < 0) break;
        int k = 0;
        for (int i = 0; i < ns;) {
            if (i + 1 < ns && !strcmp(sym[i], merges[best][0]) && !strcmp(sym[i + 1], merges[best][1])) {
                char joined[128];
                snprintf(joined, sizeof joined, "%s%s", sym[i], sym[i + 1]);
                strcpy(sym[k++], joined);
                i += 2;
            } else {
                if (k != i) memmove(sym[k], sym[i], sizeof sym[0]);
                k++, i++;
            }
        }
        ns = k;
    }
    out[0] = 0;
    for (int i = 0; i < ns; i++) strcat(strcat(out, sym[i]), " ");
}

/* the heap merges give what the slow tokenizer's loop gives, for merge
 * tables whose ranks come in any order (a pair of merged symbols ranked
 * before its parts' merges) */
static void merges_as_the_slow_loop(void)
{
    int bad = 0, words = 0;
    for (int table = 0; table < 40 && !bad; table++) {
        static char merges[64][2][64];
        static char pool[128][64];
        char text[8192];
        int np = 0, nm = 0;
        for (const char *c = "abc"; *c; c++) {
            snprintf(pool[np++], 64, "%c", *c);
            snprintf(pool[np++], 64, "%c</w>", *c);
        }
        while (nm < 40) {
            const char *a = pool[next_rand() % np], *b = pool[next_rand() % np];
            size_t la = strlen(a), lb = strlen(b);
            if (strstr(a, "</w>") || la + lb > 40) continue;
            int dup = 0;
            for (int r = 0; r < nm; r++) dup |= !strcmp(merges[r][0], a) && !strcmp(merges[r][1], b);
            if (dup) continue;
            memcpy(merges[nm][0], a, la + 1);
            memcpy(merges[nm][1], b, lb + 1);
            memcpy(pool[np], a, la);
            memcpy(pool[np++] + la, b, lb + 1);
            nm++;
        }
        for (int i = nm - 1; i > 0; i--) { /* ranks shuffled */
            int j = (int)(next_rand() % (uint32_t)(i + 1));
            char tmp[2][64];
            memcpy(tmp, merges[i], sizeof tmp), memcpy(merges[i], merges[j], sizeof tmp), memcpy(merges[j], tmp, sizeof tmp);
        }
        size_t k = (size_t)sprintf(text, "#version: 0.2\n");
        for (int r = 0; r < nm; r++) k += (size_t)snprintf(text + k, sizeof text - k, "%s %s\n", merges[r][0], merges[r][1]);
        char err[256];
        ck_clip_bpe *t = ck_clip_bpe_from_merges(text, k, NULL, err, sizeof err);
        if (!t) {
            bad = 1;
            break;
        }
        ck_clip_scratch sc;
        memset(&sc, 0, sizeof sc);
        for (int it = 0; it < 100 && !bad; it++, words++) {
            char word[64], want[8192];
            int n = 1 + (int)(next_rand() % 40);
            for (int i = 0; i < n; i++) word[i] = "abc"[next_rand() % 3];
            word[n] = 0;
            bpe_reference(merges, nm, word, want);
            got g = run(t, word, &sc);
            if (strcmp(g.text, want)) {
                printf("  table %d, word %s: got %s, want %s\n", table, word, g.text, want);
                bad = 2;
            }
        }
        ck_clip_scratch_free(&sc);
        ck_clip_bpe_free(t);
    }
    check("merges: a heap of pairs gives the slow tokenizer's loop, 4000 words under 40 merge tables ranked in any order",
          !bad && words == 4000, bad);
}

/* tokenizer.json: its structure checked before its tables are trusted */
static void tokenizer_json(void)
{
    char err[256];
    static const char vocab[] =
        "{\"c\": 0, \"a\": 1, \"t</w>\": 2, \"ca\": 3, \"cat</w>\": 4, \"<|startoftext|>\": 5, \"<|endoftext|>\": 6}";
    char text[1024];
    snprintf(text, sizeof text,
             "{\"added_tokens\": [{\"id\": 6, \"content\": \"<|endoftext|>\", \"special\": true}, {\"id\": 9, \"content\": "
             "\"<|pad|>\"}], \"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"continuing_subword_prefix\": "
             "\"\", \"vocab\": %s, \"merges\": [[\"c\", \"a\"], \"ca t</w>\"]}}",
             vocab);
    json_t *j = ck_text_json(text, strlen(text), NULL, NULL, err, sizeof err);
    ck_clip_bpe *t = j ? ck_clip_bpe_from_tokenizer_json(j, NULL, err, sizeof err) : NULL;
    json_decref(j);
    check("tokenizer.json: loads (merges as [\"a\", \"b\"] and as \"a b\")", t != NULL, 0);
    if (!t) {
        printf("  %s\n", err);
        return;
    }
    ck_clip_scratch sc;
    memset(&sc, 0, sizeof sc);
    got g = run(t, "cat", &sc);
    check("tokenizer.json: its merges apply in order (cat -> c a t</w> -> ca t</w> -> cat</w>)",
          g.n == 1 && g.ids[0] == 4, g.n);
    check("tokenizer.json: BOS and EOS from its vocab", ck_clip_bpe_bos(t) == 5 && ck_clip_bpe_eos(t) == 6, 0);
    check("tokenizer.json: an added token the vocab lacks joins it with its id", ck_clip_bpe_id(t, "<|pad|>", 7) == 9, 0);
    ck_clip_bpe_free(t);
    ck_clip_scratch_free(&sc);

    const char *bad[][2] = {
        {"[]", "no \"model\" object"},
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", "model.type is \"Unigram\""},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", "end_of_word_suffix is absent"},
        {"{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"@@\", \"vocab\": {}, \"merges\": []}}",
         "end_of_word_suffix is \"@@\""},
        {"{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"continuing_subword_prefix\": \"##\", "
         "\"vocab\": {}, \"merges\": []}}",
         "continuing_subword_prefix"},
        {"{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"vocab\": {}, \"merges\": {}}}",
         "model.merges is not a list"},
        {"{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"vocab\": [], \"merges\": []}}",
         "model.vocab is not an object"},
        {"{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"vocab\": {\"a\": -4}, \"merges\": []}}",
         "the id of \"a\""},
        {"{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b c\"]}}",
         "model.merges[0] is neither"},
        {"{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"vocab\": {\"a\": 0}, \"merges\": [\"ab\", 3]}}",
         "model.merges[0] is neither"},
        {"{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\", \"b c\"]]}}",
         "model.merges[0] is neither"},
        {"{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]}}",
         "model.merges[0] is neither"},
        {"{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
         "\"added_tokens\": [{\"id\": 3, \"content\": \"a\"}]}",
         "added token \"a\" has id 3, its vocab entry 0"},
        {"{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"vocab\": {}, \"merges\": []}, "
         "\"added_tokens\": [{\"content\": \"a\"}]}",
         "added_tokens[0] is not"},
        {"{\"model\": {\"type\": \"BPE\", \"end_of_word_suffix\": \"</w>\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
         "has no <|startoftext|>"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char what[200];
        snprintf(what, sizeof what, "tokenizer.json refused: %s", bad[i][1]);
        j = ck_text_json(bad[i][0], strlen(bad[i][0]), NULL, NULL, err, sizeof err);
        t = j ? ck_clip_bpe_from_tokenizer_json(j, NULL, err, sizeof err) : NULL;
        json_decref(j);
        check(what, !t && strstr(err, bad[i][1]) && !strchr(err, '\n'), 0);
        if (t || !strstr(err, bad[i][1])) printf("  got: %s\n", t ? "(loaded)" : err);
        ck_clip_bpe_free(t);
    }
}

/* ftfy's fix_text: its documented examples and each step once */
static void ftfy_fixes(void)
{
    ck_ftfy_scratch fs;
    memset(&fs, 0, sizeof fs);
    static const char *const cases[][3] = {
        {"mojibake: UTF-8 read as Windows-1252", "\xC3\xA2\xC5\x93\xE2\x80\x9D No problems", "\xE2\x9C\x94 No problems"},
        {"mojibake under HTML entities, as C1 controls", "&macr;\\_(\xC3\xA3\xC2\x83\xC2\x84)_/&macr;",
         "\xC2\xAF\\_(\xE3\x83\x84)_/\xC2\xAF"},
        {"entities, numeric entities, ligatures", "Broken text&hellip; it&#x2019;s \xEF\xAC\x82ubberi\xEF\xAC\x81" "c!",
         "Broken text\xE2\x80\xA6 it's flubberific!"},
        {"fullwidth letters and the ideographic space", "\xEF\xBC\xAC\xEF\xBC\xAF\xE3\x80\x80\xEF\xBC\xAE", "LO N"},
        {"a no-break space a Windows program made a space", "voil\xC3\x83 le travail", "voil\xC3\xA0 le travail"},
        {"mojibake of a curly quote, uncurled", "don\xC3\xA2\xE2\x82\xAC\xE2\x84\xA2t", "don't"},
        {"no entities unescaped in a line with '<'", "<b>&amp;</b>", "<b>&amp;</b>"},
        {"nor in any line after it", "a &amp;\n<b>&amp;</b>\n&amp;", "a &\n<b>&amp;</b>\n&amp;"},
        {"one level of entities a pass, passes until nothing changes", "&amp;amp;", "&"},
        {"halfwidth katakana and its voiced mark, composed by NFC", "\xEF\xBD\xB6\xEF\xBE\x9E", "\xE3\x82\xAC"},
        {"terminal escapes", "\x1B[31mred\x1B[0m", "red"},
        {"line breaks", "a\r\nb\rc\xE2\x80\xA8" "d", "a\nb\nc\nd"},
        {"a BOM goes, a zero-width space stays", "zero\xE2\x80\x8Bwidth\xEF\xBB\xBF", "zero\xE2\x80\x8Bwidth"},
        {"C1 controls as Windows-1252", "\xC2\x93hi\xC2\x94", "\"hi\""},
        {"a numeric entity for ';' is kept", "&#59; &#x3b;", "&#59; &#x3b;"},
        {"an upper-cased entity", "&EACUTE;", "\xC3\x89"},
        {"mojibake inside good text", "caf\xC3\xA9 na\xC3\x83\xC2\xAFve \xF0\x9F\x99\x82", "caf\xC3\xA9 na\xC3\xAFve \xF0\x9F\x99\x82"},
        {"a numeric entity in the C1 range", "&#128;", "\xE2\x82\xAC"},
        {"good text is left alone", "na\xC3\xAFve caf\xC3\xA9 100\xC2\xB0" "C \xC2\xA3" "5", "na\xC3\xAFve caf\xC3\xA9 100\xC2\xB0" "C \xC2\xA3" "5"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char what[160];
        snprintf(what, sizeof what, "ftfy: %s", cases[i][0]);
        check(what, fixes_to(&fs, cases[i][1], cases[i][2]), 0);
    }
    /* nested entities: a pass each, at most CK_FTFY_MAX_PASSES */
    char deep[512] = "&", want[512] = "&";
    for (int i = 0; i < 20; i++) strcat(deep, "amp;");
    check("ftfy: entities nested 20 deep come undone", fixes_to(&fs, deep, "&"), 0);
    for (int i = 20; i < 41; i++) strcat(deep, "amp;");
    for (int i = CK_FTFY_MAX_PASSES; i < 41; i++) strcat(want, "amp;");
    check("ftfy: nested 41 deep, a line keeps its 32nd pass (the work stays linear)", fixes_to(&fs, deep, want), 0);
    UChar32 bad[4] = {0xC3, 0xA9};
    check("ftfy: the badness heuristic finds 'Ã©' bad and 'é' good",
          ck_ftfy_is_bad(bad, 2) && (bad[0] = 0xE9, !ck_ftfy_is_bad(bad, 1)), 0);
    ck_ftfy_scratch_free(&fs);
}

/* a text of n merges "aN bN" after a header, N counting up */
static char *many_merges(int n, size_t *len)
{
    char *s = malloc((size_t)n * 24 + 16);
    size_t k = (size_t)sprintf(s, "#version: 0.2\n");
    for (int i = 0; i < n; i++) k += (size_t)sprintf(s + k, "a%d b%d\n", i, i);
    *len = k;
    return s;
}

/* what building a tokenizer takes from its guard, and how it stops */
static void guards(void)
{
    char err[256];
    size_t len;
    char *text = many_merges(20000, &len);
    counting c = {0};
    ck_text_guard g = guard_of(&c);
    ck_clip_bpe *t = ck_clip_bpe_from_merges(text, len, &g, err, sizeof err);
    check("guard: the tables of 20000 merges are charged while the tokenizer lives",
          t && c.taken > 20000 * 16 && c.given < c.taken, (double)c.taken);
    check("guard: building them polls", c.polls >= 4 && c.work >= 16384, (double)c.polls);
    ck_clip_bpe_free(t);
    check("guard: freeing the tokenizer gives every byte back", c.given == c.taken, (double)(c.taken - c.given));

    counting lim = {.limit = 200 << 10};
    g = guard_of(&lim);
    t = ck_clip_bpe_from_merges(text, len, &g, err, sizeof err);
    check("guard: a refused charge fails the build with the guard's message, and nothing stays charged",
          !t && strstr(err, "would pass the test's limit") && lim.given == lim.taken, 0);
    ck_clip_bpe_free(t);

    counting stop = {.stop_after = 2};
    g = guard_of(&stop);
    t = ck_clip_bpe_from_merges(text, len, &g, err, sizeof err);
    check("guard: a poll that says stop ends the build at once, nothing kept", !t && !strcmp(err, CK_TEXT_STOPPED) &&
          stop.polls == 2 && stop.given == stop.taken, (double)stop.polls);
    ck_clip_bpe_free(t);
    free(text);

    /* vocab.json of 50000 entries: its parse and its table poll too */
    size_t vcap = 50000 * 24 + 64, vk = 0;
    char *vocab = malloc(vcap);
    vk += (size_t)sprintf(vocab, "{\"<|startoftext|>\": 0, \"<|endoftext|>\": 1");
    for (int i = 0; i < 50000; i++) vk += (size_t)sprintf(vocab + vk, ", \"tok%d\": %d", i, i + 2);
    vk += (size_t)sprintf(vocab + vk, "}");
    counting p = {0};
    g = guard_of(&p);
    t = ck_clip_bpe_from_files(vocab, vk, "#v\n", 3, &g, err, sizeof err);
    check("guard: a 50000-entry vocab.json loads, its parse and table polled", t && p.polls > 10, (double)p.polls);
    ck_clip_bpe_free(t);
    check("guard: and gives back what it took", p.taken == p.given, 0);
    counting ps = {.stop_after = 3};
    g = guard_of(&ps);
    t = ck_clip_bpe_from_files(vocab, vk, "#v\n", 3, &g, err, sizeof err);
    check("guard: a stop during vocab.json's parse ends it", !t && !strcmp(err, CK_TEXT_STOPPED) && ps.polls == 3,
          (double)ps.polls);
    free(vocab);
}

/* hostile files made here: the sizes they declare checked first, their
 * buffers charged, their work polled */
static void hostile_files(void)
{
    char err[256];
    const size_t cap = 1 << 20;
    /* 16 MiB of zeros: 16 KiB compressed */
    size_t zn = 16 << 20, gn;
    char *zeros = calloc(1, zn);
    unsigned char *gz = gzip_of(zeros, zn, &gn);
    free(zeros);
    check("gzip: a 16 MiB bomb made", gz && gn < 65536, (double)gn);
    if (!gz) return;

    counting c = {0};
    ck_text_guard g = guard_of(&c);
    ck_text_buf out = {0};
    int rc = ck_text_gunzip((char *)gz, gn, cap, &g, &out, err, sizeof err);
    check("gzip: a member declaring more than the cap is refused before anything is allocated",
          rc && strstr(err, "declares 16777216 bytes") && c.taken == 0, (double)c.taken);
    ck_text_buf_free(&g, &out);

    /* the same with its size lying (100 bytes): stopped at the cap, every byte charged first */
    gz[gn - 4] = 100, gz[gn - 3] = gz[gn - 2] = gz[gn - 1] = 0;
    c = (counting){0};
    rc = ck_text_gunzip((char *)gz, gn, cap, &g, &out, err, sizeof err);
    check("gzip: a bomb that lies about its size stops at the cap", rc && strstr(err, "more than the 1 MiB") &&
          c.taken <= cap + 1 && out.charged == c.taken - c.given, (double)c.taken);
    ck_text_buf_free(&g, &out);
    check("gzip: and gives back what it took", c.taken == c.given, 0);

    c = (counting){.stop_after = 3};
    rc = ck_text_gunzip((char *)gz, gn, 64 << 20, &g, &out, err, sizeof err);
    check("gzip: inflating polls a piece at a time and a stop ends it", rc && !strcmp(err, CK_TEXT_STOPPED) &&
          c.polls == 3 && out.charged <= (4 << 20) + 1, (double)out.charged);
    ck_text_buf_free(&g, &out);

    counting lim = {.limit = 512 << 10};
    g = guard_of(&lim);
    rc = ck_text_gunzip((char *)gz, gn, 64 << 20, &g, &out, err, sizeof err);
    check("gzip: its growth is charged, and a refusal ends it", rc && strstr(err, "would pass the test's limit"), 0);
    ck_text_buf_free(&g, &out);
    free(gz);

    /* two members read as one text; a cut one refused; one made of zeros */
    size_t n1, n2;
    unsigned char *m1 = gzip_of("#version 0.2\n", 13, &n1), *m2 = gzip_of("a b\n", 4, &n2);
    unsigned char *both = malloc(n1 + n2 + 8);
    memcpy(both, m1, n1);
    memcpy(both + n1, m2, n2);
    memset(both + n1 + n2, 0, 8);
    rc = ck_text_gunzip((char *)both, n1 + n2 + 8, cap, NULL, &out, err, sizeof err);
    check("gzip: two members (and zeros after) are one text", !rc && out.len == 17 && !memcmp(out.p, "#version 0.2\na b\n", 17), 0);
    ck_text_buf_free(NULL, &out);
    rc = ck_text_gunzip((char *)both, n1 - 5, cap, NULL, &out, err, sizeof err);
    check("gzip: a member cut short is refused", rc && strstr(err, "not a valid gzip file"), 0);
    ck_text_buf_free(NULL, &out);
    memset(both + 10, 0xFF, 8);
    rc = ck_text_gunzip((char *)both, n1, cap, NULL, &out, err, sizeof err);
    check("gzip: corrupt data is refused", rc && strstr(err, "not a valid gzip file"), 0);
    ck_text_buf_free(NULL, &out);
    free(m1), free(m2), free(both);

    /* a file over the cap is refused before a byte is charged; a directory is no file */
    char path[] = "/tmp/ck_test_clip_bpeXXXXXX";
    int fd = mkstemp(path);
    if (fd >= 0) {
        unlink(path);
        if (ftruncate(fd, (off_t)(3 << 20)) == 0) {
            c = (counting){0};
            g = guard_of(&c);
            rc = ck_text_read_fd(fd, cap, &g, &out, err, sizeof err);
            check("file: a file larger than the cap is refused before anything is charged",
                  rc && strstr(err, "3145728 bytes") && c.taken == 0, 0);
            ck_text_buf_free(&g, &out);
            rc = ck_text_read_fd(fd, 8 << 20, &g, &out, err, sizeof err);
            check("file: one within it is read a MiB at a time, charged first", !rc && out.len == (3 << 20) &&
                  c.polls == 3 && c.taken == (3 << 20) + 1, (double)c.polls);
            ck_text_buf_free(&g, &out);
        }
        close(fd);
    }
    fd = open("/tmp", O_RDONLY | O_DIRECTORY);
    rc = ck_text_read_fd(fd, cap, NULL, &out, err, sizeof err);
    check("file: a directory is not a regular file", rc && strstr(err, "not a regular file"), 0);
    close(fd);

    /* JSON nested a million deep, and 2 MiB of one string: refused or parsed, never a crash */
    size_t dn = 1 << 20;
    char *deep = malloc(dn);
    memset(deep, '[', dn);
    json_t *j = ck_text_json(deep, dn, NULL, NULL, err, sizeof err);
    check("json: a million nested lists are refused", !j && strstr(err, "line 1"), 0);
    json_decref(j);
    memcpy(deep, "{\"k\": \"", 7);
    memset(deep + 7, 'a', dn - 9);
    memcpy(deep + dn - 2, "\"}", 2);
    counting jc = {0};
    g = guard_of(&jc);
    j = ck_text_json(deep, dn, &g, NULL, err, sizeof err);
    check("json: a 1 MiB string parses, polled every 64 KiB",
          j && json_string_length(json_object_get(j, "k")) == dn - 9 && jc.polls >= 14, (double)jc.polls);
    json_decref(j);
    free(deep);
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
    ck_clip_bpe *t = ck_clip_bpe_from_merges(BPE, sizeof BPE - 1, NULL, err, sizeof err);
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

    /* random text: no fault, and the tokens spell the cleaned text back, with either caption fix */
    int bad = 0;
    polled = 0;
    for (int it = 0; it < 3000 && !bad; it++) {
        ck_clip_bpe_set_fix(t, it & 1 ? CK_CLIP_FIX_NONE : CK_CLIP_FIX_FTFY);
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
            const char *c = ck_clip_clean(s, k, ck_clip_bpe_fix(t), &sc, &cl, NULL, NULL);
            char want[8192], back[65536];
            /* less U+0345 too, which CLIP's pattern matches by no alternative */
            for (size_t i = 0; c && i < cl; i++) {
                if (i + 1 < cl && (unsigned char)c[i] == 0xCD && (unsigned char)c[i + 1] == 0x85) i++;
                else if (c[i] != ' ') want[m++] = c[i];
            }
            size_t nb = decode_tokens(&g, back);
            if (!c || nb != m || memcmp(back, want, m)) bad = 3;
        }
    }
    check("random text over every plane, both caption fixes: tokenizes, every id in the vocabulary, the tokens spell "
          "the cleaned text", !bad, bad);
    check("random text: the work was polled", polled > 0, (double)polled);

    const char *bad_files[][2] = {
        {"header only\n", "no merges"},
        {"h\na b c\n", "merges line 2 is not two tokens"},
        {"h\na b\n\nc d\n", "merges line 3 is not two tokens"},
    };
    for (int i = 0; i < 3; i++) {
        ck_clip_bpe *b = ck_clip_bpe_from_merges(bad_files[i][0], strlen(bad_files[i][0]), NULL, err, sizeof err);
        check(bad_files[i][1], !b && strstr(err, bad_files[i][1]), 0);
        ck_clip_bpe_free(b);
    }
    ck_clip_bpe *v = ck_clip_bpe_from_files("{\"a\": 0, \"a\": 1}", 16, "#v\n", 3, NULL, err, sizeof err);
    check("vocab.json: a token twice is refused", !v && strstr(err, "vocab.json"), 0);
    ck_clip_bpe_free(v);

    ck_clip_bpe_free(t);
    ck_clip_scratch_free(&sc);
    merges_as_the_slow_loop();
    tokenizer_json();
    ftfy_fixes();
    guards();
    hostile_files();
    return checks_done();
}
