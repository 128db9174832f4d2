/* ftfy's fix_text on ICU (vm/text/ftfy.h): its badness heuristic, the
 * re-encodings that undo mojibake, and the character-level fixes. The data
 * (character classes, encodings, ligatures, entity names) is ftfy's own,
 * generated into ftfy_tables.h. */
#include "text/ftfy.h"
#include "util/memory.h"

#include "text/ftfy_tables.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uchar.h>

/* what ftfy's fix_text cuts a line longer than into (max_decode_length) */
#define MAX_SEGMENT 1000000
/* how deep decode_inconsistent_utf8 fixes a piece inside a piece */
#define MAX_LEVEL 4

/* ---- scratch: the slots */

enum {
    S_OUT,               /* fix_text's result */
    S_SEG_A, S_SEG_B, S_SEG_ORIG, /* a line's passes */
    S_U16_IN, S_U16_OUT, /* NFC */
    S_LEVEL,             /* then per level of fix_encoding: its text, the next, two of bytes */
    S_END = S_LEVEL + 4 * MAX_LEVEL
};
_Static_assert(S_END <= (int)(sizeof(((ck_ftfy_scratch *)0)->buf) / sizeof(void *)), "scratch slots");

void ck_ftfy_scratch_free(ck_ftfy_scratch *s)
{
    for (size_t i = 0; i < sizeof s->buf / sizeof s->buf[0]; i++) {
        free(s->buf[i]);
        s->buf[i] = NULL;
        s->cap[i] = 0;
    }
}

/* slot i with room for n bytes (contents kept), or NULL */
static void *grow(ck_ftfy_scratch *s, int i, size_t n)
{
    return ck_grow(&s->buf[i], &s->cap[i], n, 1, 256) ? NULL : s->buf[i];
}

static UChar32 *grow32(ck_ftfy_scratch *s, int i, size_t n)
{
    if (n > SIZE_MAX / sizeof(UChar32) - 16) return NULL;
    return grow(s, i, (n + 16) * sizeof(UChar32));
}

static void swap_slots(ck_ftfy_scratch *s, int a, int b)
{
    void *p = s->buf[a];
    size_t c = s->cap[a];
    s->buf[a] = s->buf[b];
    s->cap[a] = s->cap[b];
    s->buf[b] = p;
    s->cap[b] = c;
}

static int same(const UChar32 *a, size_t na, const UChar32 *b, size_t nb)
{
    return na == nb && (na == 0 || !memcmp(a, b, na * sizeof *a));
}

/* ---- character classes */

static uint32_t CLASS[0x10000];     /* ftfy's classes of each BMP character */
/* each encoding's bytes 0x80 .. 0xFF by the character they decode to */
typedef struct rev {
    uint16_t cp;
    uint8_t b;
} rev;
static rev REV[FT_NENC][128];
static UChar32 WIDTH[0xFFF0 - 0xFF01][2]; /* fix_character_width's map of U+FF01 .. U+FFEF (0: unchanged) */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static int cmp_rev(const void *a, const void *b) { return (int)((const rev *)a)->cp - (int)((const rev *)b)->cp; }

static void make_tables(void)
{
    for (size_t i = 0; i < sizeof FT_CLASSES / sizeof FT_CLASSES[0]; i++) CLASS[FT_CLASSES[i].cp] = FT_CLASSES[i].mask;
    for (int e = 0; e < FT_NENC; e++) {
        for (int b = 0; b < 128; b++) REV[e][b] = (rev){FT_ENC_HIGH[e][b], (uint8_t)(0x80 + b)};
        qsort(REV[e], 128, sizeof(rev), cmp_rev);
    }
    /* halfwidth and fullwidth forms: their NFKC where it differs */
    UErrorCode ec = U_ZERO_ERROR;
    const UNormalizer2 *nfkc = unorm2_getNFKCInstance(&ec);
    for (UChar32 c = 0xFF01; c < 0xFFF0; c++) {
        UChar in[1] = {(UChar)c}, out[8];
        ec = U_ZERO_ERROR;
        int32_t n = U_SUCCESS(ec) && nfkc ? unorm2_normalize(nfkc, in, 1, out, 8, &ec) : 0;
        if (U_FAILURE(ec) || n < 1) continue;
        int32_t k = 0;
        UChar32 a, b = 0;
        U16_NEXT(out, k, n, a);
        if (k < n) U16_NEXT(out, k, n, b);
        if (k < n || (a == c && !b)) continue; /* longer than two (none are), or itself */
        WIDTH[c - 0xFF01][0] = a;
        WIDTH[c - 0xFF01][1] = b;
    }
}

static uint32_t cls(UChar32 c) { return c >= 0 && c < 0x10000 ? CLASS[c] : 0; }

/* the general category as Python 3.11 gives it (Unicode 14.0: later
 * characters are unassigned) */
static int8_t category(UChar32 c)
{
    int8_t t = u_charType(c);
    if (t != U_UNASSIGNED) {
        UVersionInfo age;
        u_charAge(c, age);
        if (age[0] > 14 || (age[0] == 14 && age[1] > 0)) return U_UNASSIGNED;
    }
    return t;
}

