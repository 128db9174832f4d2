/* The C face of Debian's libsentencepiece (C++, 0.1.97): load a model that
 * ckrun wrote (vm/text/spm_model.h, ck_spm_write; never a user's file) and
 * run its unigram search over one piece of text. The one file of ckrun in C++
 * (vm/text/spm_shim.cc); no exception and no C++ type crosses this header.
 *
 * A handle is counted: a search that was left running in another thread
 * (vm/lua/lua_spm.c stops waiting for it on an interrupt) holds its own
 * reference, so freeing the tokenizer meanwhile does not pull the model from
 * under it. */
#ifndef CK_SPM_SHIM_H
#define CK_SPM_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ck_spmp ck_spmp;

/* The model in proto[0..n), with one reference; NULL with the library's
 * message in err. */
ck_spmp *ck_spmp_load(const uint8_t *proto, size_t n, char *err, size_t errlen);
void ck_spmp_ref(ck_spmp *p);
/* drops a reference; the last frees the model */
void ck_spmp_unref(ck_spmp *p);

/* The ids of the unigram segmentation of text[0..n), through emit(ud, ids,
 * count) once (emit must return normally: no longjmp through the library's
 * frames). 0; -1 with the library's message in err; -2 when emit returned
 * nonzero (err untouched). */
int ck_spmp_encode(const ck_spmp *p, const char *text, size_t n, int (*emit)(void *ud, const int *ids, size_t count),
                   void *ud, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
