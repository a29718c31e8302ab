#!/usr/bin/python3
"""Writes tests/data/gpt2_tiny_fixture.safetensors: reference numerics for a
very small GPT-2 from PyTorch (Debian's python3-torch), for
tests/models/test_gpt2_torch.c. Run by hand (not by CI):

    /usr/bin/python3 tools/gen_gpt2_fixture.py

The model is written here in plain PyTorch with Hugging Face GPT-2's
semantics and parameter layout (Conv1D weights stored [in, out], lm_head tied
to wte, tanh GELU, LayerNorm eps 1e-5, dropout 0). Debian 12 has no
safetensors or transformers package, so the file format is written directly.

Contents (all f32 unless noted):
  weights, Hugging Face names ("transformer.h.0.attn.c_attn.weight", ...)
  "input_ids", "labels"     i32 [B, T]
  "logits"                  [B, T, V]
  "loss"                    []
  "grad.<name>"             gradient of the loss for every weight, HF layout
  "adamw_losses"            [K] losses of K further AdamW steps (the loss
                            before each step's update, starting after step 0)
metadata: the config and the optimizer settings.
"""
import math
import sys

import torch
import torch.nn.functional as F

from fixture_io import reference_run, write_safetensors

L, C, NH, NCTX, V = 2, 32, 4, 16, 256
B, T = 2, 8
K_STEPS = 5
LR, BETAS, EPS, WD, CLIP = 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0
OUT = "tests/data/gpt2_tiny_fixture.safetensors"


def make_weights(gen):
    w = {}
    def normal(*shape, std=0.1):
        return (torch.randn(*shape, generator=gen) * std).float()
    w["transformer.wte.weight"] = normal(V, C)
    w["transformer.wpe.weight"] = normal(NCTX, C)
    for l in range(L):
        p = f"transformer.h.{l}."
        w[p + "ln_1.weight"] = 1.0 + normal(C)
        w[p + "ln_1.bias"] = normal(C)
        w[p + "attn.c_attn.weight"] = normal(C, 3 * C)  # Conv1D: [in, out]
        w[p + "attn.c_attn.bias"] = normal(3 * C)
        w[p + "attn.c_proj.weight"] = normal(C, C)
        w[p + "attn.c_proj.bias"] = normal(C)
        w[p + "ln_2.weight"] = 1.0 + normal(C)
        w[p + "ln_2.bias"] = normal(C)
        w[p + "mlp.c_fc.weight"] = normal(C, 4 * C)
        w[p + "mlp.c_fc.bias"] = normal(4 * C)
        w[p + "mlp.c_proj.weight"] = normal(4 * C, C)
        w[p + "mlp.c_proj.bias"] = normal(C)
    w["transformer.ln_f.weight"] = 1.0 + normal(C)
    w["transformer.ln_f.bias"] = normal(C)
    return w


def forward(w, idx, labels):
    Tn = idx.shape[1]
    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][:Tn]
    hs = C // NH
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    for l in range(L):
        p = f"transformer.h.{l}."
        h = F.layer_norm(x, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=2)
        q, k, v = [t.view(B, Tn, NH, hs).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, Tn, C)
        x = x + (y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + (h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], 1e-5)
    logits = x @ w["transformer.wte.weight"].t()  # lm_head tied to wte
    loss = F.cross_entropy(logits.view(-1, V), labels.view(-1))
    return logits, loss

def main():
    torch.set_default_dtype(torch.float32)
    gen = torch.Generator().manual_seed(1234)
    w = make_weights(gen)
    idx = torch.randint(0, V, (B, T), generator=gen)
    labels = torch.randint(0, V, (B, T), generator=gen)
    out, loss, losses = reference_run(w, forward, idx, labels, K_STEPS, LR, BETAS, EPS, WD, CLIP)
    meta = {"n_layer": str(L), "n_embd": str(C), "n_head": str(NH), "n_ctx": str(NCTX),
            "vocab_size": str(V), "lr": repr(LR), "beta1": repr(BETAS[0]),
            "beta2": repr(BETAS[1]), "eps": repr(EPS), "weight_decay": repr(WD),
            "grad_clip": repr(CLIP), "torch": torch.__version__}
    write_safetensors(OUT, out, meta)
    print(f"wrote {OUT}: loss {loss.item():.6f}, adamw losses {losses}")


if __name__ == "__main__":
    sys.exit(main())
