/* The T5 tokenizer (Flux.1's second text encoder) as transformers 5's
 * T5Tokenizer runs it, around libsentencepiece's unigram search
 * (vm/text/spm_shim.h). Knows nothing of Lua: the binding (vm/lua/lua_spm.c)
 * reads the files, charges memory, polls, and calls the library.
 *
 * transformers 5 builds the same pipeline whatever file it starts from (an
 * spiece.model, or a tokenizer.json of transformers 4 or 5: it takes only the
 * vocabulary and the character map from those and drops their normalizer and
 * pre-tokenizer definitions). A caption goes through, in order:
 *   1. the special tokens (<pad>, </s>, <unk>, <extra_id_0> ...) are cut out
 *      of the raw text, leftmost first and the longest where several start at
 *      one byte, and become their ids;
 *   2. each piece between them is normalized with the model's precompiled
 *      character map as tokenizers' Precompiled normalizer does it: per
 *      extended grapheme cluster (ICU), a cluster shorter than 6 bytes is
 *      replaced whole by the string of the shortest map key that is a prefix
 *      of it, and otherwise (or when no key is) each character by the string
 *      of the shortest key that is a prefix of it, or kept;
 *   3. the result is split on Unicode White_Space (Rust's char::is_whitespace,
 *      the spaces dropped);
 *   4. each word that does not start with U+2581 gets one in front, and is cut
 *      before each U+2581 in it (tokenizers' Metaspace, prepend "always",
 *      split);
 *   5. each such piece is segmented by the unigram model (Viterbi, unknown
 *      characters one unknown id per run), the library's part;
 *   6. </s> is appended; truncation keeps the first max_length - 1 ids,
 *      padding appends <pad> up to max_length.
 * An spiece.model's vocabulary is its pieces (every type; CONTROL pieces are
 * ordinary entries, as in tokenizers' Unigram, so a normalized "</s>" in text
 * matches one) followed by <extra_id_N-1> ... <extra_id_0> with score 0.
 *
 * Unicode versions: grapheme clusters come from ICU (Debian 12's ICU 72:
 * Unicode 15.0), tokenizers takes them from unicode-segmentation (Unicode 16).
 * Only clusters shorter than 6 bytes are looked up whole, so the two differ
 * only where a character added after 15.0 extends a short cluster. The
 * library sums piece scores in float, tokenizers in double: two segmentations
 * whose scores tie to float precision may resolve differently. */
#ifndef CK_SPM_TOK_H
#define CK_SPM_TOK_H

#include "text/spm_model.h"

#include <jansson.h>

#include <stddef.h>
#include <stdint.h>

/* the most special tokens, and the most extra ids an spiece.model gets */
#define CK_SPM_MAX_SPECIALS 4096
#define CK_SPM_MAX_EXTRA_IDS 1024
#define CK_SPM_MAX_SPECIAL_BYTES 256

/* Names from tokenizer_config.json / special_tokens_map.json (NULL: T5's
 * "<pad>", "</s>", "<unk>") and the number of extra ids (-1: 100). */
typedef struct ck_spm_config {
    const char *pad, *eos, *unk;
    int extra_ids;
} ck_spm_config;

typedef struct ck_spm_special {
    uint32_t off, len; /* the token's text, in the vocabulary's strings */
    int32_t id;
    unsigned char b0;  /* its first byte */
} ck_spm_special;

typedef struct ck_spm_entry {
    uint32_t off, len; /* the entry's text: str + off, len bytes */
    float score;
} ck_spm_entry;

typedef struct ck_spm_tok {
    /* the vocabulary: n entries, their strings in str */
    char *str;
    size_t str_len, str_cap;
    ck_spm_entry *e;
    size_t cap;
    int n;
    int32_t *hash; /* open addressing over the entries, -1 empty; hcap a power of 2 */
    size_t hcap;
    /* the character map: a copy of the blob, checked (has_map 0: none) */
    uint8_t *blob;
    ck_spm_charsmap map;
    int has_map;
    /* special tokens by first byte, the longest first within one */
    ck_spm_special *sp;
    int nsp;
    int first[257]; /* sp[first[b] .. first[b + 1]) start with byte b */
    int32_t unk, eos, pad;
    const ck_spm_charge *charge;
    size_t charged;
} ck_spm_tok;

/* Both builders start from t zeroed; everything they allocate hangs from t
 * (free with ck_spm_tok_free, also after a failure or a jump out of poll). 0,
 * or -1 with a message in err (the caller adds the file). */

/* From a model ck_spm_model_read accepted: a unigram model whose piece 2 is
 * the unknown piece (transformers' T5Tokenizer takes id 2 for unknown), no
 * user-defined, byte or unused pieces; its character map checked. */
int ck_spm_tok_from_model(ck_spm_tok *t, const ck_spm_model *m, const ck_spm_config *cfg, const ck_spm_charge *c,
                          ck_spm_poll poll, void *poll_ud, char *err, size_t errlen);
/* From tokenizer.json's tree: model {type "Unigram", unk_id 2, vocab [[piece,
 * score], ...], byte_fallback false}, the first Precompiled normalizer's
 * character map (base64; none: no normalization), and added_tokens, each an
 * entry of the vocabulary with lstrip, rstrip, single_word and normalized
 * false. The tree's strings are copied. */
int ck_spm_tok_from_json(ck_spm_tok *t, const json_t *root, const ck_spm_config *cfg, const ck_spm_charge *c,
                         ck_spm_poll poll, void *poll_ud, char *err, size_t errlen);
void ck_spm_tok_free(ck_spm_tok *t);

/* The id of the entry spelled s[0..n), or -1. */
int32_t ck_spm_tok_id(const ck_spm_tok *t, const char *s, size_t n);

/* The model for libsentencepiece (ck_spm_write): the vocabulary, entry unk
 * marked UNKNOWN (which the library keeps apart from the pieces it matches in
 * text), and unk's string once more as entry n, an ordinary piece with its
 * score, so that text spelling "<unk>" matches it as it matches in
 * tokenizers' Unigram; the caller maps id n back to unk. Size as
 * ck_spm_write. */
size_t ck_spm_tok_proto(const ck_spm_tok *t, uint8_t *out, size_t cap);

/* Growable buffers for ck_spm_tok_split, owned by the caller (zeroed to
 * start); their bytes are charged to c as they grow. */
typedef struct ck_spm_scratch {
    char *buf[2];
    size_t cap[2];
    void *brk; /* ICU's grapheme iterator and the UText it reads, opened on first use */
    void *ut;
    const ck_spm_charge *charge;
    size_t charged;
} ck_spm_scratch;
void ck_spm_scratch_free(ck_spm_scratch *s);

/* Steps 1 to 4 over text[0..n) (valid UTF-8: ck_spm_utf8_check first): each
 * special token goes to special(ud, id) and each piece for the model to
 * piece(ud, s, len), in order; either returns nonzero to stop. 0 when done,
 * 1 when stopped, -1 with err set when a buffer could not be charged or
 * made. */
typedef struct ck_spm_sink {
    int (*special)(void *ud, int32_t id);
    int (*piece)(void *ud, const char *s, size_t len);
    void *ud;
} ck_spm_sink;
int ck_spm_tok_split(const ck_spm_tok *t, const char *text, size_t n, ck_spm_scratch *s, const ck_spm_sink *sink,
                     ck_spm_poll poll, void *poll_ud, char *err, size_t errlen);

#endif
