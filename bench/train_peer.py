#!/usr/bin/python3
"""bench/train_peer.py - the PyTorch side of bench/run_train_bench.sh: one
GPT-2 (or, with --model llama, LLaMA: Hugging Face LlamaForCausalLM's eager
path with repeat_kv, as tools/gen_llama_fixture.py; with --model bert,
BertForMaskedLM's eager path, the loss over every position of random
labels, as bench_train feeds slapo) training step (forward, backward, gradient clipping, AdamW) in plain
PyTorch with the architecture slapo's GPT-2 has (Hugging Face
GPT2LMHeadModel semantics: pre-LN blocks, tanh GELU, causal softmax
attention written out as HF's eager attention, dropout, lm_head tied to wte;
adapted from tools/gen_gpt2_fixture.py into nn.Modules), on random token ids,
timed over several steps. Prints one line:

    peer config=small B=4 T=256 tokens_per_s=1234.5 step_ms=829.4 ...

Run with Debian's python3-torch (/usr/bin/python3). The peer gets its own
fastest settings, chosen with --linear / --threads and the environment the
runner sets (see run_train_bench.sh): 2 intra-op threads, OMP_WAIT_POLICY,
ATEN_CPU_CAPABILITY (the best level the CPU has) and an optimized BLAS (Debian's torch calls
whatever libblas.so.3 the system provides; the default netlib one is a
single-threaded reference loop). --linear conv routes every Linear through
a 1x1 convolution, which torch runs on oneDNN (MKL-DNN) whatever the BLAS.
--autocast bf16 runs the forward and the loss under
torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's mixed precision:
linear and matmul cast their inputs to bf16 and write bf16 outputs, the
weights and the optimizer stay f32 (slapo's autocast writes GEMM outputs
in f32). --gemm-probe prints the GFLOP/s of a 1024^3 matmul in the chosen
precision, so the peer's bf16 kernels can be judged on their own.
"""
import argparse
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {  # n_layer, n_head, n_embd, n_ctx, vocab, dropout (as slapo's gpt2.c)
    "tiny": (4, 4, 128, 64, 256, 0.0),
    "small": (6, 6, 384, 256, 256, 0.0),
    "124M": (12, 12, 768, 1024, 50257, 0.1),
    "355M": (24, 16, 1024, 1024, 50257, 0.1),
}
BERT_CONFIGS = {  # n_layer, n_head, hidden, intermediate, n_ctx, vocab (bert.c; 264 bytes+specials)
    "tiny": (4, 4, 128, 512, 64, 264),
    "small": (6, 6, 384, 1536, 256, 264),
}
LLAMA_CONFIGS = {  # n_layer, n_head, n_kv_head, hidden, intermediate, n_ctx, vocab (llama.c)
    "tiny": (4, 4, 2, 128, 352, 64, 256),
    "small": (6, 6, 2, 384, 1024, 256, 256),
}


class ConvLinear(nn.Linear):
    """nn.Linear computed as a 1x1 conv1d over [1, in, rows], so torch runs
    it (forward and backward) on oneDNN instead of the BLAS. Same parameters
    and numerics up to summation order."""

    def forward(self, x):
        shp = x.shape
        x2 = x.reshape(-1, shp[-1]).t().unsqueeze(0)  # [1, in, rows]
        y = F.conv1d(x2, self.weight.unsqueeze(-1), self.bias)  # [1, out, rows]
        return y.squeeze(0).t().reshape(*shp[:-1], self.out_features)


