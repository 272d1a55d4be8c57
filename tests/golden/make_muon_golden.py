#!/usr/bin/env python3
"""Writes what torch.optim.Muon (over the 2-d hidden weights) stepped together with
torch.optim.AdamW (over the embedding, the LM head and the bias) does to a small model over 20
steps, for tests/muon_test.cpp (mantissa::optim::Muon through `--optim muon`): the parameters and
the states after the last step. Both sides run the Newton-Schulz iteration in bf16, so fp32
parameters must agree to 1e-5 relative and bf16 ones to one unit in the last place.

Run with the project venv:  .venv/bin/python tests/golden/make_muon_golden.py [OUT]
(default OUT: tests/golden/muon_golden.json next to this script).

The initial parameters and every gradient are a formula of the element's index and the step
(`pattern`, float64 rounded to the case's dtype), which the C++ test computes the same way.
"""
import json
import os
import sys

import torch

STEPS = 20
# name, shape: what `--optim muon` splits by name and shape (fc1/fc2 weights to Muon; one tall,
# one wide, so both orientations of the iteration run), the rest to AdamW.
PARAMS = [("embed.weight", (16, 8)), ("blocks.0.fc1.weight", (24, 8)),
          ("blocks.0.fc1.bias", (24,)), ("blocks.0.fc2.weight", (8, 24)),
          ("lm_head.weight", (16, 8))]
MUON = {"blocks.0.fc1.weight", "blocks.0.fc2.weight"}
CASES = [
    {"name": "defaults", "dtype": "float32", "lr": 0.02, "adamw_lr": 0.02, "weight_decay": 0.01,
     "momentum": 0.95, "nesterov": True, "ns_coefficients": [3.4445, -4.7750, 2.0315],
     "ns_steps": 5, "adjust_lr_fn": "original", "betas": [0.9, 0.999], "adam_eps": 1e-8},
    {"name": "plain_momentum_match_rms", "dtype": "float32", "lr": 0.01, "adamw_lr": 0.003,
     "weight_decay": 0.1, "momentum": 0.9, "nesterov": False,
     "ns_coefficients": [3.0, -3.2, 1.2], "ns_steps": 3, "adjust_lr_fn": "match_rms_adamw",
     "betas": [0.8, 0.95], "adam_eps": 1e-6},
    {"name": "bf16_params", "dtype": "bfloat16", "lr": 0.02, "adamw_lr": 0.02,
     "weight_decay": 0.01, "momentum": 0.95, "nesterov": True,
     "ns_coefficients": [3.4445, -4.7750, 2.0315], "ns_steps": 5, "adjust_lr_fn": "original",
     "betas": [0.9, 0.999], "adam_eps": 1e-8},
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
    params = {name: pattern(shape, k, -1, 0.5).to(dtype).requires_grad_()
              for k, (name, shape) in enumerate(PARAMS)}
    muon = torch.optim.Muon([params[n] for n, _ in PARAMS if n in MUON],
                            lr=case["lr"], weight_decay=case["weight_decay"],
                            momentum=case["momentum"], nesterov=case["nesterov"],
                            ns_coefficients=tuple(case["ns_coefficients"]),
                            ns_steps=case["ns_steps"], adjust_lr_fn=case["adjust_lr_fn"])
    adamw = torch.optim.AdamW(
        [{"params": [params["embed.weight"], params["lm_head.weight"]],
          "weight_decay": case["weight_decay"]},
         {"params": [params["blocks.0.fc1.bias"]], "weight_decay": 0.0}],
        lr=case["adamw_lr"], betas=tuple(case["betas"]), eps=case["adam_eps"], foreach=False)
    for step in range(STEPS):
        for k, (name, shape) in enumerate(PARAMS):
            params[name].grad = pattern(shape, k, step, 0.1 * (1 + step % 3)).to(dtype)
        muon.step()
        adamw.step()
    out = dict(case)
    out["params"] = []
    for name, shape in PARAMS:
        p = params[name]
        state = (muon if name in MUON else adamw).state[p]
        out["params"].append({
            "name": name, "shape": list(shape), "final": values(p),
            "state": {k: values(v) for k, v in state.items() if k != "step"},
            "step": float(state["step"]) if "step" in state else None})
    return out


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "muon_golden.json")
    doc = {"generator": "tests/golden/make_muon_golden.py", "torch": torch.__version__,
           "steps": STEPS, "cases": [run(c) for c in CASES]}
    with open(out_path, "w") as f:
        json.dump(doc, f)
    print("wrote", out_path)


if __name__ == "__main__":
    main()
