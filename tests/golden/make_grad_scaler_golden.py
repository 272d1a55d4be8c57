#!/usr/bin/env python3
"""Writes the reference trajectory of torch.amp.GradScaler that tests/grad_scaler_golden_test.cpp
must reproduce: scale and growth tracker exactly, parameters to a tolerance relative to their size
(another CPU's kernels round matmul, tanh and the reductions differently in the last bit).

Run with the project venv:  .venv/bin/python tests/golden/make_grad_scaler_golden.py [OUT]
(default OUT: tests/golden/grad_scaler_golden.json next to this script).

Scenario (50 steps): a Linear(8, 16) -> Tanh -> Linear(16, 4) model in fp32, SGD with momentum,
MSE loss on fixed random batches. Infs and nans are written into chosen gradients after the
scaled backward (single, consecutive and nan cases), and one batch's targets are stretched to
HUGE_TARGET (close to float32's largest value), so that its scaled gradients overflow on their
own (at any loss scale above about 40; both scenarios are far above it there) and the step is
skipped. Each scenario runs the same steps with different scaler settings. Everything the C++
test needs (initial weights, batches, injections) is in the file.

The weights must stay bounded (BOUND): the point of the file is the scaler's trajectory, and a
step taken on a huge batch would make every later parameter huge, so that one ulp of another
CPU's kernel is a large absolute difference. main() checks both properties before writing.
"""
import json
import math
import os
import sys

import torch

STEPS = 50
INJECT = {3: ("inf", "0.weight"), 7: ("nan", "2.bias"), 8: ("inf", "2.weight"),
          20: ("inf", "0.bias"), 21: ("nan", "0.weight"), 22: ("-inf", "2.weight"),
          35: ("nan", "2.weight")}
HUGE_BATCH = 41          # this batch's targets are stretched to HUGE_TARGET: a natural overflow
HUGE_TARGET = 1e38       # largest |target| of that batch; its scaled gradients are ~1e37 * scale
BOUND = 10.0             # every parameter of every step stays below this in magnitude
SCENARIOS = {
    "pytorch_defaults_fast_growth": dict(init_scale=2.0 ** 16, growth_factor=2.0,
                                         backoff_factor=0.5, growth_interval=3),
    "odd_factors": dict(init_scale=1000.0, growth_factor=1.7, backoff_factor=0.3,
                        growth_interval=2),
}


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def make_batches():
    g = torch.Generator().manual_seed(99)
    batches = []
    for step in range(STEPS):
        x = torch.randn(6, 8, generator=g)
        y = torch.randn(6, 4, generator=g)
        if step == HUGE_BATCH:
            y = y / y.abs().max() * HUGE_TARGET
        batches.append((x, y))
    return batches


def flat(tensor):
    return [float(v) for v in tensor.detach().reshape(-1).tolist()]


def run(settings, batches):
    model = make_model()
    initial = {name: flat(p) for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", **settings)
    params = dict(model.named_parameters())
    trajectory = []
    for step, (x, y) in enumerate(batches):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if step in INJECT:
            kind, name = INJECT[step]
            value = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}[kind]
            with torch.no_grad():
                params[name].grad.view(-1)[1] = value
        scaler.step(optimizer)
        scaler.update()
        trajectory.append({
            "scale": scaler.get_scale(),
            "growth_tracker": int(scaler._get_growth_tracker()),
            "params": {name: flat(p) for name, p in model.named_parameters()},
        })
    return initial, trajectory, scaler.state_dict()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                             "grad_scaler_golden.json")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    batches = make_batches()
    doc = {"torch_version": torch.__version__, "steps": STEPS,
           "inject": {str(k): list(v) for k, v in INJECT.items()},
           "huge_batch": HUGE_BATCH, "bound": BOUND,
           "batches": [{"x": flat(x), "y": flat(y)} for x, y in batches],
           "optimizer": {"lr": 0.05, "momentum": 0.9}, "scenarios": {}}
    for name, settings in SCENARIOS.items():
        initial, trajectory, state = run(settings, batches)
        before = trajectory[HUGE_BATCH - 1]
        after = trajectory[HUGE_BATCH]
        assert after["scale"] < before["scale"] and after["params"] == before["params"], (
            f"{name}: the batch of step {HUGE_BATCH} did not overflow at scale {before['scale']}")
        largest = max(abs(v) for t in trajectory for p in t["params"].values() for v in p)
        assert largest < BOUND, f"{name}: a parameter reached {largest}, above BOUND={BOUND}"
        doc["initial_params"] = initial
        doc["scenarios"][name] = {"settings": settings, "trajectory": trajectory,
                                  "final_state_dict": state}
    with open(out, "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