/* Python's str.isspace, which re's \s matches: bidirectional class WS, B
 * or S, or category Zs */
static int py_space(UChar32 c)
{
    if (category(c) == U_UNASSIGNED) return 0;
    UCharDirection d = u_charDirection(c);
    return d == U_WHITE_SPACE_NEUTRAL || d == U_BLOCK_SEPARATOR || d == U_SEGMENT_SEPARATOR ||
           u_charType(c) == U_SPACE_SEPARATOR;
}

/* re's \w: '_' or str.isalnum (a letter, or a character with a numeric type) */
static int py_word(UChar32 c)
{
    if (c == '_') return 1;
    int8_t t = category(c);
    if (t == U_UPPERCASE_LETTER || t == U_LOWERCASE_LETTER || t == U_TITLECASE_LETTER || t == U_MODIFIER_LETTER ||
        t == U_OTHER_LETTER)
        return 1;
    return t != U_UNASSIGNED && u_getIntPropertyValue(c, UCHAR_NUMERIC_TYPE) != U_NT_NONE;
}

static int ascii_letter(UChar32 c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* re's \d: a decimal digit of any script */
static int py_digit(UChar32 c) { return category(c) == U_DECIMAL_DIGIT_NUMBER; }

/* ---- the badness heuristic: BADNESS_RE of ftfy/badness.py, searched */

enum { T_NONE, T_ASCII_LETTER, T_LOWER, T_SPACE, T_WORD, T_NOT_ASCII_LETTER, T_NOT_NEWLINE, T_LETTER_OR_SPACE };

/* A character matches when its classes meet mask, it passes test, or it is
 * one of lits. */
typedef struct atom {
    uint32_t mask;
    uint8_t test;
    const char32_t *lits;
} atom;

/* One alternative of the expression: atoms in a row; opt: the atom that may
 * be left out (\s?), -1 none; start: only at the start of the text (^). */
typedef struct alt {
    int8_t n, opt, start;
    atom a[7];
} alt;

#define LA FT_LOWER_ACCENTED
#define UA FT_UPPER_ACCENTED
#define LC FT_LOWER_COMMON
#define UC FT_UPPER_COMMON
#define SP FT_START_PUNCTUATION
#define EP FT_END_PUNCTUATION
#define CUR FT_CURRENCY
#define NUM FT_NUMERIC
#define BOX FT_BOX
#define LAW FT_LAW
#define BAD FT_BAD
#define C1 FT_C1
#define CMN FT_COMMON
#define KAO FT_KAOMOJI
#define M(m) {(m), T_NONE, NULL}
#define T(t) {0, (t), NULL}
#define L(s) {0, T_NONE, (s)}
#define ML(m, s) {(m), T_NONE, (s)}

static const alt BADNESS[] = {
    {1, -1, 0, {M(C1)}},
    {2, -1, 0, {M(BAD | LA | UA | BOX | SP | EP | CUR | NUM | LAW), M(BAD)}},
    {3, -1, 0, {T(T_ASCII_LETTER), M(LC | UC), M(BAD)}},
    {2, -1, 0, {M(BAD), M(LA | UA | BOX | SP | EP | CUR | NUM | LAW)}},
    {2, -1, 0, {M(LA | LC | BOX | EP | CUR | NUM), M(UA)}},
    {2, -1, 0, {M(BOX | EP | CUR | NUM), M(LA)}},
    {2, -1, 0, {M(LA | BOX | EP), M(CUR)}},
    {3, -1, 0, {T(T_SPACE), M(UA), M(CUR)}},
    {2, -1, 0, {M(UA | BOX), M(NUM | LAW)}},
    {3, -1, 0, {M(LA | UA | BOX | CUR | EP), M(SP), M(NUM)}},
    {3, -1, 0, {M(LA | UA | CUR | NUM | BOX | LAW), M(EP), M(SP)}},
    {2, -1, 0, {M(CUR | NUM | BOX), M(SP)}},
    {3, -1, 0, {T(T_LOWER), M(UA), M(SP | CUR)}},
    {2, -1, 0, {M(BOX), M(KAO)}},
    {2, -1, 0, {M(LA | UA | CUR | NUM | SP | EP | LAW), M(BOX)}},
    {2, -1, 0, {M(BOX), M(EP)}},
    {3, -1, 0, {M(LA | UA), M(SP | EP), T(T_WORD)}},
    /* the ligature œ when not followed by an unaccented Latin letter */
    {2, -1, 0, {L(U"Œœ"), T(T_NOT_ASCII_LETTER)}},
    /* degree signs after capital letters */
    {2, -1, 0, {M(UA), L(U"°")}},
    /* common Windows-1252 2-character mojibake */
    {2, -1, 0, {L(U"ÂÃÎÐ"), ML(SP | EP, U"€œŠš¢£Ÿž\u00a0\u00ad®©°·»–—´")}},
    {2, -1, 0, {L(U"×"), L(U"²³")}},
    /* Windows-1252 mojibake of Arabic words: four characters */
    {4, -1, 0, {L(U"ØÙ"), ML(CMN | CUR | BAD | NUM | SP, U"ŸŠ®°µ»"), L(U"ØÙ"), ML(CMN | CUR | BAD | NUM | SP, U"ŸŠ®°µ»")}},
    /* Windows-1252 mojibake starting 3-character sequences of some South Asian alphabets */
    {2, -1, 0, {L(U"à"), L(U"²µ¹¼½¾")}},
    /* MacRoman mojibake */
    {2, -1, 0, {L(U"√"), L(U"±∂†≠®™´≤≥¥µø")}},
    {2, -1, 0, {L(U"≈"), L(U"°¢")}},
    {3, -1, 0, {L(U"‚"), L(U"Ä"), L(U"ìîïòôúùû†°¢π")}},
    {3, -1, 0, {L(U"‚"), L(U"âó"), L(U"àä°ê")}},
    /* Windows-1251 mojibake of characters in the U+2000 range */
    {2, -1, 0, {L(U"в"), L(U"Ђ")}},
    /* Windows-1251 mojibake of Latin-1 characters and/or the Cyrillic alphabet */
    {3, -1, 0, {L(U"ВГРС"), ML(C1 | BAD | SP | EP | CUR, U"°µ"), L(U"ВГРС")}},
    /* Windows-1251 on top of Latin-1 mojibake of Windows-1252 characters */
    {7, -1, 0, {L(U"Г"), L(U"ў"), L(U"В"), L(U"Ђ"), L(U"В"), T(T_NOT_NEWLINE), T(T_LETTER_OR_SPACE)}},
    /* Windows-1252 encodings of 'à' and 'á', and of \xa0 itself */
    {2, -1, 0, {L(U"Ã"), L(U"\u00a0¡")}},
    {4, 1, 0, {T(T_LOWER), T(T_SPACE), L(U"ÃÂ"), L(U" ")}},
    {2, -1, 1, {L(U"ÃÂ"), L(U" ")}},
    /* Â before a character as an encoding of exactly that character */
    {3, -1, 0, {ML(EP, U"abcdefghijklmnopqrstuvwxyz.,?!"), L(U"Â"), ML(SP | EP, U" ")}},
    /* Windows-1253 mojibake of characters in the U+2000 range */
    {3, -1, 0, {L(U"β"), L(U"€"), L(U"™\u00a0Ά\u00ad®°")}},
    /* Windows-1253 mojibake of Latin-1 characters and/or the Greek alphabet */
    {3, -1, 0, {L(U"ΒΓΞΟ"), ML(C1 | BAD | SP | EP | CUR, U"°"), L(U"ΒΓΞΟ")}},
    /* Windows-1257 mojibake of characters in the U+2000 range */
    {2, -1, 0, {L(U"ā"), L(U"€")}},
};

static int in_lits(const char32_t *s, UChar32 c)
{
    for (; *s; s++)
        if ((UChar32)*s == c) return 1;
    return 0;
}

static int atom_match(const atom *a, UChar32 c)
{
    if (a->mask && (cls(c) & a->mask)) return 1;
    if (a->lits && in_lits(a->lits, c)) return 1;
    switch (a->test) {
    case T_ASCII_LETTER: return ascii_letter(c);
    case T_LOWER: return c >= 'a' && c <= 'z';
    case T_SPACE: return py_space(c);
    case T_WORD: return py_word(c);
    case T_NOT_ASCII_LETTER: return !ascii_letter(c);
    case T_NOT_NEWLINE: return c != '\n';
    case T_LETTER_OR_SPACE: return ascii_letter(c) || c == ' ';
    default: return 0;
    }
}

/* alternative a's atoms from k on, at t[i..n) */
static int alt_match(const alt *a, int k, const UChar32 *t, size_t i, size_t n)
{
    for (; k < a->n; k++) {
        if (k == a->opt && alt_match(a, k + 1, t, i, n)) return 1; /* left out */
        if (i >= n || !atom_match(&a->a[k], t[i])) return 0;
        i++;
    }
    return 1;
}

int ck_ftfy_is_bad(const UChar32 *t, size_t n)
{
    pthread_once(&tables_once, make_tables);
    for (size_t i = 0; i < n; i++) {
        /* every alternative starts with a character of some class or a
         * non-ASCII literal, or an ASCII letter, space or punctuation */
        for (size_t k = 0; k < sizeof BADNESS / sizeof BADNESS[0]; k++) {
            const alt *a = &BADNESS[k];
            if (a->start && i) continue;
            if (alt_match(a, 0, t, i, n)) return 1;
        }
    }
    return 0;
}

/* ---- the single-byte encodings */

/* the byte that c encodes to in encoding e, or -1 */
static int encode_char(int e, UChar32 c)
{
    if (c == FT_ENC_1A[e]) return 0x1A;
    if (c < 0x80) return c == 0x1A ? -1 : (int)c;
    if (e == 0) return c < 0x100 ? (int)c : -1; /* Latin-1 */
    if (c > 0xFFFF) return -1;
    rev key = {(uint16_t)c, 0};
    const rev *r = bsearch(&key, REV[e], 128, sizeof(rev), cmp_rev);
    return r ? r->b : -1;
}

/* whether every character of t can be encoded in e (possible_encoding) */
static int possible(int e, const UChar32 *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (encode_char(e, t[i]) < 0) return 0;
    return 1;
}

/* ALTERED_UTF8_RE: UTF-8 that would be valid but for a 0xA0 made a space;
 * the length of its match at b[i], or 0 */
static size_t altered_at(const unsigned char *b, size_t i, size_t n)
{
#define CONT_NOT_85_A0(x) (((x) >= 0x80 && (x) <= 0x84) || ((x) >= 0x86 && (x) <= 0x9F) || ((x) >= 0xA1 && (x) <= 0xBF))
#define ANYCONT(x) ((x) >= 0x80 && (x) <= 0xBF)
    unsigned c = b[i];
    if (i + 1 < n && (c == 0xC2 || c == 0xC3 || c == 0xC5 || c == 0xCE || c == 0xD0 || c == 0xD9) && b[i + 1] == ' ')
        return 2;
    if (i + 2 < n && (c == 0xE2 || c == 0xE3) && b[i + 1] == ' ' && CONT_NOT_85_A0(b[i + 2])) return 3;
    if (i + 2 < n && c >= 0xE0 && c <= 0xE3 && CONT_NOT_85_A0(b[i + 1]) && b[i + 2] == ' ') return 3;
    if (i + 3 < n && c == 0xF0) {
        unsigned x = b[i + 1], y = b[i + 2], z = b[i + 3];
        if (x == ' ' && ANYCONT(y) && ANYCONT(z)) return 4;
        if (ANYCONT(x) && y == ' ' && ANYCONT(z)) return 4;
        if (ANYCONT(x) && ANYCONT(y) && z == ' ') return 4;
    }
    return 0;
}

/* LOSSY_UTF8_RE: UTF-8 with lost continuation bytes (0x1A standing for
 * what decoded as U+FFFD, or one '?'); the length of its match at b[i] */
static size_t lossy_at(const unsigned char *b, size_t i, size_t n)
{
#define Q1A(x) ((x) == 0x1A || (x) == '?')
#define C1A(x) ((x) == 0x1A || ANYCONT(x))
#define QC1A(x) ((x) == 0x1A || (x) == '?' || ANYCONT(x))
    unsigned c = b[i];
    size_t left = n - i;
    if (c >= 0xC2 && c <= 0xDF && left >= 2 && b[i + 1] == 0x1A) return 2;
    if ((c == 0xC2 || c == 0xC3) && left >= 2 && b[i + 1] == '?') return 2;
    if (c == 0xED && left >= 6 && b[i + 1] >= 0xA0 && b[i + 1] <= 0xAF && b[i + 3] == 0xED && b[i + 4] >= 0xB0 &&
        b[i + 4] <= 0xBF) {
        if (Q1A(b[i + 2]) && QC1A(b[i + 5])) return 6;
        if (QC1A(b[i + 2]) && Q1A(b[i + 5])) return 6;
    }
    if (c >= 0xE0 && c <= 0xEF && left >= 3) {
        if (Q1A(b[i + 1]) && C1A(b[i + 2])) return 3;
        if (C1A(b[i + 1]) && Q1A(b[i + 2])) return 3;
    }
    if (c >= 0xF0 && c <= 0xF4 && left >= 4) {
        if (Q1A(b[i + 1]) && C1A(b[i + 2]) && C1A(b[i + 3])) return 4;
        if (C1A(b[i + 1]) && Q1A(b[i + 2]) && C1A(b[i + 3])) return 4;
        if (C1A(b[i + 1]) && C1A(b[i + 2]) && Q1A(b[i + 3])) return 4;
    }
    if (c == 0x1A) return 1;
    return 0;
}

/* Strict UTF-8 (Python's decoder) of b, or with variants also CESU-8
 * surrogate pairs and C0 80 (ftfy's utf-8-variants); into out (room for n
 * code points). The count, or -1 when b does not decode. */
static long decode_utf8(const unsigned char *b, size_t n, int variants, UChar32 *out)
{
    size_t i = 0, k = 0;
    while (i < n) {
        unsigned c = b[i];
        if (c < 0x80) {
            out[k++] = (UChar32)c;
            i++;
            continue;
        }
        if (variants && c == 0xC0 && i + 1 < n && b[i + 1] == 0x80) {
            out[k++] = 0;
            i += 2;
            continue;
        }
        if (variants && c == 0xED && i + 5 < n && b[i + 1] >= 0xA0 && b[i + 1] <= 0xAF && ANYCONT(b[i + 2]) &&
            b[i + 3] == 0xED && b[i + 4] >= 0xB0 && b[i + 4] <= 0xBF && ANYCONT(b[i + 5])) {
            out[k++] = (UChar32)((((UChar32)b[i + 1] & 0x0F) << 16) + (((UChar32)b[i + 2] & 0x3F) << 10) +
                                 (((UChar32)b[i + 4] & 0x0F) << 6) + ((UChar32)b[i + 5] & 0x3F) + 0x10000);
            i += 6;
            continue;
        }
        int len;
        UChar32 min;
        if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80;
        else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800;
        else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000;
        else return -1;
        if (i + (size_t)len > n) return -1;
        UChar32 cp = (UChar32)(c & (0x3Fu >> (len - 1)));
        for (int j = 1; j < len; j++) {
            if (!ANYCONT(b[i + j])) return -1;
            cp = (cp << 6) | (b[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
        out[k++] = cp;
        i += (size_t)len;
    }
    return (long)k;
}

/* ---- fix_encoding */

typedef struct ft {
    ck_ftfy_scratch *s;
    int oom;
} ft;

static const UChar32 *fix_encoding(ft *f, int level, const UChar32 *t, size_t n, size_t *outn);

/* UTF8_DETECTOR_RE's unit at t[i]: a character that starts a UTF-8
 * sequence in a Latin-1-like encoding and its continuations; its length
 * or 0 (the alternatives in the expression's order) */
static size_t utf8_unit(const UChar32 *t, size_t i, size_t n)
{
    static const uint32_t first[3] = {FT_UTF8_FIRST_OF_2, FT_UTF8_FIRST_OF_3, FT_UTF8_FIRST_OF_4};
    uint32_t c = cls(t[i]);
    for (size_t k = 0; k < 3; k++) {
        size_t len = k + 2;
        if (!(c & first[k]) || n - i < len) continue;
        size_t j = 1;
        while (j < len && (cls(t[i + j]) & FT_UTF8_CONTINUATION)) j++;
        if (j == len) return len;
    }
    return 0;
}

/* decode_inconsistent_utf8: each run of such units (not just after a
 * strict continuation character) that is shorter than the text and bad is
 * fixed by itself; into out (room for n). Its length, or -1 out of memory. */
static long decode_inconsistent(ft *f, int level, const UChar32 *t, size_t n, UChar32 *out)
{
    size_t i = 0, k = 0;
    while (i < n) {
        size_t u;
        if ((i == 0 || !(cls(t[i - 1]) & FT_UTF8_CONTINUATION_STRICT)) && (u = utf8_unit(t, i, n))) {
            size_t j = i + u;
            while (j < n && (u = utf8_unit(t, j, n))) j += u;
            const UChar32 *piece = t + i;
            size_t pn = j - i;
            if (pn < n && level + 1 < MAX_LEVEL && ck_ftfy_is_bad(piece, pn)) {
                piece = fix_encoding(f, level + 1, piece, pn, &pn);
                if (!piece) return -1;
            }
            /* a fixed piece is never longer than it was (UTF-8 decoding shrinks) */
            memcpy(out + k, piece, pn * sizeof *out);
            k += pn;
            i = j;
        } else {
            out[k++] = t[i++];
        }
    }
    return (long)k;
}

/* One step of fix_encoding (ftfy's _fix_encoding_one_step_and_explain): 1
 * with the changed text in the level's next slot, 0 unchanged, -1 out of
 * memory. */
static int one_step(ft *f, int level, const UChar32 *t, size_t n, size_t *outn)
{
    const int next = S_LEVEL + 4 * level + 1, by0 = next + 1, by1 = next + 2;
    if (n == 0) return 0;
    int ascii = 1;
    for (size_t i = 0; i < n && ascii; i++) ascii = t[i] < 0x80;
    if (ascii || !ck_ftfy_is_bad(t, n)) return 0;
    if (n > SIZE_MAX / 8) return -1;
    int poss[FT_NENC] = {0};
    for (int e = 0; e < FT_NENC; e++) {
        if (!possible(e, t, n)) continue;
        poss[e] = 1;
        unsigned char *b = grow(f->s, by0, n + 16);
        if (!b) return -1;
        for (size_t i = 0; i < n; i++) b[i] = (unsigned char)encode_char(e, t[i]);
        size_t bn = n;
        int altered = 0;
        if (strcmp(FT_ENC_NAME[e], "macroman") != 0)
            for (size_t i = 0; i < bn && !altered; i++) altered = altered_at(b, i, bn) != 0;
        if (altered) {
            /* restore_byte_a0: "Ã " that is not the word "à" gets its 0xA0
             * back (a byte more for two), then each ALTERED_UTF8_RE match
             * has its spaces made 0xA0 */
            unsigned char *o = grow(f->s, by1, 2 * bn + 16);
            if (!o) return -1;
            b = f->s->buf[by0];
            size_t k = 0;
            for (size_t i = 0; i < bn;) {
                if (b[i] == 0xC3 && i + 1 < bn && b[i + 1] == ' ') {
                    const unsigned char *r = b + i + 2;
                    size_t left = bn - i - 2;
                    int word = (left >= 1 && r[0] == ' ') || (left >= 5 && !memcmp(r, "quele", 5)) ||
                               (left >= 5 && !memcmp(r, "quela", 5)) || (left >= 5 && !memcmp(r, "quilo", 5)) ||
                               (left >= 2 && r[0] == 's' && r[1] == ' ');
                    if (!word) {
                        o[k++] = 0xC3;
                        o[k++] = 0xA0;
                        o[k++] = ' ';
                        i += 2;
                        continue;
                    }
                }
                o[k++] = b[i++];
            }
            bn = k;
            for (size_t i = 0; i < bn;) {
                size_t m = altered_at(o, i, bn);
                if (!m) {
                    i++;
                    continue;
                }
                for (size_t j = i; j < i + m; j++)
                    if (o[j] == ' ') o[j] = 0xA0;
                i += m;
            }
            swap_slots(f->s, by0, by1);
            b = o;
        }
        if (FT_ENC_SLOPPY[e]) {
            /* replace_lossy_sequences: each match becomes U+FFFD's three bytes */
            if (bn > SIZE_MAX / 4) return -1;
            unsigned char *o = grow(f->s, by1, 3 * bn + 16);
            if (!o) return -1;
            b = f->s->buf[by0];
            size_t k = 0;
            for (size_t i = 0; i < bn;) {
                size_t m = lossy_at(b, i, bn);
                if (m) {
                    o[k++] = 0xEF;
                    o[k++] = 0xBF;
                    o[k++] = 0xBD;
                    i += m;
                } else {
                    o[k++] = b[i++];
                }
            }
            bn = k;
            swap_slots(f->s, by0, by1);
            b = o;
        }
        int variants = memchr(b, 0xED, bn) || memchr(b, 0xC0, bn);
        UChar32 *out = grow32(f->s, next, bn);
        if (!out) return -1;
        b = f->s->buf[by0];
        long got = decode_utf8(b, bn, variants, out);
        if (got >= 0) {
            *outn = (size_t)got;
            return 1;
        }
    }
    UChar32 *out = grow32(f->s, next, n);
    if (!out) return -1;
    int detected = 0;
    for (size_t i = 0; i < n && !detected; i++)
        detected = (i == 0 || !(cls(t[i - 1]) & FT_UTF8_CONTINUATION_STRICT)) && utf8_unit(t, i, n);
    if (detected) {
        long got = decode_inconsistent(f, level, t, n, out);
        if (got < 0) return -1;
        out = f->s->buf[next];
        if (!same(t, n, out, (size_t)got)) {
            *outn = (size_t)got;
            return 1;
        }
    }
    if (poss[0]) {
        /* Latin-1 read as Windows-1252 (strict: five bytes are undefined) */
        int ok = 1, changed = 0;
        for (size_t i = 0; i < n && ok; i++) {
            UChar32 c = t[i];
            if (c >= 0x80 && c < 0xA0) {
                ok = c != 0x81 && c != 0x8D && c != 0x8F && c != 0x90 && c != 0x9D;
                out[i] = FT_ENC_HIGH[1][c - 0x80];
                changed = 1;
            } else {
                out[i] = c;
            }
        }
        if (ok && changed) {
            *outn = n;
            return 1;
        }
    }
    int c1 = 0;
    for (size_t i = 0; i < n; i++) {
        c1 |= t[i] >= 0x80 && t[i] < 0xA0;
        out[i] = t[i] >= 0x80 && t[i] < 0xA0 ? FT_ENC_HIGH[1][t[i] - 0x80] : t[i];
    }
    if (c1) {
        *outn = n;
        return 1;
    }
    return 0;
}

/* fix_encoding of t: the result (in the level's first slot, or t itself),
 * its length in *outn; NULL out of memory */
static const UChar32 *fix_encoding(ft *f, int level, const UChar32 *t, size_t n, size_t *outn)
{
    const int cur = S_LEVEL + 4 * level, next = cur + 1;
    UChar32 *a = grow32(f->s, cur, n);
    if (!a) return NULL;
    memcpy(a, t, n * sizeof *a);
    for (int pass = 0; pass < CK_FTFY_MAX_PASSES; pass++) {
        size_t m = 0;
        int r = one_step(f, level, f->s->buf[cur], n, &m);
        if (r < 0) return NULL;
        if (r == 0 || same(f->s->buf[cur], n, f->s->buf[next], m)) break;
        swap_slots(f->s, cur, next);
        n = m;
    }
    *outn = n;
    return f->s->buf[cur];
}

/* ---- HTML entities */

static int cmp_entity(const void *key, const void *e)
{
    return strcmp(key, ((const struct ft_entity *)e)->name);
}

static int ascii_alnum(UChar32 c) { return ascii_letter(c) || (c >= '0' && c <= '9'); }

/* html.unescape of a numeric reference &#...; whose middle is m (n
 * characters, after the '#'): its characters into out, their count, or -1
 * when html.unescape would leave a ';' (the reference is then kept) */
static int numeric_entity(const UChar32 *m, size_t n, UChar32 *out)
{
    int hex = m[0] == 'x' || m[0] == 'X';
    size_t i = hex ? 1 : 0;
    if (i == n) return -1;
    uint64_t v = 0;
    for (; i < n; i++) {
        int d;
        UChar32 c = m[i];
        if (c >= '0' && c <= '9') d = c - '0';
        else if (hex && c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (hex && c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return -1; /* html.unescape stops before it: the ';' stays */
        if (v < 0x1000000) v = v * (hex ? 16 : 10) + (uint64_t)d;
    }
    UChar32 c;
    if (v == 0) c = 0xFFFD;
    else if (v == 0x0D) c = '\r';
    else if (v >= 0x80 && v <= 0x9F) c = FT_ENC_HIGH[1][v - 0x80]; /* as Windows-1252, five as themselves */
    else if ((v >= 0xD800 && v <= 0xDFFF) || v > 0x10FFFF) c = 0xFFFD;
    else if ((v >= 0x01 && v <= 0x08) || v == 0x0B || (v >= 0x0E && v <= 0x1F) || v == 0x7F ||
             (v >= 0xFDD0 && v <= 0xFDEF) || (v & 0xFFFE) == 0xFFFE)
        return 0; /* html.unescape drops it */
    else c = (UChar32)v;
    if (c == ';') return -1;
    out[0] = c;
    return 1;
}

/* unescape_html: each &name; or &#...; (at most 24 letters and digits
 * between & and ;) that stands for something, replaced; into out (room
 * for n). Its length. */
static size_t unescape_html(const UChar32 *t, size_t n, UChar32 *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (t[i] == '&') {
            size_t j = i + 1;
            int num = j < n && t[j] == '#';
            j += num;
            size_t e = j;
            while (e < n && e - j <= 24 && ascii_alnum(t[e])) e++;
            if (e > j && e - j <= 24 && e < n && t[e] == ';') {
                int got = -1;
                UChar32 rep[3];
                if (num) {
                    got = numeric_entity(t + j, e - j, rep);
                } else {
                    char name[32];
                    for (size_t q = j; q < e; q++) name[q - j] = (char)t[q];
                    name[e - j] = 0;
                    const struct ft_entity *hit =
                        bsearch(name, FT_ENTITIES, sizeof FT_ENTITIES / sizeof FT_ENTITIES[0], sizeof FT_ENTITIES[0], cmp_entity);
                    if (hit) {
                        got = 0;
                        while (got < 3 && hit->cp[got]) rep[got] = (UChar32)hit->cp[got], got++;
                    }
                }
                if (got >= 0) {
                    for (int q = 0; q < got; q++) out[k++] = rep[q];
                    i = e + 1;
                    continue;
                }
            }
        }
        out[k++] = t[i++];
    }
    return k;
}

/* ---- the character-level fixes, in ftfy's order */

/* fix_c1_controls, fix_latin_ligatures, fix_character_width and
 * uncurl_quotes, each a map of single characters, applied in turn; into
 * out (room for 3 n). Its length. */
static size_t char_fixes(const UChar32 *t, size_t n, UChar32 *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        UChar32 c = t[i], lig[3] = {c, 0, 0};
        int nl = 1;
        if (c >= 0x80 && c < 0xA0) lig[0] = c = FT_ENC_HIGH[1][c - 0x80];
        if ((c >= 0x132 && c <= 0x1F3) || (c >= 0xFB00 && c <= 0xFB06)) {
            for (size_t q = 0; q < sizeof FT_LIGATURES / sizeof FT_LIGATURES[0]; q++) {
                if (FT_LIGATURES[q].cp != c) continue;
                for (nl = 0; nl < 3 && FT_LIGATURES[q].to[nl]; nl++) lig[nl] = FT_LIGATURES[q].to[nl];
                break;
            }
        }
        for (int r = 0; r < nl; r++) {
            UChar32 d = lig[r], w[2] = {d, 0};
            int nw = 1;
            if (d == 0x3000) w[0] = ' ';
            else if (d >= 0xFF01 && d < 0xFFF0 && WIDTH[d - 0xFF01][0])
                w[0] = WIDTH[d - 0xFF01][0], w[1] = WIDTH[d - 0xFF01][1], nw = w[1] ? 2 : 1;
            for (int q = 0; q < nw; q++) {
                UChar32 x = w[q];
                if (x == 0x02BC || (x >= 0x2018 && x <= 0x201B)) x = '\'';
                else if (x >= 0x201C && x <= 0x201F) x = '"';
                out[k++] = x;
            }
        }
    }
    return k;
}

/* remove_control_chars' set */
static int control(UChar32 c)
{
    return (c >= 0 && c <= 8) || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F || (c >= 0x206A && c <= 0x206F) ||
           c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
}

/* ANSI_RE: ESC [ (digits or ;)* letter; its length at t[i], or 0 */
static size_t ansi_at(const UChar32 *t, size_t i, size_t n)
{
    if (t[i] != 0x1B || i + 1 >= n || t[i + 1] != '[') return 0;
    size_t j = i + 2;
    while (j < n && (t[j] == ';' || py_digit(t[j]))) j++;
    return j < n && ascii_letter(t[j]) ? j + 1 - i : 0;
}

/* fix_line_breaks, remove_terminal_escapes, remove_control_chars in turn
 * (each a pass over what the one before made); into out (room for n). Its
 * length. */
static size_t line_fixes(UChar32 *t, size_t n, UChar32 *out)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        UChar32 c = t[i];
        if (c == '\r' && i + 1 < n && t[i + 1] == '\n') continue; /* the \n follows */
        if (c == '\r' || c == 0x2028 || c == 0x2029 || c == 0x85) c = '\n';
        t[k++] = c;
    }
    n = k;
    k = 0;
    for (size_t i = 0; i < n;) {
        size_t m = ansi_at(t, i, n);
        if (m) {
            i += m;
            continue;
        }
        if (!control(t[i])) out[k++] = t[i];
        i++;
    }
    return k;
}

/* NFC of t into out (room for n... grown as needed in the slot) */
static const UChar32 *nfc(ft *f, const UChar32 *t, size_t n, int dst, size_t *outn)
{
    if (n > (size_t)INT32_MAX / 4) return NULL;
    UChar *u = grow(f->s, S_U16_IN, (2 * n + 16) * sizeof(UChar));
    if (!u) return NULL;
    int32_t un = 0;
    for (size_t i = 0; i < n; i++) U16_APPEND_UNSAFE(u, un, t[i]);
    UErrorCode ec = U_ZERO_ERROR;
    const UNormalizer2 *nf = unorm2_getNFCInstance(&ec);
    if (U_FAILURE(ec)) return NULL;
    size_t cap = (size_t)un * 3 + 16;
    UChar *v;
    int32_t vn;
    for (;;) {
        if (cap > INT32_MAX) return NULL;
        v = grow(f->s, S_U16_OUT, cap * sizeof(UChar));
        if (!v) return NULL;
        ec = U_ZERO_ERROR;
        vn = unorm2_normalize(nf, u, un, v, (int32_t)cap, &ec);
        if (ec == U_BUFFER_OVERFLOW_ERROR) {
            cap = (size_t)vn + 16;
            continue;
        }
        if (U_FAILURE(ec)) return NULL;
        break;
    }
    UChar32 *o = grow32(f->s, dst, (size_t)vn);
    if (!o) return NULL;
    size_t k = 0;
    for (int32_t i = 0; i < vn;) {
        UChar32 c;
        U16_NEXT(v, i, vn, c);
        o[k++] = c;
    }
    *outn = k;
    return o;
}

/* fix_and_explain of one line: passes until one changes nothing. The result
 * in S_SEG_A. */
static int fix_segment(ft *f, const UChar32 *t, size_t n, int html, size_t *outn, ck_ftfy_poll poll, void *pud)
{
    UChar32 *a = grow32(f->s, S_SEG_A, n);
    if (!a) return -1;
    memcpy(a, t, n * sizeof *a);
    for (int pass = 0; pass < CK_FTFY_MAX_PASSES; pass++) {
        UChar32 *orig = grow32(f->s, S_SEG_ORIG, n);
        if (!orig) return -1;
        a = f->s->buf[S_SEG_A];
        memcpy(orig, a, n * sizeof *a);
        size_t m = n;
        if (html) {
            UChar32 *b = grow32(f->s, S_SEG_B, n);
            if (!b) return -1;
            m = unescape_html(a, n, b);
            swap_slots(f->s, S_SEG_A, S_SEG_B);
        }
        const UChar32 *e = fix_encoding(f, 0, f->s->buf[S_SEG_A], m, &m);
        if (!e) return -1;
        if (m > SIZE_MAX / 4) return -1;
        UChar32 *b = grow32(f->s, S_SEG_B, 3 * m);
        if (!b) return -1;
        m = char_fixes(e, m, b);
        a = grow32(f->s, S_SEG_A, m);
        if (!a) return -1;
        b = f->s->buf[S_SEG_B];
        m = line_fixes(b, m, a);
        if (!nfc(f, a, m, S_SEG_B, &m)) return -1;
        swap_slots(f->s, S_SEG_A, S_SEG_B);
        if (poll) poll(pud, (long long)n + 1);
        int done = same(f->s->buf[S_SEG_A], m, f->s->buf[S_SEG_ORIG], n);
        n = m;
        if (done) break;
    }
    *outn = n;
    return 0;
}

const UChar32 *ck_ftfy_fix_text(const UChar32 *t, size_t n, ck_ftfy_scratch *s, size_t *outn, ck_ftfy_poll poll,
                                void *pud)
{
    pthread_once(&tables_once, make_tables);
    ft f = {s, 0};
    size_t k = 0, pos = 0;
    int html = 1;
    UChar32 *out = grow32(s, S_OUT, n);
    if (!out) return NULL;
    while (pos < n) {
        size_t brk = pos;
        while (brk < n && t[brk] != '\n') brk++;
        brk = brk < n ? brk + 1 : n;
        if (brk - pos > MAX_SEGMENT) brk = pos + MAX_SEGMENT;
        /* "auto": no unescaping from the first line that holds a '<' on */
        for (size_t i = pos; i < brk && html; i++) html = t[i] != '<';
        size_t m;
        if (fix_segment(&f, t + pos, brk - pos, html, &m, poll, pud)) return NULL;
        out = grow32(s, S_OUT, k + m);
        if (!out) return NULL;
        memcpy(out + k, s->buf[S_SEG_A], m * sizeof *out);
        k += m;
        pos = brk;
    }
    *outn = k;
    return out;
}
