#!/usr/bin/env python3
"""Writes the seed corpus of the text and safetensors fuzz targets into fuzz/corpus/.

Usage: fuzz/make_corpus.py [python-with-safetensors]
The checkpoint target's seeds come from the target itself (MANTISSA_FUZZ_WRITE_SEEDS, see
fuzz/checkpoint_fuzz.cpp); this script leaves fuzz/corpus/checkpoint alone. Seeds are small:
valid files and near misses (one field wrong, cut short, padded), so the fuzzer starts next to
every branch of the readers.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def safetensors_file(header, data=b""):
    if not isinstance(header, bytes):
        header = (header if isinstance(header, str) else json.dumps(header, separators=(",", ":"))).encode()
    return struct.pack("<Q", len(header)) + header + data


def safetensors_seeds():
    t = "safetensors"
    f32 = lambda shape, a, b: {"dtype": "F32", "shape": shape, "data_offsets": [a, b]}
    # The names the harness's module has: fc.weight [2,3], fc.bias [2], scale [2].
    module = {"__metadata__": {"format": "pt"}, "fc.weight": f32([2, 3], 0, 24),
              "fc.bias": f32([2], 24, 32), "scale": f32([2], 32, 40)}
    put(t, "module", safetensors_file(module, bytes(range(40))))
    put(t, "module-bf16", safetensors_file(
        {"fc.weight": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
         "fc.bias": {"dtype": "BF16", "shape": [2], "data_offsets": [12, 16]}}, bytes(16)))
    put(t, "empty", safetensors_file("{}"))
    put(t, "space-padded", safetensors_file('{"w":' + json.dumps(f32([1], 0, 4)) + "}   ", bytes(4)))
    put(t, "nul-padded", safetensors_file('{"w":' + json.dumps(f32([1], 0, 4)) + "}\0\0\0", bytes(4)))
    put(t, "metadata-null", safetensors_file('{"__metadata__":null}'))
    sizes = [("F64", 8), ("F32", 4), ("F16", 2), ("BF16", 2), ("I64", 8), ("I32", 4), ("I16", 2),
             ("I8", 1), ("U8", 1), ("BOOL", 1), ("U64", 8), ("U32", 4), ("U16", 2), ("F8_E4M3", 1),
             ("F8_E5M2", 1), ("F8_E4M3FNUZ", 1), ("F8_E5M2FNUZ", 1), ("F8_E8M0", 1), ("C64", 8)]
    header, offset = {}, 0
    for code, size in sizes:
        header[code.lower()] = {"dtype": code, "shape": [2], "data_offsets": [offset, offset + 2 * size]}
        offset += 2 * size
    put(t, "every-dtype", safetensors_file(header, bytes([1]) * offset))
    put(t, "scalar-and-empty", safetensors_file(
        {"s": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]},
         "e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [8, 8]}}, bytes(8)))
    put(t, "overlap", safetensors_file({"a": f32([2], 0, 8), "b": f32([2], 4, 12)}, bytes(12)))
    put(t, "gap", safetensors_file({"a": f32([1], 0, 4), "b": f32([1], 8, 12)}, bytes(12)))
    put(t, "truncated", safetensors_file({"a": f32([4], 0, 16)}, bytes(10)))
    put(t, "huge-shape", safetensors_file({"a": f32([4611686018427387904, 8], 0, 16)}, bytes(16)))
    put(t, "duplicate-dtype", safetensors_file(
        '{"w":{"dtype":"F16","dtype":"F32","shape":[1],"data_offsets":[0,4]}}', bytes(4)))
    put(t, "nested", safetensors_file('{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":'
                                      + "[" * 60 + "]" * 60 + "}}", bytes(4)))
    put(t, "length-too-big", b"\xff" * 8 + b"{}")
    put(t, "short", b"\x02\x00\x00")
    python = sys.argv[1] if len(sys.argv) > 1 else None
    if python:  # one file exactly as Python's writer makes it
        import subprocess
        out = os.path.join(CORPUS, t, "python-written")
        subprocess.check_call([python, "-c", (
            "import sys, torch\n"
            "from safetensors.torch import save_file\n"
            "save_file({'fc.weight': torch.arange(6.).reshape(2, 3), 'fc.bias': torch.ones(2),"
            " 'scale': torch.full((2,), 2.0)}, sys.argv[1], metadata={'format': 'pt'})\n"), out])


def training_args_seeds():
    t = "training_args_json"
    put(t, "some-fields", json.dumps({"output_dir": "out", "learning_rate": 3e-4, "bf16": True,
                                      "per_device_train_batch_size": 8, "lr_scheduler_type": "cosine",
                                      "tf32": None, "eval_steps": 0.25, "resume_from_checkpoint": "latest"}))
    put(t, "empty-object", "{}")
    put(t, "wrong-types", '{"bf16": 1, "seed": "1", "learning_rate": null, "max_steps": 1.5}')
    put(t, "invalid-values", '{"per_device_train_batch_size": 0, "fp16": true, "bf16": true, "learning_rate": -1}')
    put(t, "unknown-key", '{"lerning_rate": 0.1}')
    put(t, "not-an-object", "[1, 2, 3]")
    put(t, "cut-short", '{"seed": 4')
    put(t, "big-integer", '{"max_steps": 18446744073709551615, "seed": -9223372036854775808}')
    put(t, "nul-padded", '{"seed": 1}\0\0')
    put(t, "nested", '{"seed": ' + "[" * 50 + "]" * 50 + "}")
    put(t, "unicode", '{"output_dir": "r\\u00e9sum\\u00e9/\\ud83d\\ude00", "run_name": "\\u0000"}')


def trainer_state_seeds():
    t = "trainer_state"
    state = {"best_metric": 0.25, "best_model_checkpoint": "out/checkpoint-10", "epoch": 1.5,
             "eval_steps": 500, "global_step": 12, "is_hyper_param_search": False,
             "is_local_process_zero": True, "is_world_process_zero": True,
             "log_history": [{"loss": 0.5, "step": 5}, {"eval_loss": "NaN", "step": 10},
                             {"grad_norm": "Infinity", "step": 11}],
             "logging_steps": 5, "max_steps": 100, "num_input_tokens_seen": 0, "num_train_epochs": 3,
             "save_steps": 10, "stateful_callbacks": {}, "total_flos": 0, "train_batch_size": 8,
             "trial_name": None, "trial_params": None,
             "mantissa": {"steps_in_epoch": 4, "skipped_steps": 1}}
    put(t, "full", json.dumps(state, indent=2))
    put(t, "minimal", '{"epoch": 0, "global_step": 0}')
    put(t, "missing-step", '{"epoch": 0}')
    put(t, "mistyped", '{"epoch": "one", "global_step": 1.5, "log_history": [{"loss": [1]}]}')
    put(t, "negative", '{"epoch": -1, "global_step": -5, "mantissa": {"skipped_steps": 9}}')
    put(t, "python-nan", '{"epoch": NaN, "global_step": 1, "log_history": [{"loss": Infinity}]}')
    put(t, "history-not-objects", '{"epoch": 0, "global_step": 0, "log_history": [1, "a", null]}')
    put(t, "mantissa-not-object", '{"epoch": 0, "global_step": 0, "mantissa": 3}')
    put(t, "nested", '{"epoch": 0, "global_step": 0, "best_metric": ' + "[" * 50 + "]" * 50 + "}")


def command_line_seeds():
    t = "command_line"
    lines = {
        "bf16-lr": ["--bf16", "--learning_rate", "3e-4", "--output_dir", "out"],
        "equals-form": ["--max_steps=20", "--per_device_train_batch_size=16", "--seed=-1"],
        "bool-spellings": ["--fp16", "yes", "--disable_tqdm", "False", "--use_cpu", "1"],
        "optional-none": ["--tf32", "None", "--eval_steps", "None", "--max_loss_scale", "None"],
        "choices": ["--lr_scheduler_type", "cosine", "--optim", "adamw_torch_fused", "--eval_strategy", "steps",
                    "--save_strategy", "epoch", "--master_weights", "auto"],
        "bad-choice": ["--lr_scheduler_type", "cosinus"],
        "bad-number": ["--learning_rate", "fast", "--max_steps", "1e99"],
        "unknown-flag": ["--lerning_rate", "1", "--bf16"],
        "dashed": ["--learning-rate", "0.1", "--output-dir", "x"],
        "repeated": ["--seed", "1", "--seed", "2", "--seed"],
        "positional": ["extra", "--bf16", "more"],
        "empty-words": ["", "--", "-", "--="],
        "json-file": ["args.json"],
        "resume": ["--resume_from_checkpoint", "latest", "--save_total_limit", "2"],
    }
    for name, words in lines.items():
        put(t, name, "\0".join(words))


if __name__ == "__main__":
    safetensors_seeds()
    training_args_seeds()
    trainer_state_seeds()
    command_line_seeds()
