/* ftfy's fix_text (ftfy 6.3 at its default settings) in C on ICU: what
 * transformers' slow CLIPTokenizer does to a caption first when ftfy is
 * installed, as kohya-ss sd-scripts' installs have it. Knows nothing of Lua.
 *
 * The text is fixed a line at a time (a segment ends after '\n', or after
 * 1,000,000 characters), and each line by passes of these steps, in ftfy's
 * order, until a pass changes nothing:
 *   1. HTML entities unescaped (named ones by HTML5's list, also upper-cased
 *      ones such as &EACUTE;; numeric ones as Python's html.unescape), unless
 *      this line or an earlier one holds a '<';
 *   2. mojibake repaired: text that ftfy's heuristic finds bad is encoded
 *      again in the first of its single-byte encodings (Latin-1, Windows-1252,
 *      -1251, -1250, -1253, -1254, -1257, ISO-8859-2, MacRoman, CP437) that
 *      can hold it and whose bytes decode as UTF-8 (a space restored to the
 *      no-break space it stood for, sequences with lost bytes decoded as
 *      U+FFFD, CESU-8 and Java's C0 80 accepted); else UTF-8 sequences
 *      embedded in good text fixed one by one; else C1 controls read as
 *      Windows-1252; repeated until it changes nothing;
 *   3. C1 controls as Windows-1252, Latin ligatures taken apart, fullwidth
 *      and halfwidth forms folded (their NFKC, U+3000 a space), curly quotes
 *      made straight, line breaks made '\n', terminal escapes and control
 *      characters (not \t \n \f \r) removed, NFC.
 * Characters are classified as Python 3.11 does (Unicode 14.0; see
 * clip_bpe.h). A line still changing after CK_FTFY_MAX_PASSES passes keeps
 * its last pass (ftfy goes on; only entities or mojibake nested that deep
 * do), which keeps the work linear in the text. */
#ifndef CK_FTFY_H
#define CK_FTFY_H

#include <stddef.h>
#include <unicode/umachine.h>

#define CK_FTFY_MAX_PASSES 32

/* Growable buffers, owned by the caller (zeroed to start,
 * ck_ftfy_scratch_free at the end); fixing allocates only into them. */
typedef struct ck_ftfy_scratch {
    void *buf[24];
    size_t cap[24];
} ck_ftfy_scratch;
void ck_ftfy_scratch_free(ck_ftfy_scratch *s);

/* Called between passes with the work done; may longjmp (the scratch holds
 * everything allocated). */
typedef void (*ck_ftfy_poll)(void *ud, long long work);

/* fix_text of the n code points at text (valid scalar values): the result
 * in the scratch (valid until the next call), its length in *outn; NULL
 * when out of memory. */
const UChar32 *ck_ftfy_fix_text(const UChar32 *text, size_t n, ck_ftfy_scratch *s, size_t *outn, ck_ftfy_poll poll,
                                void *pud);

/* ftfy's badness heuristic: nonzero when the n code points look like
 * mojibake. For tests. */
int ck_ftfy_is_bad(const UChar32 *text, size_t n);

#endif
