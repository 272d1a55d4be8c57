"""train_llama on token files from prepare_tokens.py (ctest examples.llama_token_files).

    python test_token_files.py PATH/TO/train_llama JARGON_FILE

No tokenizer is downloaded: a small byte-level BPE (the `tokenizers` package transformers
installs) is trained on the Jargon File's first 100 kB and saved as a tokenizer folder.
prepare_tokens.py then writes the training text (the next 200 kB) and the validation text (the
20 kB after) as token files; the ids it wrote read back equal to the tokenizer's. A tiny
LlamaForCausalLM (tied, llama3 rope) saved by save_pretrained in bfloat16 shards is evaluated by
train_llama --do_eval (the same eval loss as transformers', 1e-5), then fine-tuned with
--model_name_or_path on --train_file / --validation_file; AutoModelForCausalLM.from_pretrained
of the output gives its eval loss on the validation ids.
"""

import gzip
import json
import os
import subprocess
import sys
import tempfile

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_output_dir  # noqa: E402
import prepare_tokens  # noqa: E402

VOCAB = 320
BLOCK = 32


def main():
    train_llama, jargon = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    with gzip.open(jargon, "rt", encoding="utf-8") as f:
        text = f.read(340_000)
    with tempfile.TemporaryDirectory() as tmp:
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        bpe.train_from_iterator([text[:100_000]], trainers.BpeTrainer(vocab_size=VOCAB, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe)
        tokenizer_dir = os.path.join(tmp, "tokenizer")
        tokenizer.save_pretrained(tokenizer_dir)

        files = {}
        for name, part in (("train", text[100_000:300_000]), ("validation", text[300_000:320_000])):
            with open(os.path.join(tmp, name + ".txt"), "w", encoding="utf-8") as f:
                f.write(part)
            files[name] = os.path.join(tmp, name + ".tok")
            prepare_tokens.main(["--tokenizer", tokenizer_dir, "--output", files[name],
                                 os.path.join(tmp, name + ".txt")])
        ids, vocab = prepare_tokens.read_token_file(files["validation"])
        expected = [i for line in text[300_000:320_000].splitlines(keepends=True)
                    for i in tokenizer(line, add_special_tokens=False)["input_ids"]]
        assert vocab == len(tokenizer) and ids.tolist() == expected, "token file round trip"

        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_config.json")) as f:
            config = json.load(f)
        config["vocab_size"] = len(tokenizer)
        config["tie_word_embeddings"] = True
        config["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 16}
        # A model as a Python user has it: saved by save_pretrained in bfloat16, in shards.
        torch.manual_seed(0)
        hf_model = LlamaForCausalLM(LlamaConfig(**config)).to(torch.bfloat16)
        hf_dir = os.path.join(tmp, "hf")
        hf_model.save_pretrained(hf_dir, max_shard_size="100KB")
        assert os.path.exists(os.path.join(hf_dir, "model.safetensors.index.json"))

        # Evaluation only: train_llama's eval loss of that folder (read into float32) is
        # transformers' on the same blocks.
        eval_out = os.path.join(tmp, "eval_only")
        run = subprocess.run(
            [train_llama, "--model_name_or_path", hf_dir, "--validation_file", files["validation"],
             "--block_size", str(BLOCK), "--do_eval", "--per_device_eval_batch_size", "32",
             "--max_eval_samples", "64", "--disable_tqdm", "--output_dir", eval_out],
            capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stdout[-1500:], run.stderr[-1500:], "\ntest_token_files: FAILED (eval only)")
            return 1
        with open(os.path.join(eval_out, "eval_results.json")) as f:
            cpp_eval = json.load(f)["eval_loss"]
        blocks = torch.from_numpy(ids[: 64 * BLOCK]).view(64, BLOCK)
        with torch.no_grad():
            reference = hf_model.float().eval()(input_ids=blocks, labels=blocks).loss.item()
        print(f"eval of the bf16 HF folder: train_llama {cpp_eval:.6f}, transformers {reference:.6f}, "
              f"|diff| {abs(cpp_eval - reference):.3e}")
        if abs(cpp_eval - reference) > 1e-5:
            print("test_token_files: FAILED (eval of the HF folder)")
            return 1

        # Fine-tuning it on the token files.
        out = os.path.join(tmp, "out")
        run = subprocess.run(
            [train_llama, "--model_name_or_path", hf_dir, "--train_file", files["train"],
             "--validation_file", files["validation"], "--block_size", str(BLOCK), "--do_train",
             "--do_eval", "--max_steps", "20", "--per_device_train_batch_size", "16",
             "--per_device_eval_batch_size", "32", "--max_eval_samples", "64", "--learning_rate", "3e-3",
             "--save_steps", "20", "--disable_tqdm", "--output_dir", out],
            capture_output=True, text=True)
        print(run.stdout[-1500:], run.stderr[-1500:])
        if run.returncode != 0:
            print("test_token_files: FAILED (train_llama)")
            return 1
        ok = check_output_dir.check(out, torch.from_numpy(ids), BLOCK, 64)
        print("test_token_files: PASSED" if ok else "test_token_files: FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
