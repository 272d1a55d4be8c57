"""Tokenizes text files into the token file train_llama reads (llm.c prepares its data the same way).

    python prepare_tokens.py --tokenizer meta-llama/Llama-3.2-1B --output train.tok train.txt [more.txt ...]

--tokenizer is anything `transformers.AutoTokenizer.from_pretrained` accepts: a Hub name or a
local folder (the model folder you fine-tune usually holds one). Each line of each file is
tokenized with its line break kept and without special tokens, as run_clm.py does with
--keep_linebreaks (its default), and the ids are written back to back.

The file: a 32-byte little-endian header, then the ids.

    bytes 0-7    b"MTSTOK01"
    bytes 8-11   uint32 bytes per id: 2 (uint16) when the vocabulary fits, else 4 (uint32)
    bytes 12-15  uint32 0 (reserved)
    bytes 16-23  uint64 number of ids
    bytes 24-31  uint64 vocabulary size (len(tokenizer)): train_llama refuses ids at or above it

`read_token_file(path)` reads one back (numpy array, vocabulary size).
"""

import argparse
import struct
import sys

import numpy as np

MAGIC = b"MTSTOK01"
HEADER = struct.Struct("<8sIIQQ")


def write_token_file(path, ids, vocab_size):
    """Writes `ids` (integers below `vocab_size`) as a token file."""
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32
    array = np.asarray(ids, dtype=np.int64)
    if array.size and (array.min() < 0 or array.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), found {array.min()}..{array.max()}")
    with open(path, "wb") as f:
        f.write(HEADER.pack(MAGIC, np.dtype(dtype).itemsize, 0, array.size, vocab_size))
        f.write(array.astype(dtype).astype(np.dtype(dtype).newbyteorder("<")).tobytes())


def read_token_file(path):
    """Returns (ids as an int64 numpy array, vocabulary size) of a token file."""
    with open(path, "rb") as f:
        magic, width, reserved, count, vocab_size = HEADER.unpack(f.read(HEADER.size))
        if magic != MAGIC or width not in (2, 4) or reserved != 0:
            raise ValueError(f"{path}: not a token file of this format")
        dtype = np.dtype("<u2" if width == 2 else "<u4")
        ids = np.frombuffer(f.read(), dtype=dtype)
    if ids.size != count:
        raise ValueError(f"{path}: the header promises {count} ids, the file holds {ids.size}")
    return ids.astype(np.int64), vocab_size


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True, help="AutoTokenizer name or folder")
    parser.add_argument("--output", required=True, help="token file to write")
    parser.add_argument("files", nargs="+", help="UTF-8 text files")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    ids = []
    for name in args.files:
        with open(name, encoding="utf-8") as f:
            lines = f.readlines()
        for start in range(0, len(lines), 1024):
            batch = tokenizer(lines[start : start + 1024], add_special_tokens=False)["input_ids"]
            for row in batch:
                ids.extend(row)
    write_token_file(args.output, ids, len(tokenizer))
    print(f"prepare_tokens: {len(ids)} ids, vocabulary {len(tokenizer)}, -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
