/* The CLIP byte-level BPE tokenizer: what transformers' slow CLIPTokenizer
 * (4.x) does to a caption, in C on ICU, with ftfy installed (as kohya-ss
 * sd-scripts' installs have it) or without. Knows nothing of Lua: the
 * binding (vm/lua/lua_text.c) opens the files and owns the scratch memory;
 * vm/text/text_file.h reads them.
 *
 * A caption goes through, in order:
 *   1. the special tokens (BOS, EOS, and the pad token when it is given as a
 *      string) are split out of the raw text, longest first, and become their
 *      ids;
 *   2. each piece between them is cleaned, by the tokenizer's caption fix:
 *      CK_CLIP_FIX_FTFY (ftfy installed): ftfy's fix_text (vm/text/ftfy.h),
 *      each run of White_Space made one space, the ends stripped, then the
 *      whole lower-cased as Python's str.lower does (full case mapping,
 *      final sigma);
 *      CK_CLIP_FIX_NONE (no ftfy): as transformers' BasicTokenizer
 *      (strip_accents=False, no punctuation split) cleans: NUL, U+FFFD and
 *      every character of a C* category other than \t \n \r removed; \t \n \r
 *      and Zs become spaces; spaces put around CJK ideographs; NFC; split on
 *      Python's str.isspace; each word lower-cased as str.lower does; the
 *      words joined by one space;
 *   3. the cleaned text is cut by CLIP's pattern
 *      <|startoftext|> | <|endoftext|> | 's|'t|'re|'ve|'m|'ll|'d | \p{L}+ |
 *      \p{N} | [^\s\p{L}\p{N}]+ (case-insensitive, as the slow tokenizer
 *      compiles it);
 *   4. each piece's UTF-8 bytes become the printable characters of CLIP's
 *      byte-to-unicode table, "</w>" marks the last, and the lowest-ranked
 *      merge is applied everywhere it occurs until none applies;
 *   5. each resulting symbol becomes its vocabulary id (the unknown token,
 *      <|endoftext|>, when the vocabulary lacks it).
 *
 * transformers 5 dropped the slow tokenizer: its CLIPTokenizer (the Rust
 * one) keeps control and format characters, puts no spaces around CJK
 * ideographs and lower-cases character by character, so it differs on such
 * text (96 of the 286 reference strings with the full vocabulary); ckrun
 * follows the slow one, which SDXL trainers of the 4.x era ran.
 *
 * Unicode versions: character properties, case mapping and NFC come from
 * ICU (Debian 12's ICU 72: Unicode 15.0), the reference from Python 3.11
 * (unicodedata 14.0). Where Python's unicodedata decides (the cleanup),
 * characters first assigned after Unicode 14.0 are treated as unassigned
 * (Cn), so they are removed as Python 3.11 removes them
 * (CK_CLIP_UNICODE_AGE); CLIP's pattern (step 3) takes ICU's properties, as
 * the regex module brings its own, newer tables. A property that changed
 * between the two versions for an older character follows ICU.
 *
 * The tables come from a folder's vocab.json and merges.txt, from
 * tokenizers' tokenizer.json (what transformers 5 saves), or from CLIP's
 * bpe file; building them charges their memory to a guard and polls it. */
#ifndef CK_CLIP_BPE_H
#define CK_CLIP_BPE_H

#include "text/ftfy.h"
#include "text/text_file.h"

#include <jansson.h>

#include <stddef.h>
#include <stdint.h>

/* the Unicode version whose characters count as assigned (major, minor) */
#define CK_CLIP_UNICODE_AGE_MAJOR 14
#define CK_CLIP_UNICODE_AGE_MINOR 0

/* CLIP's merges: line 1 of merges.txt (a header) is skipped and at most
 * this many are read, as the slow tokenizer reads them */
#define CK_CLIP_MAX_MERGES (49152 - 256 - 2)

typedef struct ck_clip_bpe ck_clip_bpe;

/* Growable buffers that tokenizing uses; owned by the caller (zeroed to
 * start, ck_clip_scratch_free at the end). The functions below allocate only
 * into it, so a poll callback that never returns (a longjmp) leaks nothing
 * as long as the caller frees the scratch later. */
typedef struct ck_clip_scratch {
    void *buf[10];
    size_t cap[10];
    ck_ftfy_scratch ft;
} ck_clip_scratch;
void ck_clip_scratch_free(ck_clip_scratch *s);

/* Called every few thousand units of work; may longjmp (see above). */
typedef void (*ck_clip_poll)(void *ud, long long work);

/* The tables' memory is charged to g (copied; NULL: to nothing) as it
 * grows and given back by ck_clip_bpe_free; building polls g, and a stop
 * fails with CK_TEXT_STOPPED. A failure returns NULL with a message in err
 * (which names what is wrong but not the file: the caller adds it). */

/* A tokenizer from vocab.json's parsed object (token -> id) and a
 * merges.txt text ("a b" per line, the first line a header). */
