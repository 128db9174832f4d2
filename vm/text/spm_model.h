/* sentencepiece's model file (a ModelProto in protobuf's wire format, the
 * spiece.model of T5) read and checked by a reader of ckrun's own, and the
 * model ckrun writes for libsentencepiece (vm/text/spm_shim.h). Knows nothing
 * of Lua: the binding (vm/lua/lua_spm.c) reads the file, charges memory and
 * polls for interrupts through the callbacks below.
 *
 * Why a reader of our own: Debian's libsentencepiece (0.1.97) parses a model
 * with the protobuf-lite it bundles and trusts what it finds. A piece holding
 * a NUL byte aborts it (darts-clone throws), a character map whose trie points
 * outside itself is read out of bounds, and a model of a million pieces loads
 * in one call that nothing can stop. ckrun therefore never hands a user's file
 * to the library: it reads the file here, strictly (every varint, length,
 * nesting level, count and string checked against the bytes and the limits
 * below, before anything is allocated for it), checks the normalizer's
 * character map as a whole, and gives the library only a model it wrote
 * itself from the checked pieces (ck_spm_write). */
#ifndef CK_SPM_MODEL_H
#define CK_SPM_MODEL_H

#include <stddef.h>
#include <stdint.h>

/* What a model may hold. The largest real sentencepiece models (mT5's
 * 250,112 pieces, Gemma's 256,000) take about 5 MB; T5's 32,000 pieces
 * take 792 KB, of which 237 KB are the nmt_nfkc character map. */
#define CK_SPM_MAX_FILE ((size_t)64 << 20)
#define CK_SPM_MAX_PIECES (1 << 20)
#define CK_SPM_MAX_PIECE_BYTES 1024
#define CK_SPM_MAX_CHARSMAP ((size_t)4 << 20)

/* ModelProto.SentencePiece.Type */
enum {
    CK_SPM_NORMAL = 1,
    CK_SPM_UNKNOWN = 2,
    CK_SPM_CONTROL = 3,
    CK_SPM_USER_DEFINED = 4,
    CK_SPM_UNUSED = 5,
    CK_SPM_BYTE = 6,
};

/* TrainerSpec.ModelType */
enum { CK_SPM_UNIGRAM = 1, CK_SPM_BPE = 2, CK_SPM_WORD = 3, CK_SPM_CHAR = 4 };

/* Memory charged before it is allocated: take returns 0, or -1 with a
 * message in err; give returns what take charged. NULL: nothing charged. */
typedef struct ck_spm_charge {
    int (*take)(void *ud, size_t n, const char *what, char *err, size_t errlen);
    void (*give)(void *ud, size_t n);
    void *ud;
} ck_spm_charge;

/* Called every few thousand units of work; may longjmp. Everything a
 * function below allocates is reachable from the struct the caller owns, so
 * the caller's cleanup frees it after such a jump. */
typedef void (*ck_spm_poll)(void *ud, long long work);

typedef struct ck_spm_piece {
    uint32_t off, len; /* the piece's bytes, at buf + off of the model */
    float score;
    int type;          /* CK_SPM_NORMAL, ... */
} ck_spm_piece;

typedef struct ck_spm_model {
    const uint8_t *buf; /* the file's bytes (not owned) */
    size_t len;
    ck_spm_piece *pieces; /* owned, charged */
    int npieces;
    int model_type;       /* TrainerSpec.model_type (UNIGRAM when absent) */
    int byte_fallback;
    /* NormalizerSpec: the character map (into buf; len 0 when absent) and
     * the flags libsentencepiece's own normalizer would follow */
    const uint8_t *charsmap;
    size_t charsmap_len;
    int add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces;
    const ck_spm_charge *charge; /* what pieces was charged to */
    size_t charged;
} ck_spm_model;

