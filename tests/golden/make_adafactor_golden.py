#!/usr/bin/env python3
"""Writes what HF's transformers.optimization.Adafactor, built as HF's Trainer builds it for
--optim adafactor (scale_parameter=False, relative_step=False, warmup_init=False), does to a small
model's parameters over 20 steps of fixed gradients. tests/adafactor_test.cpp
(mantissa::optim::Adafactor) must reproduce the parameters and the state to 1e-6 (fp32) or one
bf16 unit in the last place (bf16 parameters, which both round an fp32 result to nearest).

Run with the project venv:  .venv/bin/python tests/golden/make_adafactor_golden.py [OUT]
(default OUT: tests/golden/adafactor_golden.json next to this script).

Each case: the optimizer's keyword arguments, the parameters (name, group, dtype, shape, initial
values), the gradient of every parameter at every step, and after the last step every
parameter and every state tensor under HF's keys (plus `step`). Group 0 takes the case's
weight_decay, group 1 none, as HF's create_optimizer splits them.
"""
import json
import os
import sys

import torch
from transformers.optimization import Adafactor

STEPS = 20
# name, shape, group: a two-layer MLP's weights and bias, and a 3-d tensor (factored over its
# last two dimensions).
PARAMS = [("w1", (6, 5), 0), ("b1", (6,), 1), ("w2", (3, 6), 0), ("w3", (2, 3, 4), 0)]
CASES = [
    {"name": "hf_trainer_defaults", "dtype": "float32", "lr": 1e-2, "weight_decay": 0.0,
     "optim_args": {}},
    {"name": "beta1_decay_clip", "dtype": "float32", "lr": 3e-2, "weight_decay": 0.1,
     "optim_args": {"beta1": 0.9, "clip_threshold": 0.5, "decay_rate": -0.6, "eps": 1e-3}},
    {"name": "bf16_params", "dtype": "bfloat16", "lr": 1e-2, "weight_decay": 0.0,
     "optim_args": {}},
]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def values(t):
    return t.detach().double().flatten().tolist()


def run(case, seed):
    gen = torch.Generator().manual_seed(seed)
    dtype = DTYPES[case["dtype"]]
    params = [torch.randn(shape, generator=gen).to(dtype).requires_grad_() for _, shape, _ in PARAMS]
    initial = [p.detach().clone() for p in params]
    groups = [{"params": [p for p, (_, _, g) in zip(params, PARAMS) if g == 0],
               "weight_decay": case["weight_decay"]},
              {"params": [p for p, (_, _, g) in zip(params, PARAMS) if g == 1],
               "weight_decay": 0.0}]
    extra = dict(case["optim_args"])
    if "eps" in extra:
        extra["eps"] = (extra["eps"], 1e-3)
    opt = Adafactor(groups, lr=case["lr"], scale_parameter=False, relative_step=False,
                    warmup_init=False, **extra)
    grads = []
    for step in range(STEPS):
        step_grads = [(torch.randn(p.shape, generator=gen) * (0.1 + step % 3)).to(dtype)
                      for p in params]
        for p, g in zip(params, step_grads):
            p.grad = g
        opt.step()
        grads.append([values(g) for g in step_grads])
    out = {"name": case["name"], "dtype": case["dtype"], "lr": case["lr"],
           "weight_decay": case["weight_decay"], "optim_args": case["optim_args"],
           "params": [], "grads": grads}
    for (name, shape, group), p, p0 in zip(PARAMS, params, initial):
        state = opt.state[p]
        out["params"].append({
            "name": name, "group": group, "shape": list(shape), "initial": values(p0),
            "final": values(p), "step": int(state["step"]),
            "state": {k: {"shape": list(v.shape), "values": values(v)}
                      for k, v in state.items() if torch.is_tensor(v) and k != "RMS"}})
    return out


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "adafactor_golden.json")
    doc = {"generator": "tests/golden/make_adafactor_golden.py", "torch": torch.__version__,
           "steps": STEPS, "cases": [run(c, 1000 + i) for i, c in enumerate(CASES)]}
    with open(out_path, "w") as f:
        json.dump(doc, f)
    print("wrote", out_path)


if __name__ == "__main__":
    main()
