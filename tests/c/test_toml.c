/* The TOML reader (vm/formats/toml_scan.h, vm/formats/toml_shim.h): kohya's
 * config files read into the items they hold, in the text's order; TOML's
 * values as toml++ reads them; hostile texts (deep dotted keys and headers,
 * deep brackets, too many tables, huge, NUL bytes, bad UTF-8, cut short)
 * refused in one line naming the line and column before toml++ builds
 * anything deep; every charge given back, refused charges and stops
 * included. Built twice: against libck, and under ASan and UBSan from the
 * sources (test_toml_asan). */
#include "formats/toml_scan.h"
#include "formats/toml_shim.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failed, passed;

static void ok(int cond, const char *what)
{
    if (cond) passed++;
    else failed++;
    printf("%s %s\n", cond ? "ok  " : "FAIL", what);
}

/* a budget that counts what is taken and refuses past a limit; a poll that
 * stops at its stop_at'th call */
typedef struct acct {
    size_t used, peak, limit;
    int polls, stop_at;
} acct;

static int take(void *ud, size_t n, const char *what, char *err, size_t errlen)
{
    acct *a = ud;
    if (a->limit && a->used + n > a->limit) {
        snprintf(err, errlen, "%s would pass the memory limit", what);
        return -1;
    }
    a->used += n;
    if (a->used > a->peak) a->peak = a->used;
    return 0;
}

static void give(void *ud, size_t n)
{
    acct *a = ud;
    if (n > a->used) {
        printf("FAIL gives back %zu bytes where %zu are taken\n", n, a->used);
        failed++;
        a->used = 0;
        return;
    }
    a->used -= n;
}

static int poll(void *ud, long long work)
{
    acct *a = ud;
    (void)work;
    return a->stop_at && ++a->polls >= a->stop_at;
}

static ck_text_guard guard(acct *a) { return (ck_text_guard){take, give, a, poll, a}; }

/* parses s; rc and the message */
static int parse(const char *s, size_t n, acct *a, ck_toml_doc *d, char *err, size_t errlen)
{
    ck_text_guard g = guard(a);
    err[0] = 0;
    return ck_toml_parse(s, n, &g, d, err, errlen);
}

/* the item at path "key/key/3/key" (array indices 1-based) under items[0], or NULL */
static const ck_toml_item *at(const ck_toml_doc *d, const char *path);

/* the index after item i and all it holds */
static size_t skip(const ck_toml_doc *d, size_t i)
{
    const ck_toml_item *it = &d->items[i];
    size_t j = i + 1;
    if (it->type == CK_TOML_TABLE || it->type == CK_TOML_ARRAY)
        for (uint32_t k = 0; k < it->v.count; k++) j = skip(d, j);
    return j;
}

static const ck_toml_item *at(const ck_toml_doc *d, const char *path)
{
    size_t i = 0;
    char part[64];
    while (*path) {
        const char *slash = strchr(path, '/');
        size_t n = slash ? (size_t)(slash - path) : strlen(path);
        if (n >= sizeof part) return NULL;
        memcpy(part, path, n);
        part[n] = 0;
        path += n + (slash != NULL);
        const ck_toml_item *it = &d->items[i];
        size_t j = i + 1, found = 0;
        int hit = 0;
        for (uint32_t k = 0; k < it->v.count && !hit; k++) {
            const ck_toml_item *c = &d->items[j];
            if (it->type == CK_TOML_TABLE ? (c->klen == n && memcmp(c->key, part, n) == 0) : (int)k + 1 == atoi(part))
                hit = 1, found = j;
            else j = skip(d, j);
        }
        if (!hit) return NULL;
        i = found;
    }
    return &d->items[i];
}

static int is_str(const ck_toml_item *it, const char *s)
{
    return it && (it->type == CK_TOML_STRING || it->type == CK_TOML_DATE) && it->len == strlen(s) &&
           memcmp(it->str, s, it->len) == 0;
}

static int is_int(const ck_toml_item *it, long long v) { return it && it->type == CK_TOML_INTEGER && it->v.i == v; }
static int is_bool(const ck_toml_item *it, int v) { return it && it->type == CK_TOML_BOOLEAN && it->v.b == v; }

