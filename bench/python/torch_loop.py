#!/usr/bin/env python3
"""The Python anchor: the training loop trainer_bench runs, written in plain PyTorch.

    .venv/bin/python bench/python/torch_loop.py --model mlp --precision bf16 --steps 600 --warmup 50

Same model, batches, order, precision and step as build/bench/trainer_bench (see its header):
torch.autocast("cpu", bfloat16) for bf16; for bf16_masters a bf16 model with fp32 master copies
that the optimizer updates and that are copied back after each step; clip_grad_norm_(1.0);
torch.optim.AdamW (weight decay 0) with fused=True for adamw_torch_fused (the CPU fused kernel)
or the single-tensor loop for adamw_torch (what the CPU gets by default, as torch::optim::AdamW
does in C++); HF's linear decay as a LambdaLR. Prints one JSON line (trainer_bench's keys)."""

import torch
import torch.nn.functional as F

import common


def main():
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    images, targets, model, default_threads = common.setup(args)
    setup_rss_mib = common.status_mib("VmRSS")
    bf16 = args.precision != "fp32"

    masters = None
    if args.precision == "bf16_masters":
        model.to(torch.bfloat16)
        masters = [p.detach().float() for p in model.parameters()]
    params = masters if masters is not None else list(model.parameters())
    fused = args.optim == "adamw_torch_fused"
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, fused=fused or None,
                                  foreach=None if fused else False)
    total = args.warmup + args.steps
    # transformers.get_linear_schedule_with_warmup with no warmup.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, (total - step) / max(1, total)))

    torch.manual_seed(args.seed)  # dropout, as the Trainer seeds at train()
    model.train()
    order = common.epoch_order(images.shape[0], args.seed)
    loss_sum = torch.zeros((), dtype=torch.float)
    clock = common.StepClock(args.warmup, total)
    for step in range(total):
        index = order[step * args.batch_size:(step + 1) * args.batch_size]
        x, y = images.index_select(0, index), targets.index_select(0, index)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        loss_sum += loss.detach().float()
        if masters is not None:
            for master, param in zip(masters, model.parameters()):
                master.grad = param.grad.float()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if masters is not None:
            with torch.no_grad():
                for master, param in zip(masters, model.parameters()):
                    param.copy_(master)
        scheduler.step()
        optimizer.zero_grad()
        if masters is not None:
            model.zero_grad()
        clock.step_ended(step + 1)
    common.print_result("python", args, clock, loss_sum.item() / total, setup_rss_mib, default_threads)


if __name__ == "__main__":
    main()
