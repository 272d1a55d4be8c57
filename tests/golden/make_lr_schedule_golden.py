#!/usr/bin/env python3
"""Writes the learning rates of Hugging Face's schedules that tests/lr_scheduler_test.cpp must
reproduce bit for bit.

Run with the project venv:  .venv/bin/python tests/golden/make_lr_schedule_golden.py [OUT]
(default OUT: tests/golden/lr_schedules.json next to this script).

Each schedule is built by transformers' own `transformers.get_scheduler(name, optimizer,
num_warmup_steps, num_training_steps, scheduler_specific_kwargs=kwargs)`, as HF's Trainer builds
it from `lr_scheduler_type` and `lr_scheduler_kwargs`, over a real torch.optim.SGD with two param
groups, so the constructor's initial step, last_epoch and the `base_lr * lambda(last_epoch)`
product are PyTorch's. The optimizer's default lr (`optimizer.defaults["lr"]`, which polynomial's
`lr_end` and `min_lr` are relative to) differs from both groups' lrs, so a test that used a
group's lr instead would fail. For each case the file holds the lr of both groups after
construction (index 0) and after each of `steps` calls to scheduler.step(), plus the scheduler's
state_dict at the end. The kwargs are written as given: 2 stays an int and 2.0 a float.
"""
import json
import os
import sys
import warnings

import torch
import transformers

BASE_LRS = [1e-3, 3e-4]
DEFAULT_LR = 2e-3

# (warmup, total, steps): the main case (5 warmup steps, 30 training steps, stepped past the
# end to show what happens there), no warmup, warmup == total, and a few shapes of their own.
MAIN, NO_WARMUP, WARMUP_IS_TOTAL = (5, 30, 36), (0, 10, 12), (4, 4, 7)

# (schedule, kwargs, (warmup, total, steps))
CASES = []
for config in (MAIN, NO_WARMUP, WARMUP_IS_TOTAL):
    for name in ("constant", "constant_with_warmup", "linear", "cosine"):
        CASES.append((name, {}, config))
CASES += [
    ("cosine", {"num_cycles": 1.5}, MAIN),
    ("cosine", {"num_cycles": 1}, NO_WARMUP),
    ("cosine_with_restarts", {}, MAIN),
    ("cosine_with_restarts", {"num_cycles": 3}, MAIN),
    ("cosine_with_restarts", {"num_cycles": 2}, NO_WARMUP),
    ("cosine_with_restarts", {"num_cycles": 2.5}, (4, 20, 24)),
    ("cosine_with_restarts", {}, WARMUP_IS_TOTAL),
    ("polynomial", {}, MAIN),
    ("polynomial", {"lr_end": 1e-4, "power": 2.0}, MAIN),
    ("polynomial", {"power": 0.5}, NO_WARMUP),
    ("polynomial", {"lr_end": 0, "power": 3}, (3, 17, 20)),
    ("polynomial", {"lr_end": 5e-4}, (6, 4, 9)),  # warmup past the end: never divides by 0
    ("inverse_sqrt", {}, MAIN),  # timescale = num_warmup_steps
    ("inverse_sqrt", {}, NO_WARMUP),  # timescale = 10_000
    ("inverse_sqrt", {"timescale": 7}, MAIN),
    ("inverse_sqrt", {"timescale": 1}, NO_WARMUP),
    ("cosine_with_min_lr", {"min_lr_rate": 0.1}, MAIN),
    ("cosine_with_min_lr", {"min_lr": 1e-4}, NO_WARMUP),
    ("cosine_with_min_lr", {"min_lr": 2e-4, "num_cycles": 1.0}, (4, 20, 24)),
    ("cosine_with_min_lr", {"min_lr_rate": 0.5, "num_cycles": 0.75}, MAIN),
    ("cosine_with_min_lr", {"min_lr_rate": 0}, WARMUP_IS_TOTAL),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}, MAIN),
    ("cosine_warmup_with_min_lr", {"min_lr": 1e-4, "warmup_lr_rate": 0.1}, MAIN),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.05}, NO_WARMUP),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.0, "warmup_lr_rate": 0.5, "num_cycles": 1},
     (4, 20, 24)),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1, "warmup_lr_rate": 0.2}, (1, 10, 12)),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1, "warmup_lr_rate": 0.2}, (2, 10, 12)),
    ("warmup_stable_decay", {"num_decay_steps": 10}, MAIN),  # stable: 30 - 5 - 10
    ("warmup_stable_decay", {"num_decay_steps": 10, "num_stable_steps": 8, "warmup_type": "cosine",
                             "decay_type": "linear", "min_lr_ratio": 0.1}, MAIN),
    ("warmup_stable_decay", {"num_decay_steps": 8, "warmup_type": "1-sqrt", "decay_type": "1-sqrt",
                             "min_lr_ratio": 0.05}, (4, 20, 24)),
    ("warmup_stable_decay", {"num_decay_steps": 6, "num_cycles": 1.0}, NO_WARMUP),
    ("warmup_stable_decay", {"num_decay_steps": 0}, (3, 10, 12)),
    ("warmup_stable_decay", {"num_decay_steps": 20, "decay_type": "linear"}, (5, 20, 24)),  # stable -5
    ("warmup_stable_decay", {"num_decay_steps": 2, "warmup_type": "cosine", "min_lr_ratio": 1}, WARMUP_IS_TOTAL),
]


def run(name, kwargs, warmup, total, steps):
    params = [torch.nn.Parameter(torch.zeros(1)) for _ in BASE_LRS]
    optimizer = torch.optim.SGD([{"params": [p], "lr": lr} for p, lr in zip(params, BASE_LRS)],
                                lr=DEFAULT_LR)
    with warnings.catch_warnings():
        # get_wsd_schedule warns that num_stable_steps wins over num_training_steps.
        warnings.simplefilter("ignore")
        scheduler = transformers.get_scheduler(name, optimizer, num_warmup_steps=warmup,
                                               num_training_steps=total,
                                               scheduler_specific_kwargs=dict(kwargs))
    lrs = [[group["lr"] for group in optimizer.param_groups]]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        lrs.append([group["lr"] for group in optimizer.param_groups])
    state = scheduler.state_dict()
    return {
        "name": name,
        "kwargs": kwargs,
        "num_warmup_steps": warmup,
        "num_training_steps": total,
        "steps": steps,
        "lrs": lrs,
        "last_lr": scheduler.get_last_lr(),
        "state_dict": {"base_lrs": state["base_lrs"], "last_epoch": state["last_epoch"],
                       "_step_count": state["_step_count"], "_last_lr": state["_last_lr"]},
    }


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                  "lr_schedules.json")
    doc = {"source": f"transformers {transformers.__version__}", "torch": torch.__version__,
           "base_lrs": BASE_LRS, "defaults_lr": DEFAULT_LR,
           "cases": [run(name, kwargs, *config) for name, kwargs, config in CASES]}
    # One line per case, so that a regenerated file diffs case by case.
    cases = doc.pop("cases")
    text = json.dumps(doc, indent=1)[:-2] + ',\n "cases": [\n'
    text += ",\n".join("  " + json.dumps(case) for case in cases) + "\n ]\n}\n"
    assert json.loads(text)["cases"] == cases
    with open(out_path, "w") as f:
        f.write(text)
    print(f"wrote {out_path} ({doc['source']}, {len(cases)} cases)")


if __name__ == "__main__":
    main()