/* the first sample of kohya's docs/config_README-en.md (sd-scripts) */
static const char KOHYA[] =
    "[general]\n"
    "shuffle_caption = true\n"
    "caption_extension = '.txt'\n"
    "keep_tokens = 1\n"
    "\n"
    "# This is a DreamBooth-style dataset\n"
    "[[datasets]]\n"
    "resolution = 512\n"
    "batch_size = 4\n"
    "keep_tokens = 2\n"
    "\n"
    "  [[datasets.subsets]]\n"
    "  image_dir = 'C:\\hoge'\n"
    "  class_tokens = 'hoge girl'\n"
    "  # This subset uses keep_tokens = 2 (the value of the parent datasets)\n"
    "\n"
    "  [[datasets.subsets]]\n"
    "  image_dir = 'C:\\fuga'\n"
    "  class_tokens = 'fuga boy'\n"
    "  keep_tokens = 3\n"
    "\n"
    "  [[datasets.subsets]]\n"
    "  is_reg = true\n"
    "  image_dir = 'C:\\reg'\n"
    "  class_tokens = 'human'\n"
    "  keep_tokens = 1\n"
    "\n"
    "# This is a fine-tuning dataset\n"
    "[[datasets]]\n"
    "resolution = [768, 768]\n"
    "batch_size = 2\n"
    "\n"
    "  [[datasets.subsets]]\n"
    "  image_dir = 'C:\\piyo'\n"
    "  metadata_file = 'C:\\piyo\\piyo_md.json'\n"
    "  # This subset uses keep_tokens = 1 (the value of [general])\n";

static void kohya_sample_reads_as_written(void)
{
    acct a = {0};
    ck_toml_doc d;
    char err[512];
    int rc = parse(KOHYA, strlen(KOHYA), &a, &d, err, sizeof err);
    ok(rc == 0, "kohya's sample dataset config parses");
    if (rc) {
        printf("     %s\n", err);
        return;
    }
    ok(d.items[0].type == CK_TOML_TABLE && d.items[0].v.count == 2, "its root holds general and datasets");
    ok(d.items[1].klen == 7 && memcmp(d.items[1].key, "general", 7) == 0 && d.items[1].line == 1,
       "general comes first, at line 1 (the text's order, not toml++'s sorted one)");
    ok(is_bool(at(&d, "general/shuffle_caption"), 1) && is_str(at(&d, "general/caption_extension"), ".txt") &&
           is_int(at(&d, "general/keep_tokens"), 1),
       "general's settings: a boolean, a literal string, an integer");
    const ck_toml_item *ds = at(&d, "datasets");
    ok(ds && ds->type == CK_TOML_ARRAY && ds->v.count == 2, "datasets is an array of 2 tables");
    const ck_toml_item *d1 = at(&d, "datasets/1");
    ok(d1 && d1->type == CK_TOML_TABLE && d1->line == 7, "the first dataset is a table whose header is at line 7");
    ok(is_int(at(&d, "datasets/1/resolution"), 512) && is_int(at(&d, "datasets/1/batch_size"), 4),
       "its resolution and batch_size");
    const ck_toml_item *subs = at(&d, "datasets/1/subsets");
    ok(subs && subs->type == CK_TOML_ARRAY && subs->v.count == 3, "it has 3 subsets");
    ok(is_str(at(&d, "datasets/1/subsets/1/image_dir"), "C:\\hoge") &&
           is_str(at(&d, "datasets/1/subsets/2/class_tokens"), "fuga boy") &&
           is_int(at(&d, "datasets/1/subsets/2/keep_tokens"), 3) && is_bool(at(&d, "datasets/1/subsets/3/is_reg"), 1),
       "the subsets' image_dir (a literal string keeps its backslash), class_tokens, keep_tokens, is_reg");
    const ck_toml_item *r2 = at(&d, "datasets/2/resolution");
    ok(r2 && r2->type == CK_TOML_ARRAY && r2->v.count == 2 && is_int(at(&d, "datasets/2/resolution/2"), 768),
       "the second dataset's resolution is the array [768, 768]");
    const ck_toml_item *first = &d.items[skip(&d, 0) - 1];
    ok(is_str(at(&d, "datasets/2/subsets/1/metadata_file"), "C:\\piyo\\piyo_md.json") && first->line == 35,
       "the last subset's metadata_file, the last item, at line 35");
    const ck_toml_item *k = at(&d, "datasets/1/subsets/3/is_reg");
    ok(k && k->line == 23 && k->col == 3, "an entry's position is its key's: line 23, column 3");
    ok(skip(&d, 0) == d.n, "the items are the root and all it holds, nothing more");
    ck_text_guard g = guard(&a);
    ck_toml_doc_free(&g, &d);
    ok(a.used == 0 && a.peak > 0, "the parse charged its work and everything is given back");
}

