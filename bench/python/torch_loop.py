#!/usr/bin/env python3
"""The Python anchor: the training loop trainer_bench runs, written in plain PyTorch.

    .venv/bin/python bench/python/torch_loop.py --model mlp --precision bf16 --steps 600 --warmup 50

Same model, batches, order, precision and step as build/bench/trainer_bench (see its header):
torch.autocast("cpu", bfloat16) for bf16; for bf16_masters a bf16 model with fp32 master copies
that the optimizer updates and that are copied back after each step; clip_grad_norm_(1.0);
torch.optim.AdamW (weight decay 0) with fused=True for adamw_torch_fused (the CPU fused kernel)
or the single-tensor loop for adamw_torch (what the CPU gets by default, as torch::optim::AdamW
does in C++); HF's linear decay as a LambdaLR. Prints one JSON line (trainer_bench's keys)."""

import common


def main():
    args = common.parser(__doc__.splitlines()[0]).parse_args()
    images, targets, model, default_threads = common.setup(args)
    setup_rss_mib = common.status_mib("VmRSS")
    masters = common.prepare_precision(model, args)
    order = common.epoch_order(images.shape[0], args.seed)
    clock, loss_sum, _ = common.train_steps(model, model, masters, images, targets, order, args)
    total = args.warmup + args.steps
    common.print_result("python", args, clock, loss_sum.item() / total, setup_rss_mib, default_threads)


if __name__ == "__main__":
    main()
