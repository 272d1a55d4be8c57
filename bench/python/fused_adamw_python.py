#!/usr/bin/env python3
"""Step time of mantissa.optim.FusedAdamW beside torch.optim.AdamW(fused=True), from Python.

Three settings of a model of --params parameters (--tensors equal tensors):
  fp32           both optimizers on fp32 parameters
  bf16+masters   mantissa: bf16 parameters, master_weights=True (fp32 masters in the state);
                 torch: fused AdamW on fp32 masters, plus what a Python loop must do around it
                 (copy the bf16 gradients into the masters' .grad, copy the masters back)
  bf16 kahan     mantissa: pure bf16, low_precision_update="kahan";
                 torch: fused AdamW on the bf16 parameters (nearest rounding, bf16 moments)
Each repeat times --steps steps of every setting in turn (interleaved), after one warm-up step;
the table gives medians over repeats of the time per step, mantissa's time over torch's, and the
bytes per parameter each holds (parameters, gradients and optimizer state, counted from the
tensors). Prints a markdown table and one JSON line.

  OMP_NUM_THREADS=1 .venv/bin/python bench/python/fused_adamw_python.py --device cpu
"""

import argparse
import json
import statistics
import time

import torch

import mantissa
from mantissa.optim import FusedAdamW


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def held_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        if t is None or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


class Setting:
    """One optimizer over its own copy of the model, with one step's work as a callable."""

    def __init__(self, name, impl, params, optimizer, around=None, extra=()):
        self.name, self.impl, self.params, self.optimizer = name, impl, params, optimizer
        self.around, self.extra = around, list(extra)

    def step(self):
        if self.around is not None:
            self.around[0]()
        self.optimizer.step()
        if self.around is not None:
            self.around[1]()

    def bytes_per_param(self):
        tensors = [p for p in self.params] + [p.grad for p in self.params] + self.extra
        for state in self.optimizer.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
        return held_bytes(tensors) / sum(p.numel() for p in self.params)


def build(numel, tensors, device):
    per = numel // tensors
    generator = torch.Generator().manual_seed(0)
    init = [torch.randn(per, generator=generator) for _ in range(tensors)]
    grads = [torch.randn(per, generator=generator) * 1e-2 for _ in range(tensors)]

    def model(dtype):
        params = [torch.nn.Parameter(t.to(device, dtype)) for t in init]
        for p, g in zip(params, grads):
            p.grad = g.to(device, dtype)
        return params

    settings = []
    p = model(torch.float32)
    settings.append(Setting("fp32", "mantissa", p, FusedAdamW(p)))
    p = model(torch.float32)
    settings.append(Setting("fp32", "torch", p, torch.optim.AdamW(p, fused=True)))

    p = model(torch.bfloat16)
    settings.append(Setting("bf16+masters", "mantissa", p, FusedAdamW(p, master_weights=True)))
    p = model(torch.bfloat16)
    masters = [torch.nn.Parameter(q.detach().float()) for q in p]
    for m in masters:
        m.grad = torch.empty_like(m)

    def copy_grads(p=p, masters=masters):
        torch._foreach_copy_([m.grad for m in masters], [q.grad for q in p])

    def copy_back(p=p, masters=masters):
        torch._foreach_copy_([q.data for q in p], [m.data for m in masters])

    settings.append(
        Setting("bf16+masters", "torch", p, torch.optim.AdamW(masters, fused=True),
                around=(copy_grads, copy_back),
                extra=masters + [m.grad for m in masters]))

    p = model(torch.bfloat16)
    settings.append(Setting("bf16 kahan", "mantissa", p,
                            FusedAdamW(p, low_precision_update="kahan")))
    p = model(torch.bfloat16)
    settings.append(Setting("bf16 nearest", "torch", p, torch.optim.AdamW(p, fused=True)))
    return settings


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=int, default=10_000_000)
    parser.add_argument("--tensors", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    settings = build(args.params, args.tensors, device)
    for s in settings:  # warm-up: creates the state
        s.step()
    sync(device)
    times = {id(s): [] for s in settings}
    for _ in range(args.repeats):
        for s in settings:
            sync(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                s.step()
            sync(device)
            times[id(s)].append((time.perf_counter() - start) / args.steps)
    rows = []
    for s in settings:
        rows.append(dict(setting=s.name, impl=s.impl,
                         step_ms=1e3 * statistics.median(times[id(s)]),
                         min_ms=1e3 * min(times[id(s)]), max_ms=1e3 * max(times[id(s)]),
                         bytes_per_param=s.bytes_per_param()))
    # mantissa over the torch row of the same setting (bf16 kahan is paired with bf16 nearest)
    for mine, theirs in zip(rows[0::2], rows[1::2]):
        mine["vs_torch"] = mine["step_ms"] / theirs["step_ms"]
    print(f"device {device}, {torch.get_num_threads()} threads, {args.params / 1e6:g}M params "
          f"in {args.tensors} tensors, {args.steps} steps x {args.repeats} interleaved repeats, "
          f"torch {torch.__version__}, mantissa ops {mantissa.library_path}")
    print("| setting | optimizer | step ms (median) | min-max ms | mantissa / torch | B/param |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        who = "mantissa FusedAdamW" if r["impl"] == "mantissa" else "torch AdamW(fused=True)"
        ratio = f"{r['vs_torch']:.2f}" if "vs_torch" in r else ""
        print(f"| {r['setting']} | {who} | {r['step_ms']:.2f} | {r['min_ms']:.2f}-{r['max_ms']:.2f}"
              f" | {ratio} | {r['bytes_per_param']:.1f} |")
    print(json.dumps(dict(device=str(device), threads=torch.get_num_threads(),
                          params=args.params, rows=rows)))


if __name__ == "__main__":
    main()
