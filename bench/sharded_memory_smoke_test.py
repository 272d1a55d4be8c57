#!/usr/bin/env python3
"""ctest bench.sharded_memory_smoke: bench/sharded_memory end to end in fp32 with 1 repeat of 3
steps, so that the driver, trainer_bench's --every_rank and --fsdp, and torch_ddp.py's
strategies cannot drift apart unnoticed. No timing or resident memory is checked (those are
what the benchmark reports); the optimizer-state bytes are counts of tensors, so they are: a
sharded rank holds half of what a data-parallel rank holds, up to the padding and the step
counters, on both sides.

check_wide_blocks runs the driver's --model wide_blocks variants the same way (a small 512-wide,
4-block model), full sharding included; check_checkpoints runs bench/sharded_checkpoint on that
model (both state dict types, both sharding modes, one save each).

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


def check_checkpoints(args):
    """bench/sharded_checkpoint --quick on the 512-wide, 4-block model: every variant saved once,
    and the shard files of SHARDED_STATE_DICT hold the same bytes as FULL_STATE_DICT's whole
    files, up to the safetensors headers (within 5%)."""
    torchrun = os.path.join(os.path.dirname(args.python), "torchrun")
    result = smoke_util.run_driver(
        [args.python, os.path.join(HERE, "sharded_checkpoint"), "--quick", "--precisions", "fp32",
         "--width", "512", "--num_blocks", "4", "--build_dir", args.build_dir, "--torchrun", torchrun],
        "bench/sharded_checkpoint")
    assert result["bench"] == "sharded_checkpoint", result["bench"]
    rows = {(r["strategy"], r["state_dict_type"]): r for r in result["rows"]}
    assert sorted(rows) == sorted((s, t) for s in ("full_shard", "shard_grad_op")
                                  for t in ("FULL_STATE_DICT", "SHARDED_STATE_DICT")), sorted(rows)
    for key, row in rows.items():
        assert row["save_ms"] > 0 and row["checkpoint_mib"] > 0, (key, row)
    for strategy in ("full_shard", "shard_grad_op"):
        whole = rows[(strategy, "FULL_STATE_DICT")]["checkpoint_mib"]
        shards = rows[(strategy, "SHARDED_STATE_DICT")]["checkpoint_mib"]
        assert abs(shards - whole) < 0.05 * whole, (strategy, whole, shards)
    print("sharded_checkpoint smoke: both state dict types saved the same state in both modes")


def main():
    args = smoke_util.parse_args(__doc__.splitlines()[0])
    check_wide_mlp(args)
    check_wide_blocks(args)
    check_checkpoints(args)


if __name__ == "__main__":
    main()
