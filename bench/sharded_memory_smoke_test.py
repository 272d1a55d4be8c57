#!/usr/bin/env python3
"""ctest bench.sharded_memory_smoke: bench/sharded_memory end to end in fp32 with 1 repeat of 3
steps, so that the driver, trainer_bench's --every_rank and --fsdp, and torch_ddp.py's
strategies cannot drift apart unnoticed. No timing or resident memory is checked (those are
what the benchmark reports); the optimizer-state bytes are counts of tensors, so they are: a
sharded rank holds half of what a data-parallel rank holds, up to the padding and the step
counters, on both sides.

check_wide_blocks runs the driver's --model wide_blocks variants the same way (a small 512-wide,
4-block model), full sharding included.

    bench/sharded_memory_smoke_test.py --build_dir build --python .venv/bin/python"""

import math
import os

import smoke_util

HERE = os.path.dirname(os.path.abspath(__file__))


def driver_command(args, *extra):
    torchrun = os.path.join(os.path.dirname(args.python), "torchrun")
    return [args.python, os.path.join(HERE, "sharded_memory"), "--quick", "--precisions", "fp32",
            "--build_dir", args.build_dir, "--torchrun", torchrun, *extra]


def checked_rows(result, expected, halved):
    """The driver's rows by (impl, strategy), after checking that exactly `expected` ran, each
    with a time, a peak and a loss in reason, that both DDPs hold the same state, and that each
    variant in `halved` holds half of it (up to padding and step counters)."""
    assert result["bench"] == "sharded_memory", result["bench"]
    rows = {(r["impl"], r["strategy"]): r for r in result["rows"]}
    assert sorted(rows) == sorted(expected), sorted(rows)
    for key, row in rows.items():
        assert row["steps_per_second"] > 0 and row["peak_rss_mib"] > 0, (key, row)
        assert math.isfinite(row["mean_loss"]) and 1.0 < row["mean_loss"] < 3.0, (key, row)
    ddp = rows[("mantissa", "ddp")]["state_mib_per_rank"]
    assert abs(ddp - rows[("torch", "ddp")]["state_mib_per_rank"]) < 0.01 * ddp, rows
    for key in halved:
        half = rows[key]["state_mib_per_rank"] / ddp
        assert 0.49 < half < 0.52, (key, half)
    return rows


def check_wide_mlp(args):
    """The default model, FashionWideMlp (~20.0M parameters: AdamW's two fp32 moments are ~153
    MiB whole, ~76 MiB a shard), and its five variants."""
    result = smoke_util.run_driver(driver_command(args), "bench/sharded_memory")
    rows = checked_rows(result,
                        [("mantissa", "ddp"), ("mantissa", "shard_grad_op"), ("torch", "ddp"),
                         ("torch", "fully_shard"), ("torch", "zero")],
                        [("mantissa", "shard_grad_op"), ("torch", "fully_shard")])
    # ZeroRedundancyOptimizer hands out whole parameters, so the larger rank holds more than half.
    ddp = rows[("mantissa", "ddp")]["state_mib_per_rank"]
    assert 0.49 < rows[("torch", "zero")]["state_mib_per_rank"] / ddp < 1.0, rows[("torch", "zero")]
    print("sharded_memory smoke: every variant ran; sharded ranks hold half the optimizer state")


def check_wide_blocks(args):
    """--model wide_blocks at width 512 with 4 blocks (1,457,674 parameters: ~11.1 MiB of fp32
    moments whole, ~5.6 MiB a shard): its six variants ran, and every sharded one, whether it
    shards the state only (shard_grad_op, fully_shard) or the weights too (full_shard,
    fully_shard_blocks), holds half of DDP's optimizer state."""
    result = smoke_util.run_driver(
        driver_command(args, "--model", "wide_blocks", "--width", "512", "--num_blocks", "4"),
        "bench/sharded_memory --model wide_blocks")
    settings = result["settings"]
    assert (settings["model"], settings["width"], settings["num_blocks"]) == ("wide_blocks", 512, 4), settings
    checked_rows(result,
                 [("mantissa", "ddp"), ("mantissa", "shard_grad_op"), ("mantissa", "full_shard"),
                  ("torch", "ddp"), ("torch", "fully_shard"), ("torch", "fully_shard_blocks")],
                 [("mantissa", "shard_grad_op"), ("mantissa", "full_shard"), ("torch", "fully_shard"),
                  ("torch", "fully_shard_blocks")])
    print("sharded_memory smoke, wide_blocks: every variant ran; sharded ranks hold half the optimizer state")


def main():
    args = smoke_util.parse_args(__doc__.splitlines()[0])
    check_wide_mlp(args)
    check_wide_blocks(args)


if __name__ == "__main__":
    main()
