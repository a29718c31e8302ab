#!/usr/bin/python3
"""Writes tests/data/conv2d_fixture.safetensors: reference numerics for
slapo's conv2d op from PyTorch (Debian's python3-torch), for
tests/unit/test_conv2d.c. Run by hand (not by CI):

    /usr/bin/python3 tools/gen_conv2d_fixture.py

Two configurations (CONFIGS below), each with a bias. For configuration k,
all f32:
  "k.x" [N, C, H, W], "k.w" [O, C/groups, KH, KW], "k.b" [O]
  "k.r" [N, O, OH, OW]      fixed random weights of the loss sum(out * r)
  "k.out" [N, O, OH, OW]    torch.nn.functional.conv2d(x, w, b, ...)
  "k.dx", "k.dw", "k.db"    gradients of sum(out * r)
metadata: each configuration's stride, padding, dilation and groups as
"k.stride" = "2,2" etc., and the torch version. Debian 12 has no safetensors
package, so the file format is written directly (as gen_gpt2_fixture.py).
"""
import sys

import torch
import torch.nn.functional as F

from fixture_io import write_safetensors

OUT = "tests/data/conv2d_fixture.safetensors"

# (x shape, w shape, stride, padding, dilation, groups)
CONFIGS = [
    ((2, 3, 9, 8), (5, 3, 3, 2), (1, 1), (0, 0), (1, 1), 1),
    ((2, 4, 11, 10), (6, 2, 3, 3), (2, 2), (1, 1), (2, 2), 2),
]

def main():
    torch.set_default_dtype(torch.float32)
    gen = torch.Generator().manual_seed(4321)
    out, meta = {}, {"torch": torch.__version__}
    for k, (xs, ws, stride, padding, dilation, groups) in enumerate(CONFIGS):
        x = (torch.rand(*xs, generator=gen) * 2 - 1).requires_grad_(True)
        w = (torch.rand(*ws, generator=gen) * 2 - 1).requires_grad_(True)
        b = (torch.rand(ws[0], generator=gen) * 2 - 1).requires_grad_(True)
        y = F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
        r = torch.rand(*y.shape, generator=gen) * 2 - 1
        (y * r).sum().backward()
        p = f"{k}."
        for name, t in (("x", x), ("w", w), ("b", b), ("r", r), ("out", y),
                        ("dx", x.grad), ("dw", w.grad), ("db", b.grad)):
            out[p + name] = t.detach().clone()
        for name, v in (("stride", stride), ("padding", padding), ("dilation", dilation)):
            meta[p + name] = ",".join(str(i) for i in v)
        meta[p + "groups"] = str(groups)
        print(f"config {k}: x {list(xs)} w {list(ws)} -> out {list(y.shape)}")
    write_safetensors(OUT, out, meta)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    sys.exit(main())
