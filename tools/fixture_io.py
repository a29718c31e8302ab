"""tools/fixture_io.py - writing the small safetensors fixtures the
tools/gen_*_fixture.py scripts commit under tests/data (f32 and i32
tensors, sorted by name, metadata strings)."""
import json
import struct

import torch


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        dtype = {torch.float32: "F32", torch.int32: "I32"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def reference_run(w, forward, idx, labels, k_steps, lr, betas, eps, wd, clip):
    """The fixture tensors of a causal LM given its weights `w` (name ->
    tensor) and `forward(params, idx, labels) -> (logits, loss)`: the
    weights, the inputs, logits, loss, every gradient ("grad.<name>") and the
    losses of k_steps AdamW steps ("adamw_losses": the loss before each
    step's update, starting after step 0), with no weight decay on 1-D
    parameters and global-norm clipping, as slapo's trainer does. Returns
    (tensors, loss, adamw losses)."""
    params = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    logits, loss = forward(params, idx, labels)
    loss.backward()
    out = dict(w)
    out["input_ids"] = idx.to(torch.int32)
    out["labels"] = labels.to(torch.int32)
    out["logits"] = logits.detach()
    out["loss"] = loss.detach().reshape(())
    for k, p in params.items():
        out["grad." + k] = p.grad.detach().clone()
    decay = [p for k, p in params.items() if p.dim() >= 2]
    no_decay = [p for k, p in params.items() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=betas, eps=eps)
    losses = []
    for step in range(k_steps + 1):
        opt.zero_grad()
        _, l = forward(params, idx, labels)
        l.backward()
        if step > 0:
            losses.append(l.item())
        torch.nn.utils.clip_grad_norm_(list(params.values()), clip)
        opt.step()
    out["adamw_losses"] = torch.tensor(losses, dtype=torch.float32)
    return out, loss, losses