/* Reads and checks the ModelProto in buf[0..len) into m (zeroed first; free
 * with ck_spm_model_free, also after a failure or a jump out of poll). Every
 * field's wire type, every varint (at most 10 bytes, no bits past 64), every
 * length (within its message) and every tag is checked; groups (wire types 3
 * and 4, unused by sentencepiece, and the one way protobuf nests without a
 * length) are refused; fields ckrun does not know are skipped as protobuf
 * skips them; a known message that appears twice is refused. Pieces: at most
 * CK_SPM_MAX_PIECES, each present, 1 to CK_SPM_MAX_PIECE_BYTES bytes of valid
 * UTF-8 without NUL, a finite score and a known type. The character map is
 * only located here (ck_spm_charsmap_check checks it). 0, or -1 with a
 * message in err naming what is wrong and where (the caller adds the file). */
int ck_spm_model_read(ck_spm_model *m, const uint8_t *buf, size_t len, const ck_spm_charge *c, ck_spm_poll poll,
                      void *poll_ud, char *err, size_t errlen);
void ck_spm_model_free(ck_spm_model *m);

/* A precompiled character map (NormalizerSpec.precompiled_charsmap): a
 * little-endian u32 with the trie's size in bytes, a darts-clone double-array
 * trie of u32 units mapping UTF-8 keys to offsets into the normalized
 * strings that follow, each ending in NUL. */
typedef struct ck_spm_charsmap {
    const uint8_t *trie; /* nunits little-endian u32 (not owned) */
    size_t nunits;
    const char *normalized; /* not owned */
    size_t nlen;
    size_t max_replacement; /* the longest normalized string, in bytes */
} ck_spm_charsmap;

/* Checks the map in blob[0..len) (at most CK_SPM_MAX_CHARSMAP bytes) and
 * points cm into it. The trie's size must be a whole number of units, at
 * least one block of 256, within the blob. Every unit that a lookup can reach
 * as a node (every unit that is not a leaf) must keep its children's block of
 * 256 inside the trie, and a node that has a leaf must have a leaf unit there
 * whose value starts a normalized string: inside the strings, at the start of
 * a UTF-8 character. The strings must be valid UTF-8, each ending in NUL. A
 * lookup of any key then stays inside the blob (what darts-clone, and
 * libsentencepiece 0.1.97 with it, never checks). Allocates nothing; polls
 * every 64 Ki units. 0, or -1 with a message in err. */
int ck_spm_charsmap_check(ck_spm_charsmap *cm, const uint8_t *blob, size_t len, ck_spm_poll poll, void *poll_ud,
                          char *err, size_t errlen);

/* The normalized string of the shortest key in the map that is a prefix of
 * key[0..n) (the walk stops at a NUL byte, as tokenizers' does), its length
 * in *rlen; NULL when no key is. cm must have passed ck_spm_charsmap_check. */
const char *ck_spm_charsmap_first(const ck_spm_charsmap *cm, const uint8_t *key, size_t n, size_t *rlen);

/* The model libsentencepiece gets: a unigram model of n pieces, piece i's
 * bytes, score and type from get(ud, i, ...), and the identity normalizer
 * with no dummy prefix, no whitespace removal and no escaping, so the library
 * runs only its Viterbi search over text ckrun has already normalized and
 * split. Writes into out (cap bytes) and returns the size; with out NULL (or
 * cap too small), returns the size it needs and writes nothing past cap. */
typedef void (*ck_spm_get)(void *ud, int i, const char **s, uint32_t *len, float *score, int *type);
size_t ck_spm_write(int n, ck_spm_get get, void *ud, uint8_t *out, size_t cap);

/* s[0..n) for a one-line message, into out (outlen bytes, NUL-terminated):
 * control bytes, DEL, backslash and invalid UTF-8 as \xNN, at most 48 bytes
 * of the text then "...". Returns out. */
const char *ck_spm_quote(char *out, size_t outlen, const char *s, size_t n);

/* Where the first invalid UTF-8 sequence of s[0..n) starts (overlongs,
 * surrogates and code points past U+10FFFF are invalid), or n when s is
 * valid. */
size_t ck_spm_utf8_check(const uint8_t *s, size_t n);

#endif
