"""Checks a train_llama output folder from Python (ctest examples.llama_from_pretrained).

    python check_output_dir.py OUTPUT_DIR TRAIN_FILE BLOCK_SIZE MAX_EVAL_SAMPLES

- `AutoModelForCausalLM.from_pretrained(OUTPUT_DIR)` loads the C++-trained weights (and each
  checkpoint-* folder the run saved loads the same way);
- the evaluation blocks (under bf16 autocast when training_args.json says --bf16) train_llama held out (the first 5% of TRAIN_FILE's bytes, cut into
  BLOCK_SIZE rows, the first MAX_EVAL_SAMPLES of them) give, in transformers, the eval_loss of
  eval_results.json within 1e-5, and perplexity = exp(eval_loss).

The evaluation batches of the run must all be full (MAX_EVAL_SAMPLES a multiple of
per_device_eval_batch_size), so the mean of the batch losses is the mean over all tokens.
"""

import glob
import gzip
import json
import math
import os
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    output_dir, train_file, block_size, max_eval = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    opener = gzip.open if train_file.endswith(".gz") else open
    with opener(train_file, "rb") as f:
        data = torch.tensor(list(f.read()), dtype=torch.long)
    held_out = data[: data.numel() * 5 // 100]
    blocks = held_out[: held_out.numel() // block_size * block_size].view(-1, block_size)[:max_eval]

    with open(os.path.join(output_dir, "eval_results.json")) as f:
        results = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(output_dir, dtype=torch.float32)
    model.eval()
    # The run evaluated under its precision settings; so does this (HF's Trainer does too).
    with open(os.path.join(output_dir, "training_args.json")) as f:
        bf16 = json.load(f).get("bf16", False)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(input_ids=blocks, labels=blocks).loss.item()
    diff = abs(loss - results["eval_loss"])
    print(f"from_pretrained({output_dir}): {type(model).__name__}, eval loss {loss:.6f}; "
          f"eval_results.json {results['eval_loss']:.6f}; |diff| {diff:.3e}")
    ok = diff <= 1e-5 and results["eval_samples"] == blocks.shape[0]
    ok = ok and math.isclose(results["perplexity"], math.exp(results["eval_loss"]), rel_tol=1e-9)
    checkpoints = sorted(glob.glob(os.path.join(output_dir, "checkpoint-*")))
    for checkpoint in checkpoints:
        AutoModelForCausalLM.from_pretrained(checkpoint)
        print(f"from_pretrained({checkpoint}): loaded")
    print("check_output_dir: PASSED" if ok and checkpoints else "check_output_dir: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
