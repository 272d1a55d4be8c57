#!/usr/bin/env python3
"""HF Trainer on transformers' LlamaForCausalLM: the Python side of bench/llama_anchor.

    .venv/bin/python bench/python/hf_llama.py --config cfg.json --precision bf16 --steps 40 --warmup 10

The data is train_llama's: the Jargon File read as bytes, the first 5% held out, the rest cut
into --block_size rows with labels = inputs (run_clm.py's group_texts). The model is
`LlamaForCausalLM(LlamaConfig.from_json_file(--config))` with its default attention (sdpa).
TrainingArguments as train_llama's defaults: use_cpu (or the GPU with --device cuda), bf16 for
the bf16 mode (autocast),
optim adamw_torch_fused (both sides' default), linear decay, max_grad_norm 1.0, weight decay 0,
no logging, saving or evaluation, no dataloader workers; --torch_compile adds
torch_compile=True.

Timed: each optimizer step from one on_step_end to the next (a TrainerCallback; on the GPU after
torch.cuda.synchronize(), so a step is its kernels' time, not its launches'); the speed is
the median over the steps after --warmup. Prints one JSON line: tokens_per_second, params,
mean_step_seconds."""

import argparse
import gzip
import json
import os
import statistics
import sys
import tempfile
import time
import warnings


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--block_size", type=int, default=128)
    p.add_argument("--learning_rate", type=float, default=3e-4)
    p.add_argument("--corpus", default="/usr/share/doc/jargon-text/jargon.txt.gz")
    p.add_argument("--torch_compile", action="store_true")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = p.parse_args()

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    import torch
    import transformers

    with gzip.open(args.corpus, "rb") as f:
        data = torch.tensor(list(f.read()), dtype=torch.long)
    train = data[data.numel() * 5 // 100 :]
    blocks = train[: train.numel() // args.block_size * args.block_size].view(-1, args.block_size)

    class Blocks(torch.utils.data.Dataset):
        def __len__(self):
            return blocks.shape[0]

        def __getitem__(self, i):
            return {"input_ids": blocks[i], "labels": blocks[i]}

    torch.manual_seed(42)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig.from_json_file(args.config))
    params = sum(p.numel() for p in model.parameters())
    ends = []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, training_args, state, control, **kwargs):
            if args.device == "cuda":
                torch.cuda.synchronize()
            ends.append(time.perf_counter())

    total = args.warmup + args.steps
    with tempfile.TemporaryDirectory(prefix="hf-llama-bench-") as output_dir:
        training_args = transformers.TrainingArguments(
            output_dir=output_dir, use_cpu=args.device == "cpu", bf16=args.precision == "bf16",
            max_steps=total,
            per_device_train_batch_size=args.batch_size, learning_rate=args.learning_rate,
            optim="adamw_torch_fused", weight_decay=0.0, lr_scheduler_type="linear",
            max_grad_norm=1.0, seed=42, dataloader_num_workers=0, logging_strategy="no",
            save_strategy="no", eval_strategy="no", report_to=[], disable_tqdm=True,
            torch_compile=args.torch_compile)
        trainer = transformers.Trainer(model=model, args=training_args, train_dataset=Blocks(),
                                       callbacks=[Clock()])
        trainer.train()
    steps = [b - a for a, b in zip(ends[args.warmup - 1 :], ends[args.warmup :])] if args.warmup else []
    if not steps:
        sys.exit("hf_llama.py: --warmup must be at least 1 (the first timed step starts at a step end)")
    median = statistics.median(steps)
    print(json.dumps({"impl": "hf", "tokens_per_second": args.batch_size * args.block_size / median,
                      "median_step_seconds": median, "params": params, "timed_steps": len(steps)}))


if __name__ == "__main__":
    main()
