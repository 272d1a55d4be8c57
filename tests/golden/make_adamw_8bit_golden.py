#!/usr/bin/env python3
"""Writes what torchao.optim.AdamW8bit (block_size 256, HF's --optim adamw_torch_8bit) does over
20 steps to a small model, for tests/adamw_8bit_test.cpp (mantissa::optim::AdamW8bit): the
quantised moments (uint8 codes and per-block scales), the plain moments of the tensors too small
to quantise, and the parameters after the last step. torchao runs its step through
torch.compile; set TORCHDYNAMO_DISABLE=1 to write the eager result instead.

Run with the project venv:  .venv/bin/python tests/golden/make_adamw_8bit_golden.py [OUT]
(default OUT: tests/golden/adamw_8bit_golden.json next to this script).

The initial parameters and every gradient are a formula of the element's index and the step
(`pattern` below, float64 rounded to the case's dtype), which the C++ test computes the same way,
so the file holds only the results. The file also holds torchao's two quantisation maps.
"""
import json
import os
import sys

import torch
import torchao
from torchao.optim import AdamW8bit
from torchao.optim.subclass_8bit import OptimState8bit, get_qmap_signed, get_qmap_unsigned

STEPS = 20
# name, shape, group: two quantised matrices (4096 elements each), one too small to quantise,
# a bias (group 1: no weight decay).
PARAMS = [("w1", (64, 64), 0), ("w2", (32, 128), 0), ("w3", (16, 16), 0), ("b", (64,), 1)]
CASES = [
    {"name": "hf_defaults", "dtype": "float32", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
     "weight_decay": 0.0},
    {"name": "decay_betas", "dtype": "float32", "lr": 3e-3, "betas": [0.8, 0.95], "eps": 1e-6,
     "weight_decay": 0.1},
    {"name": "bf16_params", "dtype": "bfloat16", "lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
     "weight_decay": 0.01},
]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def pattern(shape, salt, step, scale):
    """sin(0.37 i + 1.3 salt + 0.71 step) * (1 + 0.5 cos(0.11 i)) * scale, in float64."""
    n = 1
    for d in shape:
        n *= d
    i = torch.arange(n, dtype=torch.float64)
    return (torch.sin(i * 0.37 + 1.3 * salt + 0.71 * step) * (1 + 0.5 * torch.cos(i * 0.11))
            * scale).reshape(shape)


def values(t):
    return t.detach().double().flatten().tolist()


def run(case):
    dtype = DTYPES[case["dtype"]]
    params = [pattern(shape, k, -1, 0.5).to(dtype).requires_grad_()
              for k, (_, shape, _) in enumerate(PARAMS)]
    groups = [{"params": [p for p, (_, _, g) in zip(params, PARAMS) if g == 0],
               "weight_decay": case["weight_decay"]},
              {"params": [p for p, (_, _, g) in zip(params, PARAMS) if g == 1],
               "weight_decay": 0.0}]
    opt = AdamW8bit(groups, lr=case["lr"], betas=tuple(case["betas"]), eps=case["eps"],
                    block_size=256)
    for step in range(STEPS):
        for k, ((_, shape, _), p) in enumerate(zip(PARAMS, params)):
            p.grad = pattern(shape, k, step, 0.1 * (1 + step % 3)).to(dtype)
        opt.step()
    out = dict(case)
    out["params"] = []
    for (name, shape, group), p in zip(PARAMS, params):
        state = opt.state[p]
        entry = {"name": name, "shape": list(shape), "group": group, "final": values(p),
                 "step": float(state["step"])}
        for key in ("exp_avg", "exp_avg_sq"):
            s = state[key]
            if isinstance(s, OptimState8bit):
                entry[key + "_codes"] = s.codes.flatten().tolist()
                entry[key + "_scale"] = values(s.scale)
            else:
                entry[key] = values(s)
        out["params"].append(entry)
    return out


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "adamw_8bit_golden.json")
    doc = {"generator": "tests/golden/make_adamw_8bit_golden.py", "torch": torch.__version__,
           "torchao": torchao.__version__,
           "compiled": os.environ.get("TORCHDYNAMO_DISABLE", "0") != "1", "steps": STEPS,
           "qmap_signed": list(get_qmap_signed()), "qmap_unsigned": list(get_qmap_unsigned()),
           "cases": [run(c) for c in CASES]}
    with open(out_path, "w") as f:
        json.dump(doc, f)
    print("wrote", out_path)


if __name__ == "__main__":
    main()
