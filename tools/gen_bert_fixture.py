#!/usr/bin/python3
"""Writes tests/data/bert_tiny_fixture.safetensors: reference numerics for a
very small BertForMaskedLM from PyTorch (Debian's python3-torch), for
tests/models/test_bert_torch.c. Run by hand (not by CI):

    /usr/bin/python3 tools/gen_bert_fixture.py

Debian 12 has no transformers package, so BertForMaskedLM is written here in
plain torch, module for module after Hugging Face transformers'
src/transformers/models/bert/modeling_bert.py (read at commit 004ad5f5 of
huggingface/transformers, a v4.x tree: BertEmbeddings, BertSelfAttention's
eager path, BertSelfOutput, BertIntermediate, BertOutput, BertLayer,
BertPredictionHeadTransform, BertLMPredictionHead, BertOnlyMLMHead,
BertForMaskedLM with add_pooling_layer=False). The additive mask is that of
current releases, (1 - mask) * torch.finfo(float32).min (modeling_utils'
get_extended_attention_mask; the v4.x tree above used -10000.0, which does
not make a fully padded row uniform). The names are Hugging Face's, so the
weights below are in its layout. One deliberate difference: HF builds
word_embeddings with padding_idx=pad_token_id, which only zeroes the lookup
gradient of the [PAD] row; slapo's embedding has no padding_idx, so the
model here has none either (the test then compares like with like, and
docs/models.md records the gap).

Config: 2 layers, hidden 32, 2 heads (head size 16), intermediate 128,
16 positions, vocabulary 264 (bytes, [PAD] 256, [CLS] 257, [SEP] 258,
[MASK] 259, padded to 264), 2 token types, LayerNorm eps 1e-12, erf GELU,
dropout 0. Batch [3, 8]: row 0 unpadded, row 1 with its last 3 positions
padded, row 2 fully padded (mask all 0: uniform attention, not NaN).

Contents (all f32 unless noted):
  weights, Hugging Face names ("bert.encoder.layer.0.attention.self.query.weight",
  ...), including the tied cls.predictions.decoder.{weight,bias} as HF's
  state_dict has them
  "input_ids", "labels"       i32 [B, T] (labels -100 except masked-LM targets)
  "attention_mask"            [B, T] (1 keep, 0 padding)
  "logits"                    [B, T, V] with the mask
  "logits_nomask"             [B, T, V] without a mask
  "loss"                      [] with the mask
  "grad.<name>"               gradient of the loss for every distinct parameter
  "adamw_losses"              [K] losses of K further AdamW steps
metadata: the config, the optimizer settings, and "base_parameters": the
parameter count of bert-base-uncased's BertForMaskedLM (no pooler), counted
by building that model here.
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from fixture_io import write_safetensors

L, C, NH, INNER, NCTX, V, TYPES, EPS = 2, 32, 2, 128, 16, 264, 2, 1e-12
PAD, CLS, SEP, MASK = 256, 257, 258, 259
B, T = 3, 8
K_STEPS = 5
LR, BETAS, ADAM_EPS, WD, CLIP = 1e-2, (0.9, 0.95), 1e-8, 0.1, 1.0
OUT = "tests/data/bert_tiny_fixture.safetensors"


class Config:
    def __init__(self, layers, hidden, heads, inner, positions, vocab, types=2, dropout=0.0):
        self.num_hidden_layers, self.hidden_size = layers, hidden
        self.num_attention_heads, self.intermediate_size = heads, inner
        self.max_position_embeddings, self.vocab_size = positions, vocab
        self.type_vocab_size, self.layer_norm_eps = types, EPS
        self.hidden_dropout_prob = self.attention_probs_dropout_prob = dropout


class BertEmbeddings(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)  # no padding_idx, see above
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, input_ids):
        t = input_ids.shape[1]
        token_type_ids = torch.zeros_like(input_ids)  # HF's default: all zeros
        position_ids = torch.arange(t).unsqueeze(0)
        e = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        e = e + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(e))


class BertSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.hs = c.num_attention_heads, c.hidden_size // c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)
        self.dropout = nn.Dropout(c.attention_probs_dropout_prob)

    def split(self, x):
        return x.view(x.shape[0], x.shape[1], self.nh, self.hs).permute(0, 2, 1, 3)

    def forward(self, x, mask_bias):
        q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hs)
        if mask_bias is not None:
            scores = scores + mask_bias
        probs = self.dropout(nn.functional.softmax(scores, dim=-1))
        y = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return y.view(y.shape[0], y.shape[1], self.nh * self.hs)


class BertSelfOutput(nn.Module):
    def __init__(self, c, inner=None):
        super().__init__()
        self.dense = nn.Linear(inner or c.hidden_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)
        self.dropout = nn.Dropout(c.hidden_dropout_prob)

    def forward(self, h, input_tensor):
        return self.LayerNorm(self.dropout(self.dense(h)) + input_tensor)


class BertOutput(BertSelfOutput):
    def __init__(self, c):
        super().__init__(c, c.intermediate_size)


class BertAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self = BertSelfAttention(c)
        self.output = BertSelfOutput(c)

    def forward(self, x, mask_bias):
        return self.output(self.self(x, mask_bias), x)


class BertIntermediate(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x):
        return F.gelu(self.dense(x))  # ACT2FN["gelu"]: the exact erf form


class BertLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = BertAttention(c)
        self.intermediate = BertIntermediate(c)
        self.output = BertOutput(c)

    def forward(self, x, mask_bias):
        a = self.attention(x, mask_bias)
        return self.output(self.intermediate(a), a)


class BertEncoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.layer = nn.ModuleList([BertLayer(c) for _ in range(c.num_hidden_layers)])

    def forward(self, x, mask_bias):
        for layer in self.layer:
            x = layer(x, mask_bias)
        return x


class BertModel(nn.Module):  # add_pooling_layer=False
    def __init__(self, c):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)

    def forward(self, input_ids, attention_mask=None):
        bias = None
        if attention_mask is not None:  # get_extended_attention_mask
            bias = (1.0 - attention_mask[:, None, None, :]) * torch.finfo(torch.float32).min
        return self.encoder(self.embeddings(input_ids), bias)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(F.gelu(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transform = BertPredictionHeadTransform(c)
        self.decoder = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(c.vocab_size))
        self.decoder.bias = self.bias  # tied, as HF does

    def forward(self, x):
        return self.decoder(self.transform(x))


class BertOnlyMLMHead(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.predictions = BertLMPredictionHead(c)

    def forward(self, x):
        return self.predictions(x)


class BertForMaskedLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.bert = BertModel(c)
        self.cls = BertOnlyMLMHead(c)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight  # tied

    def forward(self, input_ids, labels=None, attention_mask=None):
        logits = self.cls(self.bert(input_ids, attention_mask))
        if labels is None:
            return logits
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1).long(),
                               ignore_index=-100)
        return logits, loss


def base_parameters():
    """bert-base-uncased (config.json: 12 layers, 768, 12 heads, 3072, 512
    positions, vocabulary 30522, 2 token types), distinct parameters."""
    m = BertForMaskedLM(Config(12, 768, 12, 3072, 512, 30522))
    return sum(p.numel() for p in m.parameters())  # parameters() visits a tied one once


def main():
    torch.set_default_dtype(torch.float32)
    gen = torch.Generator().manual_seed(4321)
    model = BertForMaskedLM(Config(L, C, NH, INNER, NCTX, V))
    with torch.no_grad():  # weights away from init so every term matters
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1 + (1.0 if "LayerNorm.weight" in name else 0.0))
    ids = torch.randint(0, 256, (B, T), generator=gen)
    mask = torch.ones(B, T)
    mask[1, T - 3:] = 0
    mask[2, :] = 0
    ids[0, 0], ids[1, 0] = CLS, CLS
    ids[1, T - 4] = SEP
    ids[mask == 0] = PAD
    ids[2, :] = PAD
    labels = torch.full((B, T), -100, dtype=torch.long)
    for b, t in [(0, 2), (0, 5), (1, 1), (1, 3)]:
        labels[b, t] = ids[b, t]
        ids[b, t] = MASK
    labels[0, 6] = ids[0, 6]  # a chosen position kept as itself (the 10 % case)

    logits_nomask = model(ids).detach()
    logits, loss = model(ids, labels, mask)
    loss.backward()
    out = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out["input_ids"] = ids.to(torch.int32)
    out["labels"] = labels.to(torch.int32)
    out["attention_mask"] = mask
    out["logits"] = logits.detach()
    out["logits_nomask"] = logits_nomask
    out["loss"] = loss.detach().reshape(())
    for name, p in model.named_parameters():  # distinct: the tied decoder once
        out["grad." + name] = p.grad.detach().clone()

    # K AdamW steps, no weight decay on 1-D parameters (biases, LayerNorm),
    # global-norm clipping, as slapo's trainer does.
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": WD},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=ADAM_EPS)
    losses = []
    for step in range(K_STEPS + 1):
        opt.zero_grad()
        _, l = model(ids, labels, mask)
        l.backward()
        if step > 0:
            losses.append(l.item())
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
    out["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    meta = {"n_layer": str(L), "hidden": str(C), "n_head": str(NH), "intermediate": str(INNER),
            "n_ctx": str(NCTX), "vocab_size": str(V), "lr": repr(LR), "beta1": repr(BETAS[0]),
            "beta2": repr(BETAS[1]), "eps": repr(ADAM_EPS), "weight_decay": repr(WD),
            "grad_clip": repr(CLIP), "base_parameters": str(base_parameters()),
            "torch": torch.__version__}
    write_safetensors(OUT, out, meta)
    print(f"wrote {OUT}: loss {loss.item():.6f}, adamw losses {losses}, "
          f"base parameters {meta['base_parameters']}")


if __name__ == "__main__":
    sys.exit(main())
