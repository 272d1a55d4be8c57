#!/usr/bin/env python3
"""The GPU benchmarks of scripts/gpu-check, measured side by side in one run.

    python3 bench/gpu_suite.py --build build-gpu --out OUT_DIR [--dry-run] [--quick]

1. The machine's limits (build/bench/gpu_bench): the bf16 GEMM peak through cuBLAS, the FP8 GEMM
   through at::_scaled_mm (SM 8.9+), fp32 GEMM with tf32 off and on, FusedAdamW's step against a
   device-to-device copy.
2. examples/char_gpt at GPT-2-small size (12 x 768, block 1024) in fp32, tf32, bf16 AMP, fp16 AMP,
   bf16 weights + fp32 masters and bf16 + FP8 (delayed and current scaling): tokens/s, and model
   FLOPs utilisation against (1).
3. The same model and step in PyTorch from Python (bench/python/char_gpt.py, torch.amp) in bf16.
4. Eager against CUDA-graph steps (--cuda_graph) on the tiny char_gpt, where launches dominate;
   the Python loop on the same tiny model beside them.
5. (3) again with the model under torch.compile, the warm-up steps holding the compilation.
6. The Llama side by side at Llama 3.2 1B's shape (bench/llama_anchor --device cuda --sizes 1b):
   examples/llama's train_llama against HF Trainer on transformers' LlamaForCausalLM, bf16,
   tokens/s and MFU; skipped, with the reason in the report, where python3 has no transformers.

Writes OUT_DIR/gpu-benchmarks.json (every figure, every command) and prints a table with the
issue's targets. Each char_gpt figure is the median tokens/s of the Trainer's log windows after
the first (which holds the warm-up); the Python figure is the median step time after warm-up.
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYSTEM_CORPUS = "/usr/share/doc/jargon-text/jargon.txt.gz"
PACKED_CORPUS = os.path.join(ROOT, "third_party/gpu-deps/corpus/jargon.txt.gz")
GPT2_SMALL = dict(n_layer=12, n_embd=768, block_size=1024)

# mode -> char_gpt flags (TrainingArguments' precision flags)
MODES = {
    "fp32": ["--tf32", "false"],
    "tf32": ["--tf32", "true"],
    "bf16": ["--bf16"],
    "fp16": ["--fp16"],
    "bf16_masters": ["--bf16", "--master_weights", "on"],
    # FP8 GEMMs in the inner linear layers (SM 8.9+), both recipes.
    "fp8_delayed": ["--bf16", "--fp8", "--fp8_recipe", "delayed"],
    "fp8_current": ["--bf16", "--fp8", "--fp8_recipe", "current"],
}


def run(cmd, dry_run, log_path=None):
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    if dry_run:
        return 0, ""
    started = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log_path:
        with open(log_path, "w") as f:
            f.write(proc.stdout)
    tail = "\n".join(proc.stdout.strip().splitlines()[-3:])
    print(f"  ({time.time() - started:.0f} s, rc {proc.returncode}) {tail}", flush=True)
    return proc.returncode, proc.stdout


def last_json_line(text):
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def window_tokens_per_second(output_dir):
    """Median tokens/s of the Trainer's log windows, the first (warm-up) left out."""
    path = os.path.join(output_dir, "trainer_log.jsonl")
    rates = []
    with open(path) as f:
        for line in f:
            entry = json.loads(line)
            if "tokens_per_second" in entry:
                rates.append(entry["tokens_per_second"])
    if len(rates) > 1:
        rates = rates[1:]
    return statistics.median(rates) if rates else None


def params_from_output(text):
    # "char_gpt: model 12 layers, 12 heads, 768 wide, block 1024: 85.26M parameters"
    for line in text.splitlines():
        if "M parameters" in line:
            return float(line.rsplit(":", 1)[1].split("M")[0]) * 1e6
    return None


def flops_per_token(n_params, n_layer, n_embd, block_size):
    # PaLM's count: 6N for the matmuls of forward + backward, 12 L d T for attention scores.
    return 6 * n_params + 12 * n_layer * n_embd * block_size


def char_gpt(args, name, size_flags, mode_flags, steps, logging_steps, batch, extra=()):
    output_dir = os.path.join(args.out, "char_gpt-" + name)
    cmd = [os.path.join(args.build, "examples/char_gpt"), *size_flags, *mode_flags,
           "--per_device_train_batch_size", str(batch), "--max_steps", str(steps),
           "--logging_steps", str(logging_steps), "--learning_rate", "3e-4",
           "--optim", "adamw_torch_fused", "--save_strategy", "no", "--eval_strategy", "no",
           "--dataloader_drop_last", "--disable_tqdm", "--sample_chars", "0",
           "--corpus", args.corpus, "--output_dir", output_dir, "--overwrite_output_dir", *extra]
    rc, text = run(cmd, args.dry_run, os.path.join(args.out, f"char_gpt-{name}.txt"))
    result = {"name": name, "command": " ".join(cmd), "rc": rc}
    if rc == 0 and not args.dry_run:
        result["tokens_per_second"] = window_tokens_per_second(output_dir)
        result["params"] = params_from_output(text)
        result["graph_captured"] = "cuda_graph: step" in text and "captured" in text
    return result


