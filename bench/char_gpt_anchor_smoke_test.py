#!/usr/bin/env python3
"""ctest bench.char_gpt_anchor_smoke: bench/char_gpt_anchor end to end on char_gpt tiny with two
timed steps, so that the driver, examples/char_gpt and bench/python/char_gpt.py cannot drift
apart unnoticed. It checks that the final JSON line parses and holds both implementations of
every precision asked for, with a GEMM peak beside them. No timing is checked: speed is what
the driver reports, not what a test asserts.

    bench/char_gpt_anchor_smoke_test.py --build_dir build --python .venv/bin/python"""

import os
import sys

import smoke_util

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    args = smoke_util.parse_args(__doc__.splitlines()[0])
    cmd = [sys.executable, os.path.join(HERE, "char_gpt_anchor"), "--sizes", "tiny", "--threads", "1",
           "--precisions", "fp32,bf16_masters", "--steps", "2", "--warmup", "1", "--repeats", "1",
           "--max_corpus_chars", "20000", "--gemm_n", "256",
           "--build_dir", args.build_dir, "--python", args.python]
    result = smoke_util.run_driver(cmd, "bench/char_gpt_anchor")

    assert result["bench"] == "char_gpt_anchor", result["bench"]
    rows = {(r["size"], r["threads"], r["precision"]): r for r in result["rows"]}
    assert sorted(rows) == [("tiny", 1, "bf16_masters"), ("tiny", 1, "fp32")], sorted(rows)
    for key, row in rows.items():
        for field in ("trainer", "pytorch", "trainer_over_pytorch", "mfu_trainer", "mfu_pytorch"):
            assert row[field] > 0, (key, field, row)
    peak = result["gemm_peak_gflops"]["1"]
    assert peak["fp32"] > 0 and peak["bf16"] > 0, peak
    print("char_gpt_anchor smoke: the JSON line parses and holds every run")


if __name__ == "__main__":
    main()
