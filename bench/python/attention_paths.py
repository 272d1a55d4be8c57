#!/usr/bin/env python3
"""PyTorch's three ways to run causal attention on the CPU, forward + backward, side by side.

flash: F.scaled_dot_product_attention with SDPBackend.FLASH_ATTENTION (ATen's fused CPU kernel)
math:  the same with SDPBackend.MATH (batched matmuls and softmax, upcast to float32 inside)
eager: Hugging Face's eager attention (matmul in the autocast dtype, float32 softmax)

Under bf16 autocast, q/k/v cut from one packed [B, T, 3, H, D] tensor as in examples/char_gpt,
the same tokens per batch (B * T = 2048) at every length. Prints milliseconds (best of two
medians over 7 calls after 3) and flash / eager. BENCHMARKS.md quotes it (issue 25).

    OMP_NUM_THREADS=1 .venv/bin/python bench/python/attention_paths.py --threads 1
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def eager(q, k, v):
    t, d = q.shape[-2], q.shape[-1]
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v)


def time_ms(batch, heads, length, head_dim, kind):
    packed = torch.randn(batch, length, 3 * heads * head_dim, requires_grad=True)
    times = []
    for _ in range(10):
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            q, k, v = packed.to(torch.bfloat16).view(batch, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
            if kind == "eager":
                out = eager(q, k, v)
            else:
                backend = SDPBackend.FLASH_ATTENTION if kind == "flash" else SDPBackend.MATH
                with sdpa_kernel([backend]):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.float().sum().backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times[3:]) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for head_dim, heads in [(32, 4), (64, 6), (64, 12)]:
        for length in [64, 128, 256, 512, 1024]:
            batch = max(1, 2048 // length)
            ms = {kind: min(time_ms(batch, heads, length, head_dim, kind) for _ in range(2))
                  for kind in ("flash", "math", "eager")}
            print(f"D={head_dim} H={heads} T={length} B={batch}: "
                  + " ".join(f"{k} {v:.1f}" for k, v in ms.items())
                  + f"  flash/eager {ms['flash'] / ms['eager']:.2f}", flush=True)


if __name__ == "__main__":
    main()
