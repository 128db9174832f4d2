/* Specification of vm/text/spm_model (sentencepiece's model read and checked
 * by ckrun's own reader) and vm/text/spm_tok (the T5 pipeline around the
 * library), without Lua: the reference model and a small one read as they
 * are; one refusal, in one line, per kind of hostile model (truncated
 * varints and fields, huge declared sizes, groups nested deep, bad pieces,
 * huge piece counts, bad character maps); every prefix of a model and
 * seeded random corruptions of it refused or read without fault, a read one
 * carried through libsentencepiece; the written model read back; special
 * tokens, words and U+2581 cut as transformers cuts them. Built a second
 * time under AddressSanitizer (test_spm_model_asan). */
#include "text/spm_model.h"
#include "text/spm_shim.h"
#include "text/spm_tok.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "named_check.h"

static char data[1024];

static uint8_t *read_file(const char *rel, size_t *n)
{
    char path[1400];
    snprintf(path, sizeof path, "%s/%s", data, rel);
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        printf("cannot open %s\n", path);
        exit(1);
    }
    fseek(fp, 0, SEEK_END);
    const long sz = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)sz + 1);
    *n = fread(p, 1, (size_t)sz, fp);
    fclose(fp);
    return p;
}

/* ---- protobuf by hand */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void put(buf *b, const void *s, size_t n)
{
    if (n == 0) return;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void varint(buf *b, uint64_t v)
{
    uint8_t t[10];
    size_t k = 0;
    while (v >= 0x80) t[k++] = (uint8_t)(v | 0x80), v >>= 7;
    t[k++] = (uint8_t)v;
    put(b, t, k);
}

static void field_bytes(buf *b, uint32_t f, const void *s, size_t n)
{
    varint(b, (uint64_t)f << 3 | 2);
    varint(b, n);
    put(b, s, n);
}

static void piece(buf *b, const char *s, size_t n, float score, int type)
{
    buf q = {0};
    field_bytes(&q, 1, s, n);
    varint(&q, 2 << 3 | 5);
    put(&q, &score, 4);
    if (type) {
        varint(&q, 3 << 3);
        varint(&q, (uint64_t)type);
    }
    field_bytes(b, 1, q.p, q.n);
    free(q.p);
}

/* a small valid model: <pad> </s> <unk> then a few pieces */
static void base(buf *b)
{
    piece(b, "<pad>", 5, 0, 3);
    piece(b, "</s>", 4, 0, 3);
    piece(b, "<unk>", 5, 0, 2);
    piece(b, "\xE2\x96\x81", 3, -2, 0);
    piece(b, "a", 1, -3, 0);
    piece(b, "\xE2\x96\x81" "a", 4, -1, 0);
}

static int read_model(const buf *b, ck_spm_model *m, char *err, size_t errlen)
{
    return ck_spm_model_read(m, b->p, b->n, NULL, NULL, NULL, err, errlen);
}

/* the model refused with a message holding want, on one line */
static void refused(const char *name, buf *b, const char *want)
{
    ck_spm_model m;
    char err[512] = "";
    const int rc = read_model(b, &m, err, sizeof err);
    ck_spm_model_free(&m);
    check(rc == -1 && strstr(err, want) && !strchr(err, '\n'), name, "rc %d, err '%s', want '%s'", rc, err, want);
    free(b->p);
    memset(b, 0, sizeof *b);
}

static void test_reference_models(void)
{
    size_t n;
    uint8_t *f = read_file("tests/data/tokenizer/t5_small/spiece/spiece.model", &n);
    ck_spm_model m;
    char err[512] = "";
    int rc = ck_spm_model_read(&m, f, n, NULL, NULL, NULL, err, sizeof err);
    check(rc == 0 && m.npieces == 605 && m.pieces[2].type == CK_SPM_UNKNOWN && m.pieces[0].type == CK_SPM_CONTROL &&
              m.pieces[2].len == 5 && memcmp(f + m.pieces[2].off, "<unk>", 5) == 0 && m.model_type == CK_SPM_UNIGRAM,
          "reference_spiece_model_reads_605_pieces_unk_at_2", "rc %d (%s), %d pieces", rc, err, m.npieces);
    ck_spm_charsmap cm;
    rc = ck_spm_charsmap_check(&cm, m.charsmap, m.charsmap_len, NULL, NULL, err, sizeof err);
    size_t rl = 0;
    const char *r = rc ? NULL : ck_spm_charsmap_first(&cm, (const uint8_t *)"\xEF\xBC\xA1x", 4, &rl); /* fullwidth A */
    check(rc == 0 && r && rl == 1 && r[0] == 'A', "nmt_nfkc_map_checks_and_maps_fullwidth_A_to_A", "rc %d (%s)", rc, err);
    r = rc ? NULL : ck_spm_charsmap_first(&cm, (const uint8_t *)"\xEF\xAC\x81", 3, &rl); /* the fi ligature */
    check(r && rl == 2 && memcmp(r, "fi", 2) == 0, "nmt_nfkc_map_unfolds_the_fi_ligature", "%.*s", (int)rl, r ? r : "");
    check(!ck_spm_charsmap_first(&cm, (const uint8_t *)"abc", 3, &rl) && !ck_spm_charsmap_first(&cm, (const uint8_t *)"", 0, &rl),
          "nmt_nfkc_map_leaves_ascii_and_the_empty_key", "");

    ck_spm_tok t;
    memset(&t, 0, sizeof t);
    rc = ck_spm_tok_from_model(&t, &m, NULL, NULL, NULL, NULL, err, sizeof err);
    check(rc == 0 && t.n == 705 && t.eos == 1 && t.pad == 0 && t.unk == 2 && t.nsp == 103 &&
              ck_spm_tok_id(&t, "<extra_id_0>", 12) == 704 && ck_spm_tok_id(&t, "<extra_id_99>", 13) == 605,
          "t5_vocabulary_is_the_pieces_then_100_extra_ids_in_reverse", "rc %d (%s), n %d, nsp %d", rc, err, t.n, t.nsp);
    ck_spm_tok_free(&t);
    ck_spm_model_free(&m);
    free(f);
}

static int refuse(void *ud, size_t n, const char *what, char *e, size_t el)
{
    (void)ud;
    (void)n;
    snprintf(e, el, "%s would pass the limit", what);
    return -1;
}

static void test_hostile_models(void)
{
    buf b = {0};
    uint8_t raw[64];

    base(&b);
    ck_spm_model m;
    char err[512] = "";
    check(read_model(&b, &m, err, sizeof err) == 0 && m.npieces == 6, "small_model_reads", "%s", err);
    ck_spm_model_free(&m);
    free(b.p);
    memset(&b, 0, sizeof b);

    put(&b, "", 0);
    refused("empty_file_refused", &b, "the file is empty");

    base(&b);
    b.n -= 3; /* into the last piece */
    refused("truncated_model_refused", &b, "ModelProto.pieces (field 1) at byte 69 declares 11 bytes where 8 remain");

    base(&b);
    raw[0] = 0x0A;
    put(&b, raw, 1);
    refused("tag_without_its_length_refused", &b, "a varint at byte 83 is cut off by the end of its ModelProto");

    base(&b);
    raw[0] = 0x0A;
    for (int i = 1; i <= 11; i++) raw[i] = 0x80;
    raw[11] = 0x01;
    put(&b, raw, 12);
    refused("varint_of_11_bytes_refused", &b, "a varint at byte 83 runs past 64 bits");

    base(&b);
    raw[0] = 0x0A;
    for (int i = 1; i < 10; i++) raw[i] = 0xFF;
    raw[10] = 0x02;
    put(&b, raw, 11);
    refused("varint_of_10_bytes_past_64_bits_refused", &b, "a varint at byte 83 runs past 64 bits");

    base(&b);
    raw[0] = 0x1A; /* normalizer_spec */
    put(&b, raw, 1);
    varint(&b, (uint64_t)1 << 60);
    refused("huge_declared_size_refused", &b, "ModelProto.normalizer_spec (field 3) at byte 82 declares 1152921504606846976 bytes");

    base(&b);
    varint(&b, 99u << 3 | 2);
    varint(&b, 0xFFFFFFFFull);
    refused("huge_unknown_field_refused", &b, "ModelProto field 99 at byte 82 declares 4294967295 bytes");

    base(&b);
    for (int i = 0; i < 100000; i++) varint(&b, 7u << 3 | 3); /* start-group, nested 100000 deep */
    refused("groups_nested_deep_refused_at_the_first", &b, "ModelProto field 7 at byte 82 is a group (wire type 3)");

    base(&b);
    {
        buf q = {0};
        varint(&q, 1u << 3 | 3); /* a group inside a piece */
        varint(&q, 1u << 3 | 4);
        field_bytes(&b, 1, q.p, q.n);
        free(q.p);
    }
    refused("group_inside_a_piece_refused", &b, "SentencePiece field 1 at byte 84 is a group");

    base(&b);
    varint(&b, 5u << 3 | 6);
    refused("wire_type_6_refused", &b, "has wire type 6");

    base(&b);
    varint(&b, 0u << 3 | 0);
    varint(&b, 1);
    refused("field_number_0_refused", &b, "has number 0");

    base(&b);
    varint(&b, 1u << 3 | 0); /* pieces as a varint */
    varint(&b, 5);
    refused("wire_type_of_a_known_field_checked", &b, "ModelProto.pieces (field 1) at byte 82 is a varint, not length-delimited");

    base(&b);
    piece(&b, "", 0, -1, 0);
    refused("empty_piece_refused", &b, "piece 6 is empty");

    base(&b);
    piece(&b, "a\xC3", 2, -1, 0);
    refused("piece_of_invalid_utf8_refused", &b, "piece 6 is not valid UTF-8 (its byte 2)");

    base(&b);
    piece(&b, "\xED\xA0\x80", 3, -1, 0);
    refused("piece_with_a_surrogate_refused", &b, "piece 6 is not valid UTF-8");

    base(&b);
    piece(&b, "a\0b", 3, -1, 0);
    refused("piece_with_nul_refused", &b, "piece 6 holds a NUL byte");

    base(&b);
    {
        char big[CK_SPM_MAX_PIECE_BYTES + 1];
        memset(big, 'x', sizeof big);
        piece(&b, big, sizeof big, -1, 0);
    }
    refused("piece_over_1024_bytes_refused", &b, "piece 6 is 1025 bytes long");

    base(&b);
    piece(&b, "b", 1, -1, 9);
    refused("piece_of_unknown_type_refused", &b, "piece 6 has type 9");

    base(&b);
    piece(&b, "b", 1, NAN, 0);
    refused("piece_with_nan_score_refused", &b, "piece 6 has a score that is not a finite number");

    base(&b);
    piece(&b, "b", 1, INFINITY, 0);
    refused("piece_with_infinite_score_refused", &b, "not a finite number");

    base(&b);
    {
        const uint8_t t[] = {0x18, 0x01};
        field_bytes(&b, 2, t, 2);
        field_bytes(&b, 2, t, 2);
    }
    refused("trainer_spec_twice_refused", &b, "ModelProto.trainer_spec appears twice");

    base(&b);
    {
        const uint8_t t[] = {0x18, 0x07};
        field_bytes(&b, 2, t, 2);
    }
    refused("unknown_model_type_refused", &b, "trainer_spec.model_type is 7");

    base(&b);
    {
        buf q = {0};
        uint8_t *big = calloc(1, CK_SPM_MAX_CHARSMAP + 1);
        field_bytes(&q, 2, big, CK_SPM_MAX_CHARSMAP + 1);
        field_bytes(&b, 3, q.p, q.n);
        free(q.p);
        free(big);
    }
    refused("character_map_over_4_MiB_refused", &b, "normalizer_spec.precompiled_charsmap is 4194305 bytes");

    /* a million and one pieces of 5 bytes each: refused by count before
     * their table is made */
    for (int i = 0; i <= CK_SPM_MAX_PIECES; i++) {
        const uint8_t p[] = {0x0A, 0x03, 0x0A, 0x01, 'a'};
        put(&b, p, sizeof p);
    }
    refused("more_than_a_million_pieces_refused_by_count", &b, "more than 1048576 pieces");

    /* the pieces' table refused by the charge */
    base(&b);
    {
        const ck_spm_charge c = {refuse, NULL, NULL};
        char e[512] = "";
        const int rc = ck_spm_model_read(&m, b.p, b.n, &c, NULL, NULL, e, sizeof e);
        ck_spm_model_free(&m);
        check(rc == -1 && strstr(e, "the table of 6 pieces would pass the limit"), "pieces_table_charged_before_it_is_made",
              "%s", e);
        free(b.p);
        memset(&b, 0, sizeof b);
    }
}

/* ---- character maps */

static void le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

/* a hand-built map of 512 units, "x" -> the first normalized string: the
 * root (unit 0) has offset 0, so its children's block starts at unit 0 and
 * 'x' is unit 'x'; that unit has a leaf and offset 256, so its block (and
 * its leaf) is at unit 'x' ^ 256; the leaf's value 0 is the strings' start */
static size_t tiny_map(uint8_t *blob, const char *norm, size_t nlen)
{
    const uint32_t nunits = 512;
    memset(blob, 0, 4 + nunits * 4 + nlen);
    le32(blob, nunits * 4);
    uint8_t *u = blob + 4;
    /* root: offset 0 (base 0); child 'x' at unit 'x' with label 'x', has_leaf,
     * offset 256 (base 'x' ^ 256); its leaf unit at that base, value 0 */
    const uint32_t child = 'x', base = child ^ 256;
    le32(u + 4 * child, 'x' | 1u << 8 | 256u << 10);
    le32(u + 4 * base, 0x80000000u | 0);
    memcpy(blob + 4 + nunits * 4, norm, nlen);
    return 4 + nunits * 4 + nlen;
}

static void map_refused(const char *name, const uint8_t *blob, size_t len, const char *want)
{
    ck_spm_charsmap cm;
    char err[512] = "";
    const int rc = ck_spm_charsmap_check(&cm, blob, len, NULL, NULL, err, sizeof err);
    check(rc == -1 && strstr(err, want) != NULL, name, "rc %d, err '%s', want '%s'", rc, err, want);
}

static void test_maps(void)
{
    uint8_t blob[4 + 2048 + 64];
    size_t len = tiny_map(blob, "y\0", 2);
    ck_spm_charsmap cm;
    char err[512] = "";
    int rc = ck_spm_charsmap_check(&cm, blob, len, NULL, NULL, err, sizeof err);
    size_t rl = 0;
    const char *r = rc ? NULL : ck_spm_charsmap_first(&cm, (const uint8_t *)"xz", 2, &rl);
    check(rc == 0 && r && rl == 1 && r[0] == 'y' && !ck_spm_charsmap_first(&cm, (const uint8_t *)"z", 1, &rl),
          "hand_built_map_maps_x_to_y", "rc %d (%s)", rc, err);
    check(!ck_spm_charsmap_first(&cm, (const uint8_t *)"\0x", 2, &rl), "lookup_stops_at_nul", "");

    map_refused("map_of_3_bytes_refused", blob, 3, "too short for its trie's size");
    le32(blob, 1026);
    map_refused("trie_not_whole_units_refused", blob, len, "not a whole number of 4-byte units");
    le32(blob, 8192);
    map_refused("trie_larger_than_the_map_refused", blob, len, "declares 8192 bytes where");
    le32(blob, 1020);
    map_refused("trie_under_one_block_refused", blob, len, "less than one block of 256");

    len = tiny_map(blob, "y\0", 2);
    le32(blob + 4 + 4 * 'x', 'x' | 1u << 8 | 4096u << 10); /* base far outside */
    map_refused("unit_pointing_past_the_trie_refused", blob, len, "points to unit");

    len = tiny_map(blob, "y\0", 2);
    le32(blob + 4 + 4 * ('x' ^ 256), 5); /* the leaf is not one */
    map_refused("leaf_that_is_not_one_refused", blob, len, "that is not one");

    len = tiny_map(blob, "y\0", 2);
    le32(blob + 4 + 4 * ('x' ^ 256), 0x80000000u | 7);
    map_refused("leaf_value_past_the_strings_refused", blob, len, "maps to byte 7 of 2 bytes");

    len = tiny_map(blob, "\xC3\xA9\0", 3);
    le32(blob + 4 + 4 * ('x' ^ 256), 0x80000000u | 1);
    map_refused("leaf_value_inside_a_character_refused", blob, len, "into the middle of a character");

    len = tiny_map(blob, "\xC3\0", 2);
    map_refused("normalized_string_of_bad_utf8_refused", blob, len, "is not valid UTF-8");

    len = tiny_map(blob, "yz", 2);
    map_refused("normalized_strings_without_final_nul_refused", blob, len, "does not end in NUL");

    /* a unit no key reaches is checked too (a node that could be reached
     * by a trie someone else edits), and a self-loop stays bounded */
    len = tiny_map(blob, "y\0", 2);
    le32(blob + 4 + 4 * 300, 'q' | 3000u << 10);
    map_refused("every_node_unit_checked", blob, len, "trie unit 300 points to unit");
}

/* ---- random corruption, carried through the library when read */

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static int emit_none(void *ud, const int *ids, size_t n)
{
    (void)ids;
    *(size_t *)ud += n;
    return 0;
}

static int sp_special(void *ud, int32_t id)
{
    (void)ud;
    (void)id;
    return 0;
}

typedef struct lib_ctx {
    const ck_spmp *p;
    size_t ids;
} lib_ctx;

static int sp_piece(void *ud, const char *s, size_t n)
{
    lib_ctx *c = ud;
    char err[256];
    ck_spmp_encode(c->p, s, n, emit_none, &c->ids, err, sizeof err);
    return 0;
}

/* model bytes -> read -> tokenizer -> library -> a few captions; returns
 * how far it got (0 refused, 1 read, 2 through the library) */
static int carry(const uint8_t *p, size_t n)
{
    ck_spm_model m;
    char err[512];
    if (ck_spm_model_read(&m, p, n, NULL, NULL, NULL, err, sizeof err)) {
        ck_spm_model_free(&m);
        return 0;
    }
    ck_spm_tok t;
    memset(&t, 0, sizeof t);
    int got = 1;
    if (ck_spm_tok_from_model(&t, &m, NULL, NULL, NULL, NULL, err, sizeof err) == 0) {
        const size_t plen = ck_spm_tok_proto(&t, NULL, 0);
        uint8_t *proto = malloc(plen);
        ck_spm_tok_proto(&t, proto, plen);
        ck_spmp *lib = ck_spmp_load(proto, plen, err, sizeof err);
        free(proto);
        if (lib) {
            static const char *const caps[] = {"a cat sitting on a sofa", "\xEF\xBC\xA1\xCC\x81 A\xE3\x80\x80 b\xE2\x80\x8B",
                                               "<extra_id_0></s>x<pad>", "\xEF\xAC\x81nance  \t\xE2\x96\x81\xE2\x96\x81"};
            ck_spm_scratch s;
            memset(&s, 0, sizeof s);
            lib_ctx c = {lib, 0};
            const ck_spm_sink sink = {sp_special, sp_piece, &c};
            for (int i = 0; i < 4; i++) ck_spm_tok_split(&t, caps[i], strlen(caps[i]), &s, &sink, NULL, NULL, err, sizeof err);
            ck_spm_scratch_free(&s);
            ck_spmp_unref(lib);
            got = 2;
        }
    }
    ck_spm_tok_free(&t);
    ck_spm_model_free(&m);
    return got;
}

static void test_corruption(void)
{
    size_t n;
    uint8_t *f = read_file("tests/fuzz/corpus/spm/rules.model", &n);
    check(carry(f, n) == 2, "small_model_with_rules_goes_through_the_library", "");
    int read = 0;
    for (size_t k = 0; k < n; k++) read += carry(f, k) > 0;
    check(read < (int)n, "every_prefix_refused_or_read_without_fault", "%d of %zu prefixes read", read, n);
    uint8_t *g = malloc(n + 16);
    int through = 0, refusedn = 0;
    for (int it = 0; it < 3000; it++) {
        memcpy(g, f, n);
        size_t len = n;
        const int edits = 1 + (int)(rnd() % 4);
        for (int e = 0; e < edits; e++) {
            const size_t at = rnd() % len;
            switch (rnd() % 4) {
            case 0: g[at] ^= (uint8_t)(1u << (rnd() % 8)); break;
            case 1: g[at] = (uint8_t)rnd(); break;
            case 2: len = at + 1; break;
            default: g[at] = (uint8_t)(0x80 | rnd()); break; /* a longer varint */
            }
        }
        const int r = carry(g, len);
        through += r == 2;
        refusedn += r == 0;
    }
    check(through > 100 && refusedn > 100, "random_corruptions_refused_or_carried_through_the_library", "%d carried, %d refused",
          through, refusedn);
    free(g);
    free(f);
}

/* ---- the written model, and the pipeline's cuts */

static void get_vocab(void *ud, int i, const char **s, uint32_t *len, float *score, int *type)
{
    static const char *const v[] = {"<pad>", "</s>", "<unk>", "\xE2\x96\x81", "a", "\xE2\x96\x81" "a", "b"};
    (void)ud;
    *s = v[i];
    *len = (uint32_t)strlen(v[i]);
    *score = i < 3 ? 0.0f : -(float)i;
    *type = i == 2 ? CK_SPM_UNKNOWN : CK_SPM_NORMAL;
}

static int collect(void *ud, const int *ids, size_t n)
{
    int *out = ud;
    for (size_t i = 0; i < n && i < 15; i++) out[i + 1] = ids[i];
    out[0] = (int)n;
    return 0;
}

static void test_written_model(void)
{
    const size_t need = ck_spm_write(7, get_vocab, NULL, NULL, 0);
    uint8_t *p = malloc(need);
    const size_t wrote = ck_spm_write(7, get_vocab, NULL, p, need);
    ck_spm_model m;
    char err[512] = "";
    int rc = ck_spm_model_read(&m, p, wrote, NULL, NULL, NULL, err, sizeof err);
    check(rc == 0 && wrote == need && m.npieces == 7 && m.pieces[2].type == CK_SPM_UNKNOWN && m.pieces[6].score == -6.0f &&
              m.charsmap_len == 0 && !m.add_dummy_prefix && !m.remove_extra_whitespaces && !m.escape_whitespaces,
          "written_model_reads_back_with_the_identity_normalizer", "rc %d (%s)", rc, err);
    ck_spm_model_free(&m);
    ck_spmp *lib = ck_spmp_load(p, wrote, err, sizeof err);
    int ids[16] = {0};
    rc = lib ? ck_spmp_encode(lib, "\xE2\x96\x81" "ab\xE2\x96\x81zz", 10, collect, ids, err, sizeof err) : -1;
    /* ▁a b ▁ then the unknown run "zz" as one id */
    check(rc == 0 && ids[0] == 4 && ids[1] == 5 && ids[2] == 6 && ids[3] == 3 && ids[4] == 2,
          "library_segments_with_the_written_model_and_fuses_unknown_runs", "rc %d (%s): %d ids %d %d %d %d", rc, err, ids[0],
          ids[1], ids[2], ids[3], ids[4]);
    ck_spmp_unref(lib);
    free(p);
}

typedef struct cuts {
    char out[4096];
    size_t n;
    int stop_after;
    int count;
} cuts;

static int cut_special(void *ud, int32_t id)
{
    cuts *c = ud;
    c->n += (size_t)snprintf(c->out + c->n, sizeof c->out - c->n, "[%d]", (int)id);
    return c->stop_after && ++c->count >= c->stop_after;
}

static int cut_piece(void *ud, const char *s, size_t n)
{
    cuts *c = ud;
    c->n += (size_t)snprintf(c->out + c->n, sizeof c->out - c->n, "(%.*s)", (int)n, s);
    return c->stop_after && ++c->count >= c->stop_after;
}

static void test_cuts(void)
{
    /* a vocabulary with no character map, extra ids 0..11 */
    buf b = {0};
    base(&b);
    ck_spm_model m;
    char err[512] = "";
    ck_spm_model_read(&m, b.p, b.n, NULL, NULL, NULL, err, sizeof err);
    const ck_spm_config cfg = {NULL, NULL, NULL, 12};
    ck_spm_tok t;
    memset(&t, 0, sizeof t);
    int rc = ck_spm_tok_from_model(&t, &m, &cfg, NULL, NULL, NULL, err, sizeof err);
    check(rc == 0 && t.n == 18 && ck_spm_tok_id(&t, "<extra_id_11>", 13) == 6, "extra_ids_from_the_config", "%s", err);
    static const struct {
        const char *name, *text, *want;
    } cases[] = {
        {"special_tokens_longest_first", "x<extra_id_1><extra_id_10>", "(\xE2\x96\x81x)[16][7]"},
        {"special_tokens_leftmost_then_longest", "<extra_id_1<extra_id_1>0>", "(\xE2\x96\x81<extra_id_1)[16](\xE2\x96\x81" "0>)"},
        {"words_split_on_every_unicode_space", "a\tb\xC2\x85" "c\xE3\x80\x80" "d\xE2\x80\x8B" "e",
         "(\xE2\x96\x81" "a)(\xE2\x96\x81" "b)(\xE2\x96\x81" "c)(\xE2\x96\x81" "d\xE2\x80\x8B" "e)"},
        {"metaspace_cuts_before_each_u2581", "a\xE2\x96\x81\xE2\x96\x81" "b\xE2\x96\x81",
         "(\xE2\x96\x81" "a)(\xE2\x96\x81)(\xE2\x96\x81" "b)(\xE2\x96\x81)"},
        {"a word starting_with_u2581_gets_no_second", "\xE2\x96\x81" "a", "(\xE2\x96\x81" "a)"},
        {"spaces_alone_make_nothing", " \t\n\xE3\x80\x80 ", ""},
        {"special_tokens_need_no_spaces", "</s><pad>a</s>", "[1][0](\xE2\x96\x81" "a)[1]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cuts c = {{0}, 0, 0, 0};
        ck_spm_scratch s;
        memset(&s, 0, sizeof s);
        const ck_spm_sink sink = {cut_special, cut_piece, &c};
        rc = ck_spm_tok_split(&t, cases[i].text, strlen(cases[i].text), &s, &sink, NULL, NULL, err, sizeof err);
        ck_spm_scratch_free(&s);
        check(rc == 0 && strcmp(c.out, cases[i].want) == 0, cases[i].name, "rc %d: got '%s', want '%s'", rc, c.out, cases[i].want);
    }
    cuts c = {{0}, 0, 2, 0};
    ck_spm_scratch s;
    memset(&s, 0, sizeof s);
    const ck_spm_sink sink = {cut_special, cut_piece, &c};
    rc = ck_spm_tok_split(&t, "a b c d", 7, &s, &sink, NULL, NULL, err, sizeof err);
    ck_spm_scratch_free(&s);
    check(rc == 1 && strcmp(c.out, "(\xE2\x96\x81" "a)(\xE2\x96\x81" "b)") == 0, "a_sink_stops_the_split", "rc %d '%s'", rc, c.out);
    ck_spm_tok_free(&t);

    /* piece 2 must be the unknown piece; no user-defined pieces */
    ck_spm_model_free(&m);
    free(b.p);
    memset(&b, 0, sizeof b);
    piece(&b, "<pad>", 5, 0, 3);
    piece(&b, "<unk>", 5, 0, 2);
    piece(&b, "</s>", 4, 0, 3);
    ck_spm_model_read(&m, b.p, b.n, NULL, NULL, NULL, err, sizeof err);
    memset(&t, 0, sizeof t);
    rc = ck_spm_tok_from_model(&t, &m, NULL, NULL, NULL, NULL, err, sizeof err);
    check(rc == -1 && strstr(err, "piece 2 is not the unknown piece"), "unknown_piece_elsewhere_than_2_refused", "%s", err);
    ck_spm_tok_free(&t);
    ck_spm_model_free(&m);
    free(b.p);
    memset(&b, 0, sizeof b);
    base(&b);
    piece(&b, "<user>", 6, 0, 4);
    ck_spm_model_read(&m, b.p, b.n, NULL, NULL, NULL, err, sizeof err);
    memset(&t, 0, sizeof t);
    rc = ck_spm_tok_from_model(&t, &m, NULL, NULL, NULL, NULL, err, sizeof err);
    check(rc == -1 && strstr(err, "piece 6 '<user>' is of type USER_DEFINED"), "user_defined_pieces_refused", "%s", err);
    ck_spm_tok_free(&t);
    ck_spm_model_free(&m);
    free(b.p);
    memset(&b, 0, sizeof b);
    base(&b);
    piece(&b, "a\nb\\c\x7f", 6, 0, 4);
    ck_spm_model_read(&m, b.p, b.n, NULL, NULL, NULL, err, sizeof err);
    memset(&t, 0, sizeof t);
    rc = ck_spm_tok_from_model(&t, &m, NULL, NULL, NULL, NULL, err, sizeof err);
    check(rc == -1 && strstr(err, "piece 6 'a\\x0Ab\\x5Cc\\x7F' is of type") && !strchr(err, '\n'),
          "a piece quoted in a message stays on one line", "%s", err);
    ck_spm_tok_free(&t);
    ck_spm_model_free(&m);
    free(b.p);
}

int main(void)
{
    snprintf(data, sizeof data, "%s", __FILE__);
    char *c = strstr(data, "tests/c/test_spm_model.c");
    if (c) *c = 0;
    else snprintf(data, sizeof data, "..");
    if (!data[0]) snprintf(data, sizeof data, ".");
    test_reference_models();
    test_hostile_models();
    test_maps();
    test_written_model();
    test_cuts();
    test_corruption();
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail != 0;
}