def python_char_gpt(args, name, model_size, precision, steps, warmup, batch, extra=()):
    cmd = [args.python, os.path.join(ROOT, "bench/python/char_gpt.py"), "--model_size", model_size,
           "--precision", precision, "--steps", str(steps), "--warmup", str(warmup),
           "--batch_size", str(batch), "--corpus", args.corpus, *extra]
    rc, text = run(cmd, args.dry_run, os.path.join(args.out, f"python-{name}.txt"))
    result = {"name": name, "command": " ".join(cmd), "rc": rc}
    if rc == 0 and not args.dry_run:
        result.update(last_json_line(text) or {})
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--corpus", default=None)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--quick", action="store_true", help="fewer steps (a smoke run of the suite)")
    args = parser.parse_args()
    args.build = os.path.abspath(args.build)
    os.makedirs(args.out, exist_ok=True)
    if args.corpus is None:
        args.corpus = SYSTEM_CORPUS if os.path.exists(SYSTEM_CORPUS) else PACKED_CORPUS
    big_steps, tiny_steps = (12, 60) if args.quick else (40, 300)
    report = {"corpus": args.corpus}
    report_path = os.path.join(args.out, "gpu-benchmarks.json")

    def save():
        # Written after each measurement: a run killed at its time limit keeps what it measured.
        if not args.dry_run:
            with open(report_path, "w") as f:
                json.dump(report, f, indent=2)

    # 1. Limits.
    rc, text = run([os.path.join(args.build, "bench/gpu_bench"), "--repeats", "5" if args.quick else "20"],
                   args.dry_run, os.path.join(args.out, "gpu_bench.txt"))
    report["limits"] = last_json_line(text) if rc == 0 and not args.dry_run else {"rc": rc}
    save()

    # 2. GPT-2-small in each precision mode, and 3. the Python loop beside bf16.
    size = ["--model_size", "gpt2-small"]
    report["gpt2_small"] = {}
    for mode, flags in MODES.items():
        report["gpt2_small"][mode] = char_gpt(args, f"gpt2-small-{mode}", size, flags, big_steps, big_steps // 4, 16)
        save()
        if mode == "bf16":
            report["gpt2_small"]["python_bf16"] = python_char_gpt(args, "gpt2-small-bf16", "gpt2-small", "bf16",
                                                                  big_steps - 10, 10, 16)
            save()

    # 4. Eager against graphs, interleaved twice, on the tiny model; Python beside them.
    tiny = ["--model_size", "tiny"]
    report["tiny"] = {"eager": [], "graph": []}
    for repeat in range(2):
        for kind, extra in (("eager", []), ("graph", ["--cuda_graph"])):
            report["tiny"][kind].append(char_gpt(args, f"tiny-bf16-{kind}-{repeat}", tiny, ["--bf16"], tiny_steps,
                                                 tiny_steps // 6, 16, extra))
            save()
    report["tiny"]["python_bf16"] = python_char_gpt(args, "tiny-bf16", "tiny", "bf16", tiny_steps // 2, 20, 16)
    save()

    # 5. The same GPT-2-small bf16 step in Python under torch.compile: last, since compiling
    # takes the longest and a run cut at its time limit keeps everything before it.
    report["gpt2_small"]["python_bf16_compiled"] = python_char_gpt(
        args, "gpt2-small-bf16-compiled", "gpt2-small", "bf16", big_steps - 10, 10, 16, ["--compile"])

    save()

    # 6. The Llama comparison at ~1B (last but one would starve the compile run; it needs
    # transformers in python3, which the GPU machine may lack).
    has_transformers = subprocess.run([args.python, "-c", "import transformers"],
                                      capture_output=True).returncode == 0
    if not has_transformers and not args.dry_run:
        report["llama_1b"] = {"skipped": f"{args.python} cannot import transformers"}
    else:
        llama_json = os.path.join(args.out, "llama_1b.json")
        steps = ["--steps", "6", "--warmup", "2"] if args.quick else ["--steps", "20", "--warmup", "5"]
        rc, text = run([args.python, os.path.join(ROOT, "bench/llama_anchor"), "--device", "cuda",
                        "--sizes", "1b", "--precisions", "bf16", "--repeats", "1", "--batch_size", "4",
                        *steps, "--build_dir", args.build, "--python", args.python,
                        "--corpus", args.corpus, "--output", llama_json],
                       args.dry_run, os.path.join(args.out, "llama_1b.txt"))
        report["llama_1b"] = last_json_line(text) if rc == 0 and not args.dry_run else {"rc": rc}

    if args.dry_run:
        return 0
    summarize(report)
    save()
    return 0


def summarize(report):
    """Ratios against the issue's targets; appended to the report as report["summary"]."""
    limits = report.get("limits") or {}
    peak_tflops = (limits.get("gemm") or {}).get("bf16_tflops")
    runs = report["gpt2_small"]
    tps = {mode: r.get("tokens_per_second") for mode, r in runs.items()}
    summary = {}

    def ratio(a, b):
        return a / b if a and b else None

    summary["bf16_vs_fp32"] = ratio(tps.get("bf16"), tps.get("fp32"))
    summary["tf32_vs_fp32"] = ratio(tps.get("tf32"), tps.get("fp32"))
    summary["fp16_vs_fp32"] = ratio(tps.get("fp16"), tps.get("fp32"))
    summary["bf16_masters_vs_bf16"] = ratio(tps.get("bf16_masters"), tps.get("bf16"))
    summary["fp8_delayed_vs_bf16"] = ratio(tps.get("fp8_delayed"), tps.get("bf16"))
    summary["fp8_current_vs_bf16"] = ratio(tps.get("fp8_current"), tps.get("bf16"))
    summary["fp8_gemm_speedup"] = (limits.get("gemm") or {}).get("fp8_speedup_over_bf16")
    summary["mantissa_vs_python_bf16"] = ratio(tps.get("bf16"), tps.get("python_bf16"))
    summary["mantissa_vs_python_compiled_bf16"] = ratio(tps.get("bf16"), tps.get("python_bf16_compiled"))
    n_params = runs.get("bf16", {}).get("params")
    if n_params and peak_tflops:
        fpt = flops_per_token(n_params, **GPT2_SMALL)
        for mode in ("bf16", "fp16", "bf16_masters"):
            if tps.get(mode):
                summary[f"mfu_{mode}"] = tps[mode] * fpt / (peak_tflops * 1e12)
    tiny = report["tiny"]
    med = lambda runs_: statistics.median([r["tokens_per_second"] for r in runs_ if r.get("tokens_per_second")] or [0])
    summary["graph_vs_eager_tiny"] = ratio(med(tiny["graph"]), med(tiny["eager"]))
    summary["graph_vs_python_tiny"] = ratio(med(tiny["graph"]), tiny["python_bf16"].get("tokens_per_second"))
    summary["eager_vs_python_tiny"] = ratio(med(tiny["eager"]), tiny["python_bf16"].get("tokens_per_second"))
    summary["graph_captured"] = all(r.get("graph_captured") for r in tiny["graph"])
    adamw = limits.get("adamw") or {}
    summary["fused_adamw_fraction_of_copy"] = adamw.get("fp32_fraction_of_copy")
    summary["tf32_gemm_speedup"] = (limits.get("gemm") or {}).get("tf32_speedup")
    report["summary"] = summary

    targets = [("bf16 AMP / fp32 tokens/s", summary["bf16_vs_fp32"], 2.5),
               ("MFU bf16 (of the measured GEMM peak)", summary.get("mfu_bf16"), 0.40),
               ("fused AdamW step / copy bandwidth", summary["fused_adamw_fraction_of_copy"], 0.80),
               ("CUDA graph / eager, tiny model", summary["graph_vs_eager_tiny"], 1.3),
               ("mantissa / PyTorch-in-Python, bf16", summary["mantissa_vs_python_bf16"], 1.0),
               ("mantissa / torch.compile in Python, bf16", summary["mantissa_vs_python_compiled_bf16"], 1.0),
               ("tf32 / fp32 GEMM time", summary["tf32_gemm_speedup"], 1.5),
               ("fp8 / bf16 GEMM time (_scaled_mm)", summary["fp8_gemm_speedup"], 1.5),
               ("fp8 delayed / bf16 tokens/s, gpt2-small", summary["fp8_delayed_vs_bf16"], 1.0)]
    print("\nGPU benchmarks (targets from issue 7)")
    for label, value, target in targets:
        shown = "n/a" if value is None else f"{value:.3f}"
        verdict = "" if value is None else ("met" if value >= target else "MISSED")
        print(f"  {label:42s} {shown:>8}  target >= {target}  {verdict}")
    print("  tokens/s: " + ", ".join(f"{m} {v:.0f}" for m, v in tps.items() if v))


if __name__ == "__main__":
    sys.exit(main())
