#!/usr/bin/env python3
"""ctest bench.anchors_smoke: bench/anchors end to end with tiny settings, so that the driver,
trainer_bench and the Python anchors cannot drift apart unnoticed. It checks that the final
JSON line is produced and parses, and that every run it asked for is in it with a plausible
loss. No timing is checked: speed is what bench/anchors reports, not what a test asserts.

    bench/anchors_smoke_test.py --build_dir build --python .venv/bin/python"""

import math
import os
import sys

import smoke_util

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    args = smoke_util.parse_args(__doc__.splitlines()[0])
    cmd = [sys.executable, os.path.join(HERE, "anchors"), "--repeats", "1", "--steps", "3", "--warmup", "2",
           "--models", "mlp", "--precisions", "fp32,bf16_masters", "--threads", "1",
           "--build_dir", args.build_dir, "--python", args.python]
    result = smoke_util.run_driver(cmd, "bench/anchors")

    assert result["bench"] == "trainer_anchors", result["bench"]
    expected = ["mlp/fp32/trainer", "mlp/fp32/hand", "mlp/fp32/python", "mlp/fp32/hf",
                "mlp/bf16_masters/trainer", "mlp/bf16_masters/hand", "mlp/bf16_masters/python"]
    assert sorted(result["medians"]) == sorted(expected), sorted(result["medians"])
    for key, row in result["medians"].items():
        assert row["steps"] == 3 and row["warmup"] == 2 and row["threads"] == 1, (key, row)
        assert row["steps_per_second"] > 0 and row["median_step_ms"] > 0 and row["peak_rss_mib"] > 0, (key, row)
        # Cross-entropy over 10 classes starts near ln(10) = 2.3 and cannot fall far in 5 steps.
        assert math.isfinite(row["mean_loss"]) and 1.0 < row["mean_loss"] < 3.0, (key, row)
    for ratio in ["trainer_over_hand_time/mlp/fp32", "trainer_over_python_speed/mlp/bf16_masters",
                  "trainer_over_hf_speed/mlp/fp32", "masters_over_bf16_speed/mlp/trainer"]:
        if ratio.startswith("masters_over"):
            assert ratio not in result["ratios"], f"{ratio}: bf16 was not run, yet there is a ratio"
        else:
            assert result["ratios"][ratio] > 0, ratio
    assert {t["target"] for t in result["targets"]} and all(isinstance(t["met"], bool) for t in result["targets"])
    print("anchors smoke: the JSON line parses and holds every run")


if __name__ == "__main__":
    main()
