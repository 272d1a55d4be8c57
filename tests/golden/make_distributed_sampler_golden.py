#!/usr/bin/env python3
"""Writes the index lists of torch.utils.data.DistributedSampler that
tests/distributed_test.cpp must reproduce exactly with mantissa::distributed::distributed_sampler_indices.

Run with the project venv:  .venv/bin/python tests/golden/make_distributed_sampler_golden.py [OUT]
(default OUT: tests/golden/distributed_sampler.json next to this script).

Each case builds PyTorch's own sampler over a dataset of `num_examples` items with explicit
`num_replicas` and `rank` (no process group needed), calls `set_epoch(epoch)` and lists the
indices it yields. The cases cover sizes that divide the world size and sizes that do not (padding
by repetition, also when the padding is longer than the data, and dropping with drop_last), more
ranks than examples, an empty dataset, shuffling off, and several seeds and epochs (the generator
is seeded seed + epoch, so seed 1 epoch 2 and seed 3 epoch 0 give the same order).
"""
import json
import os
import sys

import torch
from torch.utils.data import DistributedSampler

# (num_examples, world_size, seed, epoch, shuffle, drop_last); every rank of each is written.
CASES = [
    (10, 2, 0, 0, True, False),
    (10, 3, 0, 0, True, False),
    (10, 3, 0, 0, True, True),
    (10, 4, 42, 3, True, False),
    (10, 4, 42, 3, True, True),
    (11, 2, 7, 0, False, False),
    (11, 2, 7, 0, False, True),
    (3, 8, 0, 1, True, False),   # padding longer than the data: repeated more than once
    (3, 8, 0, 1, True, True),    # every rank gets nothing
    (0, 2, 0, 0, True, False),
    (1, 1, 5, 0, True, False),
    (1000, 3, 0, 0, True, False),
    (1000, 3, 0, 1, True, False),
    (1000, 3, 1, 2, True, True),
    (1000, 3, 3, 0, True, True),
    (6000, 8, 42, 5, True, False),
    (257, 1, 123, 0, True, False),
]


class Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def run(num_examples, world_size, seed, epoch, shuffle, drop_last):
    ranks = []
    for rank in range(world_size):
        sampler = DistributedSampler(Sized(num_examples), num_replicas=world_size, rank=rank,
                                     shuffle=shuffle, seed=seed, drop_last=drop_last)
        sampler.set_epoch(epoch)
        ranks.append(list(iter(sampler)))
    return {"num_examples": num_examples, "world_size": world_size, "seed": seed,
            "epoch": epoch, "shuffle": shuffle, "drop_last": drop_last, "indices": ranks}


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "distributed_sampler.json")
    cases = [run(*case) for case in CASES]
    doc = {"source": f"torch {torch.__version__} torch.utils.data.DistributedSampler"}
    # One line per case, so that a regenerated file diffs case by case.
    text = json.dumps(doc, indent=1)[:-2] + ',\n "cases": [\n'
    text += ",\n".join("  " + json.dumps(case) for case in cases) + "\n ]\n}\n"
    assert json.loads(text)["cases"] == cases
    with open(out_path, "w") as f:
        f.write(text)
    print(f"wrote {out_path} ({doc['source']}, {len(cases)} cases)")


if __name__ == "__main__":
    main()
