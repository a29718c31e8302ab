/* src/tokenizer/spm.h - the C side of spm.cc, the shim over Debian's
 * libsentencepiece (C++ only). h is a SentencePieceProcessor. Every
 * function catches what the library throws. */
#ifndef SLAPO_TOKENIZER_SPM_H
#define SLAPO_TOKENIZER_SPM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 0 and *out on success; -1 with the library's message in err [cap]. */
int slapo__spm_load(const char *path, void **out, char *err, size_t cap);
void slapo__spm_free(void *h); /* NULL is fine */
int32_t slapo__spm_size(void *h);
int slapo__spm_is_control(void *h, int32_t id);
/* Token id's bytes (see spm.cc) into buf when they fit in cap; returns
 * their length either way. */
size_t slapo__spm_piece(void *h, int32_t id, char *buf, size_t cap);
/* Encodes text[0..len): *ids malloc'd (free()), *n ids; -1 on failure. */
int slapo__spm_encode(void *h, const char *text, size_t len, int32_t **ids, size_t *n);

#ifdef __cplusplus
}
#endif

#endif
