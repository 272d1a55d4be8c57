#!/usr/bin/env python3
"""Writes the learning rates of Hugging Face's schedules that tests/lr_scheduler_test.cpp must
reproduce (to 1e-12 relative; in practice bit for bit).

Run with the project venv:  .venv/bin/python tests/golden/make_lr_schedule_golden.py [OUT]
(default OUT: tests/golden/lr_schedules.json next to this script).

Where the schedules come from:
- If `transformers` is importable, its own `transformers.get_scheduler(name, optimizer,
  num_warmup_steps, num_training_steps)` builds each scheduler.
- Otherwise (the project venv does not install transformers) the four lambdas below are
  hand-copied from transformers/src/transformers/optimization.py
  (_get_constant_lambda, _get_constant_schedule_with_warmup_lr_lambda,
  _get_linear_schedule_with_warmup_lr_lambda, _get_cosine_schedule_with_warmup_lr_lambda with
  num_cycles=0.5), and wrapped with functools.partial exactly as transformers does.
The file records which of the two produced it ("source").

Either way the scheduler itself is PyTorch's real torch.optim.lr_scheduler.LambdaLR over a real
torch.optim.SGD with two param groups, so the constructor's initial step, last_epoch and the
`base_lr * lambda(last_epoch)` product are PyTorch's. For each config the file holds the lr of
both groups after construction (index 0) and after each of `steps` calls to scheduler.step(),
plus the scheduler's state_dict at the end.
"""
import functools
import json
import math
import os
import sys

import torch

SCHEDULES = ["constant", "constant_with_warmup", "linear", "cosine"]
BASE_LRS = [1e-3, 3e-4]
# (warmup, total, steps): the main case (5 warmup steps, 30 training steps, stepped past the
# end to show what happens there), no warmup, and warmup == total.
CONFIGS = [(5, 30, 36), (0, 10, 12), (4, 4, 7)]


# --- hand-copied from transformers/optimization.py -------------------------------------------
def _get_constant_lambda(_=None):
    return 1


def _get_constant_schedule_with_warmup_lr_lambda(current_step: int, *, num_warmup_steps: int):
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1.0, num_warmup_steps))
    return 1.0


def _get_linear_schedule_with_warmup_lr_lambda(current_step: int, *, num_warmup_steps: int, num_training_steps: int):
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    return max(0.0, float(num_training_steps - current_step) / float(max(1, num_training_steps - num_warmup_steps)))


def _get_cosine_schedule_with_warmup_lr_lambda(
    current_step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float
):
    if current_step < num_warmup_steps:
        return float(current_step) / float(max(1, num_warmup_steps))
    progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))
# --------------------------------------------------------------------------------------------


def hand_copied_scheduler(name, optimizer, num_warmup_steps, num_training_steps):
    if name == "constant":
        lr_lambda = _get_constant_lambda
    elif name == "constant_with_warmup":
        lr_lambda = functools.partial(_get_constant_schedule_with_warmup_lr_lambda, num_warmup_steps=num_warmup_steps)
    elif name == "linear":
        lr_lambda = functools.partial(_get_linear_schedule_with_warmup_lr_lambda,
                                      num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps)
    elif name == "cosine":
        lr_lambda = functools.partial(_get_cosine_schedule_with_warmup_lr_lambda, num_warmup_steps=num_warmup_steps,
                                      num_training_steps=num_training_steps, num_cycles=0.5)
    else:
        raise ValueError(name)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def make_scheduler(name, optimizer, warmup, total):
    try:
        import transformers
    except ImportError:
        return hand_copied_scheduler(name, optimizer, warmup, total), "hand-copied transformers formulas"
    return (transformers.get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=total),
            f"transformers {transformers.__version__}")


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                  "lr_schedules.json")
    doc = {"base_lrs": BASE_LRS, "torch": torch.__version__, "configs": []}
    for warmup, total, steps in CONFIGS:
        config = {"num_warmup_steps": warmup, "num_training_steps": total, "steps": steps, "schedules": {}}
        for name in SCHEDULES:
            params = [torch.nn.Parameter(torch.zeros(1)) for _ in BASE_LRS]
            optimizer = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, BASE_LRS)])
            scheduler, source = make_scheduler(name, optimizer, warmup, total)
            doc["source"] = source
            lrs = [[group["lr"] for group in optimizer.param_groups]]
            for _ in range(steps):
                optimizer.step()
                scheduler.step()
                lrs.append([group["lr"] for group in optimizer.param_groups])
            state = scheduler.state_dict()
            config["schedules"][name] = {
                "lrs": lrs,
                "last_lr": scheduler.get_last_lr(),
                "state_dict": {"base_lrs": state["base_lrs"], "last_epoch": state["last_epoch"],
                               "_step_count": state["_step_count"], "_last_lr": state["_last_lr"]},
            }
        doc["configs"].append(config)
    with open(out_path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {out_path} ({doc['source']})")


if __name__ == "__main__":
    main()