class Attention(nn.Module):
    def __init__(self, C, NH, p, lin):
        super().__init__()
        self.c_attn, self.c_proj = lin(C, 3 * C), lin(C, C)
        self.attn_dropout, self.resid_dropout = nn.Dropout(p), nn.Dropout(p)
        self.NH = NH

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = [t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.NH))
        mask = torch.ones(T, T, dtype=torch.bool).tril_()
        att = self.attn_dropout(att.masked_fill(~mask, float("-inf")).softmax(dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, C, p, lin):
        super().__init__()
        self.c_fc, self.c_proj, self.dropout = lin(C, 4 * C), lin(4 * C, C), nn.Dropout(p)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, C, NH, p, lin):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(C, eps=1e-5), Attention(C, NH, p, lin)
        self.ln_2, self.mlp = nn.LayerNorm(C, eps=1e-5), MLP(C, p, lin)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, L, NH, C, n_ctx, V, p, lin):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(n_ctx, C)
        self.drop = nn.Dropout(p)
        self.h = nn.ModuleList([Block(C, NH, p, lin) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.lm_head = lin(C, V, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2
        for n, prm in self.named_parameters():  # GPT-2 init (values do not affect speed)
            if n.endswith("bias"):
                nn.init.zeros_(prm)
            elif prm.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if n.endswith("c_proj.weight") else 0.02
                nn.init.normal_(prm, std=std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.drop(self.wte(idx) + self.wpe.weight[:T])
        for blk in self.h:
            x = blk(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class LlamaAttention(nn.Module):
    """Hugging Face LlamaAttention's eager path (modeling_llama.py, 4.40):
    rotary (rotate-half), repeat_kv, causal softmax; no biases."""

    def __init__(self, C, NH, NKV, lin):
        super().__init__()
        self.NH, self.NKV, self.HS = NH, NKV, C // NH
        self.q_proj, self.o_proj = lin(C, C, bias=False), lin(C, C, bias=False)
        self.k_proj = lin(C, NKV * self.HS, bias=False)
        self.v_proj = lin(C, NKV * self.HS, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.NH, self.HS).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.NKV, self.HS).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.NKV, self.HS).transpose(1, 2)
        rot = lambda t: torch.cat((-t[..., self.HS // 2:], t[..., : self.HS // 2]), dim=-1)
        q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
        g = self.NH // self.NKV
        k = k[:, :, None].expand(B, self.NKV, g, T, self.HS).reshape(B, self.NH, T, self.HS)
        v = v[:, :, None].expand(B, self.NKV, g, T, self.HS).reshape(B, self.NH, T, self.HS)
        att = (q @ k.transpose(2, 3)) / math.sqrt(self.HS)
        mask = torch.ones(T, T, dtype=torch.bool).tril_()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return self.o_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))


class LlamaRMSNorm(nn.Module):
    def __init__(self, C, eps=1e-5):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(C)), eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class LlamaLayer(nn.Module):
    def __init__(self, C, NH, NKV, I, lin):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = LlamaRMSNorm(C), LlamaRMSNorm(C)
        self.self_attn = LlamaAttention(C, NH, NKV, lin)
        self.gate_proj, self.up_proj = lin(C, I, bias=False), lin(C, I, bias=False)
        self.down_proj = lin(I, C, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, L, NH, NKV, C, I, n_ctx, V, lin):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, C)
        self.layers = nn.ModuleList([LlamaLayer(C, NH, NKV, I, lin) for _ in range(L)])
        self.norm, self.lm_head = LlamaRMSNorm(C), lin(C, V, bias=False)
        self.HS = C // NH
        for prm in self.parameters():
            if prm.dim() >= 2:
                nn.init.normal_(prm, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        inv_freq = 1.0 / (10000.0 ** (torch.arange(0, self.HS, 2).float() / self.HS))
        freqs = torch.outer(torch.arange(T).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


class BertLayer(nn.Module):
    """Hugging Face BertLayer (modeling_bert.py, eager attention): post-LN
    self-attention and MLP with erf GELU, LayerNorm eps 1e-12."""

    def __init__(self, C, NH, I, lin):
        super().__init__()
        self.NH, self.HS = NH, C // NH
        self.query, self.key, self.value = lin(C, C), lin(C, C), lin(C, C)
        self.attn_out, self.ln_1 = lin(C, C), nn.LayerNorm(C, eps=1e-12)
        self.inter, self.out, self.ln_2 = lin(C, I), lin(I, C), nn.LayerNorm(C, eps=1e-12)

    def forward(self, x, bias):
        B, T, C = x.shape
        heads = lambda t: t.view(B, T, self.NH, self.HS).transpose(1, 2)
        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        att = ((q @ k.transpose(-1, -2)) / math.sqrt(self.HS) + bias).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        a = self.ln_1(self.attn_out(y) + x)
        return self.ln_2(self.out(F.gelu(self.inter(a))) + a)


class Bert(nn.Module):
    """BertForMaskedLM without pooler: embeddings (word + position + type,
    LayerNorm), the layers, the MLM head (dense, GELU, LayerNorm, decoder
    tied to the word embeddings plus a bias)."""

    def __init__(self, L, NH, C, I, n_ctx, V, lin):
        super().__init__()
        self.word, self.pos, self.ttype = nn.Embedding(V, C), nn.Embedding(n_ctx, C), nn.Embedding(2, C)
        self.ln = nn.LayerNorm(C, eps=1e-12)
        self.layers = nn.ModuleList([BertLayer(C, NH, I, lin) for _ in range(L)])
        self.transform, self.ln_h = lin(C, C), nn.LayerNorm(C, eps=1e-12)
        self.decoder_bias = nn.Parameter(torch.zeros(V))
        for n, prm in self.named_parameters():
            if prm.dim() >= 2:
                nn.init.normal_(prm, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.ln(self.word(idx) + self.pos.weight[:T] + self.ttype.weight[0])
        bias = torch.zeros(idx.shape[0], 1, 1, T)  # no padding: every key attends
        for layer in self.layers:
            x = layer(x, bias)
        h = self.ln_h(F.gelu(self.transform(x)))
        logits = h @ self.word.weight.t() + self.decoder_bias
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def aten_capability():
    """The ATen CPU kernels torch dispatches to (DEFAULT, AVX2, AVX512), as
    torch itself reports it; torch 1.13 has no API, only the config text."""
    get = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if get:
        return get()
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip()
    return "unknown"


def blas_core():
    """The BLAS library and, for OpenBLAS, the core type its kernels were
    picked for (openblas_get_corename), read from the loaded library."""
    import ctypes
    maps = open("/proc/self/maps").read().split("\n")
    libs = sorted({ln.split()[-1] for ln in maps if "libblas" in ln or "openblas" in ln})
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return f"OpenBLAS {lib.openblas_get_corename().decode()} ({path})"
        except (OSError, AttributeError):
            continue
    return "reference BLAS (" + (", ".join(libs) or "not loaded") + ")"


def machine_line():
    torch.ones(64, 64) @ torch.ones(64, 64)  # loads the BLAS
    return (f"# peer: torch {torch.__version__}; ATen CPU capability {aten_capability()}; "
            f"BLAS {blas_core()}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}; "
            f"{torch.get_num_threads()} threads")


def gemm_probe(dtype, n=1024):
    """GFLOP/s of an n^3 matmul in dtype: the best of 5 samples of >= 0.2 s."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, n, generator=g).to(dtype)
    y = torch.rand(n, n, generator=g).to(dtype)
    x @ y
    best = 0.0
    for _ in range(5):
        runs, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.2:
            x @ y
            runs += 1
        best = max(best, 2 * n ** 3 * runs / (time.perf_counter() - t0) / 1e9)
    return f"peer gemm_probe dtype={str(dtype).split('.')[-1]} n={n} gflops={best:.1f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "llama", "bert"])
    ap.add_argument("--config", default="small", choices=sorted(CONFIGS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10, help="timed steps (after 2 warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--linear", default="mm", choices=["mm", "conv"],
                    help="mm: nn.Linear (addmm on the BLAS); conv: 1x1 conv on oneDNN")
    ap.add_argument("--mkldnn", type=int, default=1, help="torch.backends.mkldnn.enabled")
    ap.add_argument("--foreach", type=int, default=0,
                    help="AdamW(foreach=): torch 1.13's multi-tensor path was ~2.4x slower "
                         "than the per-tensor loop on CPU here (700 vs 290 ms on 124M)")
    ap.add_argument("--set-to-none", type=int, default=1,
                    help="zero_grad(set_to_none): 1 frees the gradients, 0 zeroes them in place")
    ap.add_argument("--autocast", default="f32", choices=["f32", "bf16"],
                    help="bf16: forward and loss under torch.autocast('cpu', torch.bfloat16)")
    ap.add_argument("--gemm-probe", action="store_true",
                    help="print the GFLOP/s of a 1024^3 matmul in --autocast's dtype")
    ap.add_argument("--machine", action="store_true",
                    help="print only the kernel line (ATen capability, BLAS core type)")
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    if a.machine:
        print(machine_line())
        return 0
    if a.gemm_probe:
        print(gemm_probe(torch.bfloat16 if a.autocast == "bf16" else torch.float32))
        return 0
    torch.backends.mkldnn.enabled = bool(a.mkldnn)
    torch.manual_seed(0)
    lin = ConvLinear if a.linear == "conv" else nn.Linear
    if a.model == "bert":
        L, NH, C, I, n_ctx, V = BERT_CONFIGS[a.config]
        model = Bert(L, NH, C, I, n_ctx, V, lin).train()
    elif a.model == "llama":
        L, NH, NKV, C, I, n_ctx, V = LLAMA_CONFIGS[a.config]
        model = Llama(L, NH, NKV, C, I, n_ctx, V, lin).train()
    else:
        L, NH, C, n_ctx, V, p = CONFIGS[a.config]
        model = GPT2(L, NH, C, n_ctx, V, p, lin).train()
    n_params = sum(x.numel() for x in model.parameters())
    decay = [x for x in model.parameters() if x.dim() >= 2]
    no_decay = [x for x in model.parameters() if x.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=bool(a.foreach))
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, V, (a.batch, a.seq), generator=g)
    tgt = torch.randint(0, V, (a.batch, a.seq), generator=g)

    times, loss = [], None
    for it in range(a.steps + 2):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=bool(a.set_to_none))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if it >= 2:
            times.append(dt)
    med = statistics.median(times)
    tok = a.batch * a.seq
    blas = os.environ.get("LD_LIBRARY_PATH", "") or "system libblas.so.3"
    print(f"peer model={a.model} config={a.config} B={a.batch} T={a.seq} tokens_per_s={tok / med:.1f} "
          f"step_ms={med * 1e3:.1f} min_ms={min(times) * 1e3:.1f} loss={loss.item():.4f} "
          f"params={n_params} threads={torch.get_num_threads()} linear={a.linear} "
          f"mkldnn={int(torch.backends.mkldnn.enabled)} set_to_none={a.set_to_none} "
          f"foreach={a.foreach} autocast={a.autocast} "
          f"isa={os.environ.get('ATEN_CPU_CAPABILITY', 'default')} "
          f"omp_wait={os.environ.get('OMP_WAIT_POLICY', 'default')} blas={blas}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