ck_clip_bpe *ck_clip_bpe_from_vocab(const json_t *vocab, const char *merges, size_t mlen, const ck_text_guard *g,
                                    char *err, size_t errlen);
/* The same from vocab.json's text (parsed by ck_text_json). */
ck_clip_bpe *ck_clip_bpe_from_files(const char *vocab, size_t vlen, const char *merges, size_t mlen,
                                    const ck_text_guard *g, char *err, size_t errlen);
/* A tokenizer from tokenizers' tokenizer.json (parsed): its BPE model's
 * vocab and merges ("a b" or ["a", "b"], at most CK_CLIP_MAX_MERGES used, as
 * from merges.txt), checked first: the model must be BPE with CLIP's
 * end-of-word suffix "</w>" and no subword prefix; added_tokens that the
 * vocab lacks join it, and one whose id disagrees with the vocab's is
 * refused. */
ck_clip_bpe *ck_clip_bpe_from_tokenizer_json(const json_t *root, const ck_text_guard *g, char *err, size_t errlen);
/* A tokenizer from the text of open_clip's / CLIP's bpe_simple_vocab_16e6.txt
 * (already decompressed): merges from line 2 on (at most CK_CLIP_MAX_MERGES),
 * and the vocabulary CLIP builds from them: the 256 byte characters, the
 * same with "</w>", each merge joined, then <|startoftext|> and
 * <|endoftext|>. */
ck_clip_bpe *ck_clip_bpe_from_merges(const char *text, size_t len, const ck_text_guard *g, char *err, size_t errlen);
void ck_clip_bpe_free(ck_clip_bpe *t);

/* How a caption is cleaned (step 2 above); a new tokenizer has FTFY. */
enum { CK_CLIP_FIX_FTFY, CK_CLIP_FIX_NONE };
void ck_clip_bpe_set_fix(ck_clip_bpe *t, int fix);
int ck_clip_bpe_fix(const ck_clip_bpe *t);

/* The id of token (n bytes), or -1. */
int32_t ck_clip_bpe_id(const ck_clip_bpe *t, const char *tok, size_t n);
/* Entries in the vocabulary (one more than the largest id when ids are dense). */
int32_t ck_clip_bpe_vocab_size(const ck_clip_bpe *t);
/* ids of <|startoftext|> and <|endoftext|> (-1 if the vocabulary lacks them) */
int32_t ck_clip_bpe_bos(const ck_clip_bpe *t);
int32_t ck_clip_bpe_eos(const ck_clip_bpe *t);
/* Makes tok (n bytes) a special token too (the pad token given by name):
 * split out of raw text like BOS and EOS. 0, or -1 when it is not in the
 * vocabulary or there are already 8. */
int ck_clip_bpe_add_special(ck_clip_bpe *t, const char *tok, size_t n);

/* Where the first invalid UTF-8 sequence of s starts, or n when s is valid. */
size_t ck_clip_utf8_check(const char *s, size_t n);

/* Tokenizes the n bytes of text (valid UTF-8: check first). Each token is
 * passed to emit with its id and its text (the BPE symbol as the vocabulary
 * spells it, or the special token); emit returns nonzero to stop early (a
 * truncated encode). -1 when out of memory, else 0. */
typedef int (*ck_clip_emit)(void *ud, int32_t id, const char *tok, size_t n);
int ck_clip_bpe_run(const ck_clip_bpe *t, const char *text, size_t n, ck_clip_scratch *s,
                    ck_clip_emit emit, void *emit_ud, ck_clip_poll poll, void *poll_ud);

/* What ck_clip_bpe_run's step 2 makes of one piece of text (valid UTF-8)
 * with caption fix fix: the cleaned text, NUL-terminated, in s (valid until
 * the next call); NULL when out of memory. poll as ck_clip_bpe_run's. */
const char *ck_clip_clean(const char *text, size_t n, int fix, ck_clip_scratch *s, size_t *outlen, ck_clip_poll poll,
                          void *poll_ud);

/* CLIP's encoding of ids (n of them, no BOS or EOS) to max_length (>= 2):
 * BOS, at most max_length - 2 ids, EOS, then pad up to max_length when pad
 * >= 0 (no padding when pad < 0). Writes out (max_length entries at most);
 * returns the count. */
int ck_clip_frame(const ck_clip_bpe *t, const int32_t *ids, size_t n, int max_length, int32_t pad, int32_t *out);

/* kohya-ss sd-scripts' long captions (--max_token_length 150 or 225): the
 * caption framed to 75 * k + 2 with padding (ck_clip_frame), then cut into k
 * chunks of 77: BOS, the next 75 entries after the first, and the frame's
 * last entry. When pad differs from EOS (SDXL's second tokenizer), a chunk
 * whose 76th entry is neither EOS nor pad ends in EOS instead, and one whose
 * second entry is pad gets EOS there. out: k * 77 entries. */
void ck_clip_chunks(const ck_clip_bpe *t, const int32_t *ids, size_t n, int k, int32_t pad, int32_t *out);

#endif