static void values_read_as_toml_says(void)
{
    static const char text[] =
        "hex = 0xff\nunder = 1_000\nneg = -17\nbig = 9223372036854775807\n"
        "exp = 1e3\nfrac = 0.5\npinf = inf\nnnan = nan\n"
        "yes = true\nno = false\n"
        "esc = \"caf\\u00e9 \\\"q\\\" \\t\"\nlit = 'C:\\path'\n"
        "multi = \"\"\"\nline one\nline [two] \\\n   joined\"\"\"\n"
        "mlit = '''{[raw]}'''\nquotes = \"\"\"a\"\"\"\"\"\n"
        "odt = 1979-05-27T07:32:00Z\nspace = 1979-05-27 07:32:00.999999-07:00\nldt = 1979-05-27T07:32:00\n"
        "ld = 1979-05-27\nlt = 00:32:00.5\n"
        "\"quoted.key\" = 1\nsite.\"google.com\" = true\n"
        "inline = { x = 1, y.z = [1, 'two', {w = 3}] }\n";
    acct a = {0};
    ck_toml_doc d;
    char err[512];
    int rc = parse(text, strlen(text), &a, &d, err, sizeof err);
    ok(rc == 0, "a text of every kind of value parses");
    if (rc) {
        printf("     %s\n", err);
        return;
    }
    ok(is_int(at(&d, "hex"), 255) && is_int(at(&d, "under"), 1000) && is_int(at(&d, "neg"), -17) &&
           is_int(at(&d, "big"), 9223372036854775807LL),
       "integers: hex, underscores, negative, 64 bits");
    const ck_toml_item *e = at(&d, "exp"), *f = at(&d, "frac"), *pi = at(&d, "pinf"), *nn = at(&d, "nnan");
    ok(e && e->type == CK_TOML_FLOAT && e->v.f == 1000.0 && f && f->v.f == 0.5 && pi && pi->v.f > 1e308 && nn &&
           nn->v.f != nn->v.f,
       "floats: exponent, fraction, inf, nan");
    ok(is_bool(at(&d, "yes"), 1) && is_bool(at(&d, "no"), 0), "booleans");
    ok(is_str(at(&d, "esc"), "caf\xC3\xA9 \"q\" \t") && is_str(at(&d, "lit"), "C:\\path"),
       "a basic string's escapes (\\u00e9 as UTF-8), a literal string's backslash kept");
    ok(is_str(at(&d, "multi"), "line one\nline [two] joined") && is_str(at(&d, "mlit"), "{[raw]}") &&
           is_str(at(&d, "quotes"), "a\"\""),
       "multi-line strings: the first newline trimmed, a line-ending backslash, brackets inside, quotes before the end");
    ok(is_str(at(&d, "odt"), "1979-05-27T07:32:00Z") && is_str(at(&d, "space"), "1979-05-27T07:32:00.999999-07:00") &&
           is_str(at(&d, "ldt"), "1979-05-27T07:32:00") && is_str(at(&d, "ld"), "1979-05-27") &&
           is_str(at(&d, "lt"), "00:32:00.5") && at(&d, "ld")->type == CK_TOML_DATE,
       "dates and times as RFC 3339 text (a space before the time read as T)");
    ok(is_int(at(&d, "quoted.key"), 1) && is_bool(at(&d, "site/google.com"), 1),
       "a quoted key keeps its dots; a dotted key makes tables");
    ok(is_int(at(&d, "inline/x"), 1) && is_str(at(&d, "inline/y/z/2"), "two") && is_int(at(&d, "inline/y/z/3/w"), 3),
       "an inline table with a dotted key, an array of mixed values, a table inside");
    ck_text_guard g = guard(&a);
    ck_toml_doc_free(&g, &d);
    ok(a.used == 0, "everything given back");
}

