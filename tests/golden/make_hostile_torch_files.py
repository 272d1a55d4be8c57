#!/usr/bin/env python3
"""Writes tests/golden/torch_load/*.pt: torch.save files whose pickle lies about a tensor.

Usage: tests/golden/make_hostile_torch_files.py   (with the project's venv python)
Both start from torch.save({"cpu": torch.zeros(4, dtype=torch.uint8)}) and change one byte of
its data.pkl, so that LibTorch's unpickler builds a tensor that reaches past its bytes:
  tensor_beyond_storage.pt  the tensor's shape says 255 elements, its storage holds 4
  storage_beyond_record.pt  the storage says 255 elements too, its record holds 4 bytes
"""
import io
import os
import zipfile

import torch

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_load")


def rewrite(name, change):
    buffer = io.BytesIO()
    torch.save({"cpu": torch.zeros(4, dtype=torch.uint8)}, buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    os.makedirs(HERE, exist_ok=True)
    with zipfile.ZipFile(os.path.join(HERE, name), "w", zipfile.ZIP_STORED) as out:
        for entry in source.namelist():
            data = source.read(entry)
            if entry.endswith("/data.pkl"):
                data = change(data)
            out.writestr(entry.replace(entry.split("/")[0], "archive", 1), data)


def replace_once(data, old, new):
    assert data.count(old) == 1, (old, data)
    return data.replace(old, new)


# The storage's persistent id ends with its element count (BININT1 4, then TUPLE), and the
# shape (4,) is BININT1 4 then TUPLE1.
rewrite("tensor_beyond_storage.pt", lambda d: replace_once(d, b"K\x04\x85", b"K\xff\x85"))
rewrite("storage_beyond_record.pt",
        lambda d: replace_once(replace_once(d, b"K\x04\x85", b"K\xff\x85"), b"K\x04t", b"K\xfft"))
