// src/tokenizer/spm.cc - SentencePiece models (LLaMA's tokenizer.model)
// through Debian's libsentencepiece, which has a C++ API only: this file is
// the one C++ file of the tree, a shim of plain functions that C calls.
// Encoding is SentencePiece's own (its normalizer, its unigram or BPE
// model, byte fallback); a token's bytes are its piece with U+2581 as a
// space, a byte piece <0xAB> as that byte, and control pieces (<s>, </s>)
// as their text. No exception leaves this file. Layer: tokenizer.
#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "tokenizer/spm.h"

extern "C" {

int slapo__spm_load(const char *path, void **out, char *err, size_t cap) {
  *out = nullptr;
  try {
    auto *sp = new sentencepiece::SentencePieceProcessor();
    auto st = sp->Load(path);
    if (!st.ok()) {
      snprintf(err, cap, "%s", st.ToString().c_str());
      delete sp;
      return -1;
    }
    *out = sp;
    return 0;
  } catch (const std::exception &e) {
    snprintf(err, cap, "%s", e.what());
    return -1;
  }
}

void slapo__spm_free(void *h) { delete static_cast<sentencepiece::SentencePieceProcessor *>(h); }

int32_t slapo__spm_size(void *h) {
  return static_cast<sentencepiece::SentencePieceProcessor *>(h)->GetPieceSize();
}

int slapo__spm_is_control(void *h, int32_t id) {
  auto *sp = static_cast<sentencepiece::SentencePieceProcessor *>(h);
  return sp->IsControl(id) ? 1 : 0;
}

size_t slapo__spm_piece(void *h, int32_t id, char *buf, size_t cap) {
  auto *sp = static_cast<sentencepiece::SentencePieceProcessor *>(h);
  try {
    std::string p = sp->IdToPiece(id), out;
    unsigned v;
    if (sp->IsByte(id) && p.size() == 6 && sscanf(p.c_str(), "<0x%2X>", &v) == 1) {
      out.push_back(static_cast<char>(v));
    } else {
      for (size_t i = 0; i < p.size(); i++) { // U+2581 LOWER ONE EIGHTH BLOCK: e2 96 81
        if (i + 2 < p.size() && (unsigned char)p[i] == 0xe2 && (unsigned char)p[i + 1] == 0x96 &&
            (unsigned char)p[i + 2] == 0x81)
          out.push_back(' '), i += 2;
        else
          out.push_back(p[i]);
      }
    }
    if (buf && out.size() <= cap) memcpy(buf, out.data(), out.size());
    return out.size();
  } catch (...) {
    return 0;
  }
}

int slapo__spm_encode(void *h, const char *text, size_t len, int32_t **ids, size_t *n) {
  *ids = nullptr, *n = 0;
  auto *sp = static_cast<sentencepiece::SentencePieceProcessor *>(h);
  try {
    std::vector<int> v;
    if (!sp->Encode(std::string_view(text, len), &v).ok()) return -1;
    *ids = static_cast<int32_t *>(malloc((v.size() ? v.size() : 1) * sizeof(int32_t)));
    if (!*ids) return -1;
    for (size_t i = 0; i < v.size(); i++) (*ids)[i] = v[i];
    *n = v.size();
    return 0;
  } catch (...) {
    return -1;
  }
}

} // extern "C"