/* a text of n copies of piece between head and tail */
static char *repeat(const char *head, const char *piece, size_t n, const char *tail, size_t *len)
{
    const size_t h = strlen(head), p = strlen(piece), t = strlen(tail);
    char *s = malloc(h + p * n + t + 1);
    memcpy(s, head, h);
    for (size_t i = 0; i < n; i++) memcpy(s + h + i * p, piece, p);
    memcpy(s + h + p * n, tail, t + 1);
    *len = h + p * n + t;
    return s;
}

/* text is refused with a message starting with want (one line), and nothing stays charged */
static void refused(const char *what, const char *s, size_t n, int want_rc, const char *want)
{
    acct a = {0};
    ck_toml_doc d;
    char err[512], line[700];
    const int rc = parse(s, n, &a, &d, err, sizeof err);
    const int good = rc == want_rc && strncmp(err, want, strlen(want)) == 0 && !strchr(err, '\n') && a.used == 0 &&
                     d.items == NULL;
    snprintf(line, sizeof line, "%s is refused in one line (rc %d: %.300s)", what, rc, err);
    ok(good, line);
}

static void accepted(const char *what, const char *s, size_t n, int depth)
{
    acct a = {0};
    ck_toml_doc d;
    char err[512], line[700];
    const int rc = parse(s, n, &a, &d, err, sizeof err);
    ck_toml_scan sc;
    char e2[256];
    const int scanned = ck_toml_scan_text(s, n, NULL, NULL, &sc, e2, sizeof e2);
    snprintf(line, sizeof line, "%s is read (rc %d, the scan says depth %d: %.300s)", what, rc, sc.depth, rc ? err : "");
    ok(rc == 0 && scanned == 0 && (depth < 0 || sc.depth == depth), line);
    ck_text_guard g = guard(&a);
    ck_toml_doc_free(&g, &d);
}

/* a string literal and its length (NULs inside included) */
#define LIT(s) s, sizeof s - 1

