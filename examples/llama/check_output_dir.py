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

import prepare_tokens


def read_ids(path):
    """A data file's ids as train_llama reads them: a token file's, or the bytes."""
    with open(path, "rb") as f:
        is_token_file = f.read(len(prepare_tokens.MAGIC)) == prepare_tokens.MAGIC
    if is_token_file:
        return torch.from_numpy(prepare_tokens.read_token_file(path)[0])
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return torch.tensor(list(f.read()), dtype=torch.long)


def check(output_dir, eval_ids, block_size, max_eval):
    """Runs the checks on `eval_ids`, the run's evaluation ids; True when they pass."""
    blocks = eval_ids[: eval_ids.numel() // block_size * block_size].view(-1, block_size)
    if max_eval > 0:
        blocks = blocks[:max_eval]

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
    # Under bf16 autocast the two models round to bf16 at slightly different points; in fp32
    # they agree to the last digits.
    bound = 1e-4 if bf16 else 1e-5
    print(f"from_pretrained({output_dir}): {type(model).__name__}, eval loss {loss:.6f}; "
          f"eval_results.json {results['eval_loss']:.6f}; |diff| {diff:.3e} (bound {bound:.0e})")
    ok = diff <= bound and results["eval_samples"] == blocks.shape[0]
    ok = ok and math.isclose(results["perplexity"], math.exp(results["eval_loss"]), rel_tol=1e-9)
    checkpoints = sorted(glob.glob(os.path.join(output_dir, "checkpoint-*")))
    for checkpoint in checkpoints:
        AutoModelForCausalLM.from_pretrained(checkpoint)
        print(f"from_pretrained({checkpoint}): loaded")
    return ok and bool(checkpoints)


def main():
    output_dir, train_file, block_size, max_eval = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    torch.set_num_threads(1)
    data = read_ids(train_file)
    ok = check(output_dir, data[: data.numel() * 5 // 100], block_size, max_eval)
    print("check_output_dir: PASSED" if ok else "check_output_dir: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
