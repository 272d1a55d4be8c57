#!/usr/bin/env python3
"""Writes what torch.nn.utils.clip_grad_norm_ returns and does on fixed gradients, which
tests/clip_grad_test.cpp (mantissa::clip_grad_norm_) must reproduce: to 1e-6 relative where every
gradient of a case is fp32/fp64, to two ulps of the narrowest dtype where a case has bf16/fp16
gradients (their norms are rounded to that dtype, so another CPU's summation order can move them
one unit).

Run with the project venv:  .venv/bin/python tests/golden/make_clip_grad_golden.py [OUT]
(default OUT: tests/golden/clip_grad_golden.json next to this script).

Each case lists the gradients (dtype, shape, values; null for a parameter without a gradient),
norm_type and max_norm, and PyTorch's results on the CPU with the default foreach path: the
returned total norm (value and dtype) and every gradient after clipping. Non-finite numbers are
written as the strings "inf", "-inf" and "nan" (JSON has no literal for them).
"""
import json
import math
import os
import sys

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


def enc(x):
    x = float(x)
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def values(t):
    return [enc(v) for v in t.detach().double().flatten().tolist()]


def grads_for(spec, gen):
    grads = []
    for item in spec:
        if item is None:
            grads.append(None)
            continue
        dtype, shape, scale = item
        grads.append((torch.randn(shape, generator=gen, dtype=torch.float64) * scale).to(DTYPES[dtype]))
    return grads


FP32 = [("float32", [4, 5], 1.0), ("float32", [7], 3.0), ("float32", [3, 2, 2], 0.5)]
MIXED = [("float32", [4, 5], 1.0), ("bfloat16", [6, 3], 2.0), ("float64", [5], 0.7),
         ("float32", [2], 4.0), ("bfloat16", [3], 1.0)]
CASES = {
    "fp32_norm2": (FP32, 2.0, 1.0),
    "fp32_norm1": (FP32, 1.0, 5.0),
    "fp32_norm_inf": (FP32, math.inf, 0.5),
    "fp32_norm3": (FP32, 3.0, 2.0),
    "fp32_no_clipping": (FP32, 2.0, 1e6),
    "mixed_dtypes_norm2": (MIXED, 2.0, 1.0),
    "mixed_dtypes_norm_inf": (MIXED, math.inf, 0.25),
    "bf16_only": ([("bfloat16", [8, 4], 1.0), ("bfloat16", [16], 2.0)], 2.0, 1.0),
    "fp16_and_fp32": ([("float16", [10], 1.0), ("float32", [3, 3], 1.0)], 2.0, 0.5),
    "fp64_only": ([("float64", [5, 5], 1.0), ("float64", [2], 1.0)], 2.0, 0.3),
    "param_without_grad": ([("float32", [3], 1.0), None, ("float32", [2, 2], 2.0)], 2.0, 1.0),
    "inf_in_grad": (FP32, 2.0, 1.0),
    "nan_in_grad": (FP32, 2.0, 1.0),
    "zero_grads": ([("float32", [3], 0.0), ("float32", [2], 0.0)], 2.0, 1.0),
}


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                  "clip_grad_golden.json")
    doc = {"torch": torch.__version__, "cases": {}}
    for index, (name, (spec, norm_type, max_norm)) in enumerate(CASES.items()):
        gen = torch.Generator().manual_seed(1000 + index)
        grads = grads_for(spec, gen)
        if name == "inf_in_grad":
            grads[1][2] = math.inf
        if name == "nan_in_grad":
            grads[2][1, 0, 1] = math.nan
        params = []
        for g in grads:
            if g is None:
                params.append(torch.nn.Parameter(torch.zeros(2)))
            else:
                p = torch.nn.Parameter(torch.zeros_like(g))
                p.grad = g.clone()
                params.append(p)
        total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
        doc["cases"][name] = {
            "norm_type": enc(norm_type),
            "max_norm": max_norm,
            "grads": [None if g is None else {"dtype": str(g.dtype).split(".")[-1], "shape": list(g.shape),
                                              "values": values(g)} for g in grads],
            "total_norm": enc(total.item()),
            "total_norm_dtype": str(total.dtype).split(".")[-1],
            "clipped": [None if p.grad is None else values(p.grad) for p in params],
        }
    with open(out_path, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