static void hostile_texts_are_refused(void)
{
    size_t n;
    char *s = repeat("", "a.", 200000, "b = 1\n", &n);
    refused("a key of 200001 dotted parts", s, n, CK_TOML_BAD, "line 1, column 1: tables and arrays nest 200001 levels");
    free(s);
    s = repeat("[", "a.", 200000, "b]\n", &n);
    refused("a header of 200001 keys", s, n, CK_TOML_BAD, "line 1, column 1: tables and arrays nest");
    free(s);
    s = repeat("x = 1\n[t]\n", "a.", 33, "b = 1\n", &n);
    refused("a dotted key 34 deep under a header, on line 3", s, n, CK_TOML_BAD, "line 3, column 1: tables and arrays nest 36");
    free(s);
    s = repeat("x = 1\n", "a.", 31, "b = 1\n", &n);
    accepted("a dotted key 32 parts deep", s, n, 32);
    free(s);
    s = repeat("[", "a.", 15, "b]\nk = 1\n", &n);
    refused("a header of 16 keys with a key under it (33 levels at two a header key)", s, n, CK_TOML_BAD,
            "line 2, column 1: tables and arrays nest 33 levels deep here, past the 32 ckrun reads (a header's keys");
    free(s);
    s = repeat("x = ", "[", 40, "", &n);
    refused("40 nested arrays", s, n, CK_TOML_BAD, "line 1, column 37: tables and arrays nest 33");
    free(s);
    s = repeat("x = ", "{a.b.c = ", 12, "1", &n);
    refused("inline tables with dotted keys", s, n, CK_TOML_BAD, "line 1, column ");
    free(s);
    /* headers through arrays of tables: [[a]], [[a.a]], ... each step is two levels */
    {
        char buf[4096];
        size_t k = 0;
        for (int i = 1; i <= 20; i++) {
            k += (size_t)snprintf(buf + k, sizeof buf - k, "[[a");
            for (int j = 1; j < i; j++) k += (size_t)snprintf(buf + k, sizeof buf - k, ".a");
            k += (size_t)snprintf(buf + k, sizeof buf - k, "]]\n");
        }
        refused("arrays of tables nested 20 deep by headers", buf, k, CK_TOML_BAD, "line 16, column 1: tables and arrays nest 33");
    }
    s = repeat("", "[t] \n", CK_TOML_MAX_TABLES + 1, "", &n);
    refused("10001 headers", s, n, CK_TOML_BAD, "line 10001, column 1: headers and dotted keys make more than 10000 tables");
    free(s);
    s = repeat("s = '", "a", CK_TOML_MAX_BYTES, "'\n", &n);
    refused("a string past 1 MiB", s, n, CK_TOML_BAD, "1048583 bytes: more than the 1024 KiB a TOML file may hold");
    free(s);
    refused("a NUL byte", LIT("a = 1\nb = \"x\0y\"\n"), CK_TOML_BAD, "line 2, column 7: a NUL byte");
    refused("an overlong UTF-8 sequence", LIT("a = \"\xC0\xAF\"\n"), CK_TOML_BAD, "line 1, column 6: not valid UTF-8 (byte 0xC0)");
    refused("a UTF-16 surrogate in UTF-8", LIT("# \xED\xA0\x80\n"), CK_TOML_BAD, "line 1, column 3: not valid UTF-8");
    refused("a sequence cut at the end", LIT("k = '\xE2\x82"), CK_TOML_BAD, "line 1, column 6: not valid UTF-8");
    refused("an unterminated string", LIT("a = \"abc\n"), CK_TOML_BAD, "line 1, column ");
    refused("a header cut short", LIT("[[datasets\n"), CK_TOML_BAD, "line 1, column ");
    refused("an array cut short", LIT("a = [1, 2"), CK_TOML_BAD, "line 1, column ");
    refused("an inline table cut short", LIT("a = {b = 1"), CK_TOML_BAD, "line 1, column ");
    refused("a key given twice", LIT("a = 1\nb = 2\na = 3\n"), CK_TOML_BAD, "line 3, column 5: Error while parsing key-value pair: cannot redefine");
    refused("a table given twice", LIT("[a]\n[a]\n"), CK_TOML_BAD, "line 2, column 1:");
    refused("a control character", LIT("a = \"\x01\"\n"), CK_TOML_BAD, "line 1, column ");
    /* toml++ 3.3.0 reaches its "unreachable" when it asks whether such a character is whitespace */
    refused("a bare key past ASCII", LIT("caf\xC3\xA9 = 1\n"), CK_TOML_BAD,
            "line 1, column 4: a character past ASCII outside a string or a comment");
    refused("a character past ASCII after a value", LIT("a = 1\nb = 2 \xEF\xBB\xAF\n"), CK_TOML_BAD,
            "line 2, column 7: a character past ASCII");
    refused("a character past ASCII in an array", LIT("a = [1, \xC3\xA9]\n"), CK_TOML_BAD, "line 1, column 9: a character past ASCII");
    refused("a character past ASCII in an inline table's key", LIT("a = {\xC3\xA9 = 1}\n"), CK_TOML_BAD,
            "line 1, column 6: a character past ASCII");
    refused("a date-time whose time is not one", LIT("a =1979-05-27T-inf07:32:04Z2\n"), CK_TOML_BAD,
            "line 1, column 4: '1979-05-27T-inf07:32:04Z2' is not a TOML value (a string needs quotes)");
    refused("a bare word", LIT("a = [1, hello]\n"), CK_TOML_BAD, "line 1, column 9: 'hello' is not a TOML value");
    refused("an integer with a leading zero", LIT("a = 007\n"), CK_TOML_BAD, "line 1, column 5: '007' is not a TOML value");
    refused("a date and one digit of a time", LIT("x = [1979-05-27 0]\n"), CK_TOML_BAD,
            "line 1, column 17: a date's time after its space must be HH:MM:SS");
    refused("a brace where an array holds a value", LIT("x = [1,\n}]\n"), CK_TOML_BAD,
            "line 2, column 1: '}' where an array holds a value");
    refused("a letter past ASCII after a line-ending backslash's trim (valid TOML toml++ 3.3.0 cannot read)",
            LIT("x = \"\"\"a \\\n    \xC3\xA9\"\"\"\n"), CK_TOML_BAD,
            "line 2, column 5: a character past ASCII right after a backslash, or after the spaces and lines");
    refused("a letter past ASCII after a backslash in a multi-line string", LIT("x = \"\"\"a\\\xC3\xA9\"\"\"\n"),
            CK_TOML_BAD, "line 1, column 10: a character past ASCII right after a backslash");
    accepted("a line-ending backslash before ASCII, and letters past ASCII elsewhere in the string",
             LIT("x = \"\"\"\xC3\xA9 \\\n    a \xC3\xA9\\u00e9\"\"\"\n"), 1);
    refused("a header without its key", LIT("[[ # comment\n"), CK_TOML_BAD, "line 1, column 4: a table header's key must start here");
    refused("a header's key after a bracket and a space", LIT("[[ [a]]\n"), CK_TOML_BAD, "line 1, column 4: a table header's key");
    accepted("characters past ASCII in strings, quoted keys and comments",
             LIT("a = \"\xEF\xBB\xBB caf\xC3\xA9\" # \xEF\xBB\xBB\n\"\xC3\xA9\" = '\xE3\x80\x80'\nm = \"\"\"\xC3\xA9\n\xC3\xA9\"\"\"\n"), 1);
    /* brackets where they are text, not structure */
    s = repeat("a = \"\"\"", "[{", 1000, "\"\"\"\nb = '''[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[['''\n# [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n", &n);
    accepted("brackets inside strings and comments", s, n, 1);
    free(s);
    s = repeat("\"", "a.", 100, "b\" = 1\n'x.y.z' = 2\n", &n);
    accepted("dots inside quoted keys", s, n, 1);
    free(s);
    accepted("an empty text", LIT(""), 0);
    accepted("a byte order mark", LIT("\xEF\xBB\xBF" "a = 1\n"), 1);
}

