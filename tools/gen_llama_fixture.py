#!/usr/bin/python3
"""Writes tests/data/llama_tiny_fixture.safetensors: reference numerics for a
very small LLaMA from PyTorch (Debian's python3-torch), for
tests/models/test_llama_torch.c. Run by hand (not by CI):

    /usr/bin/python3 tools/gen_llama_fixture.py

Debian 12 has no transformers package, so the model is written here in plain
PyTorch following Hugging Face transformers 4.40's
src/transformers/models/llama/modeling_llama.py: LlamaRMSNorm (f32 variance,
eps inside the rsqrt), LlamaRotaryEmbedding (inv_freq = 1 / theta^(2i/d) in
f32, cos/sin of cat(freqs, freqs)), apply_rotary_pos_emb with rotate_half,
repeat_kv for grouped-query heads, causal softmax in f32, LlamaMLP
down(silu(gate(x)) * up(x)), no biases, untied lm_head. Parameter names and
layouts are LlamaForCausalLM's (nn.Linear weights [out, in]).

Contents (all f32 unless noted):
  weights, Hugging Face names ("model.layers.0.self_attn.q_proj.weight", ...)
  "input_ids", "labels"     i32 [B, T]
  "logits"                  [B, T, V]
  "loss"                    []
  "grad.<name>"             gradient of the loss for every weight
  "adamw_losses"            [K] losses of K further AdamW steps (the loss
                            before each step's update, starting after step 0)
metadata: the config and the optimizer settings.
"""
import math
import sys

import torch
import torch.nn.functional as F

from fixture_io import reference_run, write_safetensors

L, C, NH, NKV, I, NCTX, V = 2, 32, 4, 2, 64, 16, 256
THETA, RMS_EPS = 10000.0, 1e-5
B, T = 2, 12
K_STEPS = 5
LR, BETAS, EPS, WD, CLIP = 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0
OUT = "tests/data/llama_tiny_fixture.safetensors"
HS = C // NH


def make_weights(gen):
    w = {}
    def normal(*shape, std=0.1):
        return (torch.randn(*shape, generator=gen) * std).float()
    w["model.embed_tokens.weight"] = normal(V, C)
    for l in range(L):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = 1.0 + normal(C)
        w[p + "self_attn.q_proj.weight"] = normal(NH * HS, C)
        w[p + "self_attn.k_proj.weight"] = normal(NKV * HS, C)
        w[p + "self_attn.v_proj.weight"] = normal(NKV * HS, C)
        w[p + "self_attn.o_proj.weight"] = normal(C, NH * HS)
        w[p + "post_attention_layernorm.weight"] = 1.0 + normal(C)
        w[p + "mlp.gate_proj.weight"] = normal(I, C)
        w[p + "mlp.up_proj.weight"] = normal(I, C)
        w[p + "mlp.down_proj.weight"] = normal(C, I)
    w["model.norm.weight"] = 1.0 + normal(C)
    w["lm_head.weight"] = normal(V, C)
    return w


def rms_norm(x, weight):
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + RMS_EPS))


def rotary_cos_sin(Tn):
    inv_freq = 1.0 / (THETA ** (torch.arange(0, HS, 2, dtype=torch.int64).float() / HS))
    pos = torch.arange(Tn).float()
    freqs = (inv_freq[:, None] @ pos[None, :]).t()  # [T, HS/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    b, nkv, t, d = x.shape
    return x[:, :, None, :, :].expand(b, nkv, n_rep, t, d).reshape(b, nkv * n_rep, t, d)


def attention(w, p, h):
    Bn, Tn, _ = h.shape
    q = (h @ w[p + "q_proj.weight"].t()).view(Bn, Tn, NH, HS).transpose(1, 2)
    k = (h @ w[p + "k_proj.weight"].t()).view(Bn, Tn, NKV, HS).transpose(1, 2)
    v = (h @ w[p + "v_proj.weight"].t()).view(Bn, Tn, NKV, HS).transpose(1, 2)
    cos, sin = rotary_cos_sin(Tn)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k, v = repeat_kv(k, NH // NKV), repeat_kv(v, NH // NKV)
    att = (q @ k.transpose(2, 3)) / math.sqrt(HS)
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1, dtype=torch.float32)
    y = (att @ v).transpose(1, 2).contiguous().view(Bn, Tn, C)
    return y @ w[p + "o_proj.weight"].t()


def forward(w, idx, labels):
    x = w["model.embed_tokens.weight"][idx]
    for l in range(L):
        p = f"model.layers.{l}."
        x = x + attention(w, p + "self_attn.", rms_norm(x, w[p + "input_layernorm.weight"]))
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"])
        m = p + "mlp."
        h = F.silu(h @ w[m + "gate_proj.weight"].t()) * (h @ w[m + "up_proj.weight"].t())
        x = x + h @ w[m + "down_proj.weight"].t()
    x = rms_norm(x, w["model.norm.weight"])
    logits = x @ w["lm_head.weight"].t()
    loss = F.cross_entropy(logits.view(-1, V), labels.view(-1))
    return logits, loss


def main():
    torch.set_default_dtype(torch.float32)
    gen = torch.Generator().manual_seed(4321)
    w = make_weights(gen)
    idx = torch.randint(0, V, (B, T), generator=gen)
    labels = torch.randint(0, V, (B, T), generator=gen)
    out, loss, losses = reference_run(w, forward, idx, labels, K_STEPS, LR, BETAS, EPS, WD, CLIP)
    meta = {"n_layer": str(L), "hidden": str(C), "n_head": str(NH), "n_kv_head": str(NKV),
            "intermediate": str(I), "n_ctx": str(NCTX), "vocab_size": str(V),
            "rope_theta": repr(THETA), "rms_eps": repr(RMS_EPS), "lr": repr(LR),
            "beta1": repr(BETAS[0]), "beta2": repr(BETAS[1]), "eps": repr(EPS),
            "weight_decay": repr(WD), "grad_clip": repr(CLIP), "torch": torch.__version__}
    write_safetensors(OUT, out, meta)
    print(f"wrote {OUT}: loss {loss.item():.6f}, adamw losses {losses}")


if __name__ == "__main__":
    sys.exit(main())
