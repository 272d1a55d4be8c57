#!/usr/bin/env python3
"""Writes tests/golden/torch_load/*.pt: torch.save files whose pickle lies.

Usage: tests/golden/make_hostile_torch_files.py   (with the project's venv python)
Most start from torch.save({"cpu": torch.zeros(4, dtype=torch.uint8)}) and change a few bytes
of its data.pkl:
  tensor_beyond_storage.pt   the tensor's shape says 255 elements, its storage holds 4
  storage_beyond_record.pt   the storage says 255 elements too, its record holds 4 bytes
  storage_count_negative.pt  the storage says -1 elements, so no record is read for it
  memo_gap.pt                the first BINPUT stores memo entry 2**31 - 1 instead of 0
                             (LibTorch would grow its memo table to 32 GiB)
  string_past_end.pt         the BINUNICODE 'cpu' claims 4294967280 bytes (LibTorch would
                             allocate them before finding the pickle ends)
deflated_pickle_claims_2gib.pt, deflated_version_claims_2gib.pt: that record deflated, its
directory entry claiming 2 GiB once inflated (LibTorch allocates the claim first; it reads
"version" while opening the file), and deflated_version_claims_2gib_zip64.pt the same with
zip64 end records; and archive_memo_gap.pt is torch.jit.save of a scripted nn.Linear(2, 2) (the format of
optimizer.pt and master_weights.pt) with the same memo gap in its data.pkl.
"""
import io
import os
import struct
import zipfile

import torch

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_load")


def torch_save_bytes():
    buffer = io.BytesIO()
    torch.save({"cpu": torch.zeros(4, dtype=torch.uint8)}, buffer)
    return buffer.getvalue()


def jit_save_bytes():
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), buffer)
    return buffer.getvalue()


def rewrite(name, change, original=torch_save_bytes):
    buffer = io.BytesIO(original())
    source = zipfile.ZipFile(buffer)
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
rewrite("storage_count_negative.pt", lambda d: replace_once(d, b"K\x04t", b"J\xff\xff\xff\xfft"))
rewrite("memo_gap.pt", lambda d: replace_once(d, b"}q\x00", b"}r\xff\xff\xff\x7f"))
rewrite("string_past_end.pt",
        lambda d: replace_once(d, b"X\x03\x00\x00\x00cpu", b"X\xf0\xff\xff\xffcpu"))
rewrite("archive_memo_gap.pt", lambda d: replace_once(d, b"\nq\x00)", b"\nr\xff\xff\xff\x7f)"),
        original=jit_save_bytes)


def deflate_and_claim(name, record, claimed_size):
    """torch.save's file with its record `record` deflated, and the zip directory
    claiming `claimed_size` bytes for it once inflated: LibTorch allocates the claim first."""
    source = zipfile.ZipFile(io.BytesIO(torch_save_bytes()))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as out:
        for entry in source.namelist():
            deflate = entry.split("/", 1)[1] == record
            compression = zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED
            out.writestr(entry.replace(entry.split("/")[0], "archive", 1), source.read(entry),
                         compress_type=compression)
    data = bytearray(buffer.getvalue())
    target = ("archive/" + record).encode()
    position = 0
    while True:
        position = data.find(b"PK\x01\x02", position)
        assert position >= 0, record
        name_length = int.from_bytes(data[position + 28:position + 30], "little")
        if bytes(data[position + 46:position + 46 + name_length]) == target:
            break
        position += 4
    data[position + 24:position + 28] = claimed_size.to_bytes(4, "little")
    with open(os.path.join(HERE, name), "wb") as out:
        out.write(bytes(data))
    return bytes(data)


def with_zip64_end(data):
    """`data` with zip64 end records before its end record, whose fields then read 'see zip64'."""
    end = data.rfind(b"PK\x05\x06")
    entries, directory_size, directory_offset = struct.unpack("<HII", data[end + 10:end + 20])
    end64 = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries,
                        directory_size, directory_offset)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, end, 1)
    record = bytearray(data[end:])
    record[8:20] = struct.pack("<HHII", 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF)
    return data[:end] + end64 + locator + bytes(record)


deflate_and_claim("deflated_pickle_claims_2gib.pt", "data.pkl", 0x7FFFFFF0)
version_claims = deflate_and_claim("deflated_version_claims_2gib.pt", "version", 0x7FFFFFF0)
with open(os.path.join(HERE, "deflated_version_claims_2gib_zip64.pt"), "wb") as out:
    out.write(with_zip64_end(version_claims))