static void large_texts_are_charged_and_stoppable(void)
{
    size_t n;
    char *s = repeat("x = [", "1,", 200000, "1]\n", &n);
    acct a = {0};
    ck_toml_doc d;
    char err[512];
    int rc = parse(s, n, &a, &d, err, sizeof err);
    ok(rc == 0 && d.n == 200003 && a.peak > (size_t)200001 * 100,
       "an array of 200001 integers (400 KB) reads, charged more than 100 bytes a value while toml++ held it");
    ck_text_guard g = guard(&a);
    ck_toml_doc_free(&g, &d);
    ok(a.used == 0, "and gives it all back");
    /* the same under a budget too small for toml++'s tree, and for the items */
    acct small = {.limit = 16u << 20};
    rc = parse(s, n, &small, &d, err, sizeof err);
    ok(rc == CK_TOML_MEMORY && strstr(err, "toml++'s tree of the text's 200002 values would pass the memory limit") &&
           small.used == 0 && small.peak == 0,
       "under a 16 MiB budget, refused before toml++ runs, naming what would pass it");
    acct mid = {.limit = a.peak - 1};
    rc = parse(s, n, &mid, &d, err, sizeof err);
    ok(rc == CK_TOML_MEMORY && strstr(err, "values of the TOML text would pass the memory limit") && mid.used == 0,
       "a budget that holds the tree but not the items too is refused at the items, everything given back");
    free(s);
    /* stopped at each of the scan's, toml++'s read's and the items' polls */
    s = repeat("x = [", "1,", 50000, "1]\n", &n);
    int stops = 0, clean = 1;
    for (int k = 1; k < 100; k++) {
        acct p = {.stop_at = k};
        rc = parse(s, n, &p, &d, err, sizeof err);
        if (rc == 0) {
            ck_text_guard pg = guard(&p);
            ck_toml_doc_free(&pg, &d);
            break;
        }
        stops++;
        if (rc != CK_TOML_STOPPED || strcmp(err, CK_TEXT_STOPPED) || p.used || d.items) {
            printf("     stopped at poll %d: rc %d, %zu bytes charged: %s\n", k, rc, p.used, err);
            clean = 0;
        }
    }
    char what[160];
    snprintf(what, sizeof what, "a poll that says stop ends the work at each of its %d polls, nothing left charged", stops);
    ok(stops > 15 && clean, what);
    free(s);
}

int main(void)
{
    kohya_sample_reads_as_written();
    values_read_as_toml_says();
    hostile_texts_are_refused();
    large_texts_are_charged_and_stoppable();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
