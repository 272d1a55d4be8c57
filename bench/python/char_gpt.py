#!/usr/bin/env python3
"""examples/char_gpt in PyTorch, for measuring mantissa against Python side by side.

The same model (GPT-2 layout, weight tying, GPT-2 init), the same corpus and vocabulary, the
same step as mantissa's Trainer with HF's defaults: torch.autocast, GradScaler for fp16,
clip_grad_norm_(1.0), torch.optim.AdamW(fused=True) with HF's weight-decay split, a linear
schedule. Random windows of block_size + 1 characters, as the C++ program draws them.

    python bench/python/char_gpt.py --model_size gpt2-small --precision bf16 --steps 40

Prints one JSON line: the median tokens/s over the timed steps (after --warmup steps), the
last loss, the parameter count.
"""
import argparse
import gzip
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

PRESETS = {
    "tiny": dict(n_layer=2, n_head=4, n_embd=128, block_size=128),
    "small": dict(n_layer=6, n_head=6, n_embd=384, block_size=256),
    "gpt2-small": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024),
}
JARGON_FILE = "/usr/share/doc/jargon-text/jargon.txt.gz"


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, c // self.n_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.fc_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class CharGpt(nn.Module):
    def __init__(self, vocab_size, n_layer, n_head, n_embd, block_size):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.gradient_checkpointing = False  # HF's flag; --gradient_checkpointing sets it
        residual_std = 0.02 / math.sqrt(2 * n_layer)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, residual_std if name.endswith(("attn.proj.weight", "fc_proj.weight")) else 0.02)
                if name.endswith(".bias"):
                    p.zero_()

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            if self.gradient_checkpointing and self.training:
                # The reentrant variant, as mantissa::nn::checkpoint recomputes.
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=True)
            else:
                x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def load_tokens(path, max_chars):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        text = f.read()
    if max_chars > 0:
        text = text[:max_chars]
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), len(chars)


# Where a step's time goes, by kind of ATen op (the first pattern an op's name contains wins).
OP_KINDS = [
    ("gemm", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
    ("attention", ("scaled_dot_product", "flash_attention")),
    ("gelu", ("gelu",)),
    ("layer_norm", ("layer_norm",)),
    ("optimizer", ("_fused_adamw", "adamw")),
    ("grad_norm_clip", ("norm", "clamp", "_foreach_mul")),
    ("loss", ("log_softmax", "nll_loss", "cross_entropy")),
    ("embedding", ("embedding",)),
    ("dtype_casts_and_copies", ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous")),
    ("add_and_accumulate", ("aten::add", "aten::sum", "aten::fill_", "aten::zero_")),
]


def time_by_op_kind(train_step, steps, sync):
    """Runs `steps` training steps under torch.profiler and returns each kind's share of the
    ops' own (self) CPU time, the ops' total, and the steps' wall time (ms per step)."""
    from torch.profiler import ProfilerActivity, profile
    sync()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            train_step()
        sync()
        wall = time.perf_counter() - start
    shares = {}
    total = 0.0
    for event in prof.key_averages():
        self_us = event.self_cpu_time_total
        total += self_us
        kind = next((k for k, patterns in OP_KINDS if any(p in event.key for p in patterns)), "other")
        shares[kind] = shares.get(kind, 0.0) + self_us
    return {
        "steps": steps,
        "wall_ms_per_step": 1e3 * wall / steps,
        "op_self_ms_per_step": total / 1e3 / steps,
        "share_of_op_time": {k: round(v / total, 4) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_size", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16", "fp16"])
    parser.add_argument("--steps", type=int, default=40, help="timed optimizer steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--learning_rate", type=float, default=3e-4)
    parser.add_argument("--weight_decay", type=float, default=0.0)
    parser.add_argument("--corpus", default=JARGON_FILE)
    parser.add_argument("--max_corpus_chars", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--compile", action="store_true",
                        help="run the model through torch.compile (the warm-up steps hold the "
                             "compilation)")
    parser.add_argument("--optimizer", default="fused", choices=["fused", "for-loop"],
                        help="torch.optim.AdamW(fused=True) or its per-tensor loop (foreach=False)")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    parser.add_argument("--gradient_checkpointing", action="store_true",
                        help="recompute each block in the backward (torch.utils.checkpoint)")
    parser.add_argument("--profile_steps", type=int, default=0,
                        help="after the timed steps, run this many more under torch.profiler and "
                             "add where their time went (share of each kind of op) to the output")
    args = parser.parse_args()

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = args.precision == "tf32"
    tokens, vocab_size = load_tokens(args.corpus, args.max_corpus_chars)
    config = PRESETS[args.model_size]
    block = config["block_size"]
    model = CharGpt(vocab_size, **config).to(device)
    model.gradient_checkpointing = args.gradient_checkpointing
    n_params = sum(p.numel() for p in model.parameters())
    forward = torch.compile(model) if args.compile else model

    # HF's split: decay for >= 2-d weights only.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    # PyTorch's fastest AdamW on either device (its fused CPU kernel exists since 2.4).
    fused = args.optimizer == "fused"
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.learning_rate, fused=fused, foreach=None if fused else False)
    total = args.warmup + args.steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, (total - s) / total))
    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler(device.type, enabled=args.precision == "fp16")

    generator = torch.Generator().manual_seed(args.seed)
    starts_max = tokens.numel() - block - 1

    def batch():
        starts = torch.randint(0, starts_max, (args.batch_size,), generator=generator)
        windows = torch.stack([tokens[s:s + block + 1] for s in starts.tolist()])
        if device.type == "cuda":
            windows = windows.pin_memory()
        windows = windows.to(device, non_blocking=True)
        return windows[:, :-1], windows[:, 1:]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def train_step():
        x, y = batch()
        with torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None):
            logits = forward(x)
            loss = F.cross_entropy(logits.view(-1, vocab_size), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    step_seconds = []
    loss = None
    model.train()
    for step in range(total):
        sync()
        start = time.perf_counter()
        loss = train_step()
        sync()
        if step >= args.warmup:
            step_seconds.append(time.perf_counter() - start)
    profile = time_by_op_kind(train_step, args.profile_steps, sync) if args.profile_steps > 0 else None

    seconds = statistics.median(step_seconds)
    print(json.dumps({
        "impl": "pytorch-python", "model_size": args.model_size, "precision": args.precision,
        "device": str(device), "params": n_params, "batch_size": args.batch_size, "block_size": block,
        "steps": args.steps, "median_step_s": seconds, "tokens_per_second": args.batch_size * block / seconds,
        "last_loss": loss.item(), "gradient_checkpointing": args.gradient_checkpointing,
        "torch": torch.__version__, "optimizer": args.optimizer, "threads": torch.get_num_threads(),
        "compiled": args.compile,
        **({"profile": profile} if profile else {}),
    }))


if __name__ == "__main__":
    sys.exit(main())
