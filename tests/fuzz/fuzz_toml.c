/* libFuzzer harness for the TOML reader (vm/formats/toml_scan.h, then
 * toml++ behind vm/formats/toml_shim.h): every input is a TOML text, read
 * under a budget of 256 MiB and a poll that counts; one input in four asks
 * the poll to stop at a poll chosen from its last byte. A refusal is one line
 * (a stop: CK_TEXT_STOPPED, with no poll after it) with nothing left
 * charged. A text that reads is a well-formed list of items: every
 * container's entries inside the list, a table's with keys and an array's
 * without, every string inside the text buffer and NUL-terminated, no
 * container deeper than the scan measured and the scan's limit (toml++ never
 * built what the scan did not count), and every charge given back when it is
 * freed. Under AddressSanitizer, toml++ reading out of bounds or recursing
 * past the stack is a crash. */
#include "formats/toml_scan.h"
#include "formats/toml_shim.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define H "fuzz_toml"
#define BUDGET ((size_t)256 << 20)

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, H ": invariant broken: %s\n", what);
        abort();
    }
}

typedef struct watch {
    size_t used;
    long long polls, stop_at, after_stop;
} watch;

static int take_fn(void *ud, size_t n, const char *what, char *err, size_t errlen)
{
    watch *w = ud;
    if (n > BUDGET - w->used) {
        snprintf(err, errlen, "%s would pass the budget", what);
        return -1;
    }
    w->used += n;
    return 0;
}

static void give_fn(void *ud, size_t n)
{
    watch *w = ud;
    check(n <= w->used, "the reader gives back no more than it took");
    w->used -= n;
}

static int poll_fn(void *ud, long long work)
{
    watch *w = ud;
    check(work >= 0, "a poll reports no negative work");
    if (w->stop_at && w->polls >= w->stop_at) w->after_stop++;
    return w->stop_at && ++w->polls >= w->stop_at;
}

/* walks item i at depth d; returns the index after it and all it holds */
static size_t walk(const ck_toml_doc *doc, size_t i, int d, int *deepest, int in_table)
{
    check(i < doc->n, "an entry lies inside the list");
    const ck_toml_item *it = &doc->items[i];
    check(it->type >= CK_TOML_TABLE && it->type <= CK_TOML_DATE, "an item has a type");
    check(in_table ? it->key != NULL : it->key == NULL, "a table's entries have keys, an array's none");
    const char *end = doc->text + doc->ntext;
    if (it->key) check(it->key >= doc->text && it->key + it->klen < end, "a key lies in the text buffer");
    check(it->line >= 1 && it->col >= 1, "an item has a position");
    if (it->type == CK_TOML_STRING || it->type == CK_TOML_DATE) {
        check(it->str && it->str >= doc->text && it->str + it->len < end && it->str[it->len] == 0,
              "a string lies in the text buffer, NUL-ended");
        if (it->type == CK_TOML_DATE) check(it->len >= 8 && it->len < 48, "a date's text is a date's length");
    }
    size_t j = i + 1;
    if (it->type == CK_TOML_TABLE || it->type == CK_TOML_ARRAY) {
        if (d > *deepest) *deepest = d;
        check(it->v.count <= doc->n - j, "a container holds no more entries than follow it");
        for (uint32_t k = 0; k < it->v.count; k++) j = walk(doc, j, d + 1, deepest, it->type == CK_TOML_TABLE);
    }
    return j;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    watch w = {0};
    if (size && (data[size - 1] & 3) == 0) w.stop_at = 1 + data[size - 1] / 4 % 16;
    ck_text_guard g = {take_fn, give_fn, &w, poll_fn, &w};
    ck_toml_doc doc;
    char err[512] = "";
    const int rc = ck_toml_parse((const char *)data, size, &g, &doc, err, sizeof err);
    if (rc) {
        check(err[0] != 0 && strchr(err, '\n') == NULL, "a refusal is one line");
        check(w.used == 0, "a refusal gives back every charge");
        check(doc.items == NULL && doc.n == 0, "a refusal leaves no items");
        if (rc == CK_TOML_STOPPED) {
            check(w.stop_at && strcmp(err, CK_TEXT_STOPPED) == 0, "only the poll stops the work");
            check(w.after_stop == 0, "no poll after a stop");
        } else {
            check(rc == CK_TOML_BAD, "a refusal is of the text (the budget holds any text the scan lets by)");
            check(strncmp(err, "line ", 5) == 0 || strstr(err, " bytes: more than"), "a refusal names the line");
        }
        return 0;
    }
    ck_toml_scan sc;
    char e2[512];
    check(ck_toml_scan_text((const char *)data, size, NULL, NULL, &sc, e2, sizeof e2) == 0, "a text that reads scans");
    check(doc.n >= 1 && doc.items[0].type == CK_TOML_TABLE, "the root is a table");
    int deepest = 0;
    check(walk(&doc, 0, 0, &deepest, 0) == doc.n, "the root and what it holds are all the items");
    check(deepest <= sc.depth && deepest <= CK_TOML_MAX_DEPTH, "no container lies deeper than the scan measured");
    ck_toml_doc_free(&g, &doc);
    check(w.used == 0, "every charge is given back");
    return 0;
}
