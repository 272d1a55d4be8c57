#!/usr/bin/env python3
"""Writes the reference numbers of tests/multihead_attention_test.cpp (mantissa::nn::MultiheadAttention)
from PyTorch's own torch.nn.MultiheadAttention.

Each case builds the PyTorch module from torch.manual_seed(seed) (so the C++ module, built from
the same seed, must start with the same parameters), runs one forward in training mode with
dropout 0 (PyTorch's fused fast path is then off, and the result is the reference formula),
and one backward of the output against a random grad_output. Recorded: the options, the
parameters by name, the inputs and masks, the output, the averaged attention weights (when
need_weights), and the gradients of the query and of every parameter. The bf16 case runs under
torch.autocast("cpu", torch.bfloat16), as the Trainer's --bf16 does.

Run with the project venv:  .venv/bin/python tests/golden/make_multihead_attention_golden.py [OUT]
(default OUT: tests/golden/multihead_attention_golden.json next to this script).
"""
import json
import os
import sys

import torch


def doc(t):
    t = t.detach()
    if t.dtype == torch.bool:
        return {"dtype": "bool", "shape": list(t.shape), "values": [int(v) for v in t.flatten().tolist()]}
    return {"dtype": str(t.dtype).split(".")[-1], "shape": list(t.shape),
            # 9 significant digits hold a float32 exactly.
            "values": [float(f"{v:.9g}") for v in t.double().flatten().tolist()]}


def padding_mask(lengths, width):
    """[B, width] bool, true past each example's length (HF's attention_mask == 0)."""
    return torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None]


def case(name, seed, embed_dim, num_heads, batch, tgt, src, *, kdim=None, vdim=None, bias=True,
         add_bias_kv=False, add_zero_attn=False, batch_first=False, self_attention=False,
         key_padding_mask=None, attn_mask=None, need_weights=True, autocast=False):
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(embed_dim, num_heads, bias=bias, add_bias_kv=add_bias_kv,
                                      add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim,
                                      batch_first=batch_first)
    mha.train()
    init = {n: doc(p) for n, p in mha.named_parameters()}
    gen = torch.Generator().manual_seed(seed + 1000)

    def seq(length, features):
        shape = (batch, length, features) if batch_first else (length, batch, features)
        return torch.randn(*shape, generator=gen)

    query = seq(tgt, embed_dim).requires_grad_(True)
    if self_attention:
        key = value = query
    else:
        key = seq(src, kdim or embed_dim)
        value = seq(src, vdim or embed_dim)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out, weights = mha(query, key, value, key_padding_mask=key_padding_mask, need_weights=need_weights,
                           attn_mask=attn_mask)
    grad_output = torch.randn(out.shape, generator=gen).to(out.dtype)
    out.backward(grad_output)
    return name, {
        "seed": seed, "embed_dim": embed_dim, "num_heads": num_heads, "kdim": kdim or embed_dim,
        "vdim": vdim or embed_dim, "bias": bias, "add_bias_kv": add_bias_kv, "add_zero_attn": add_zero_attn,
        "batch_first": batch_first, "self_attention": self_attention, "need_weights": need_weights,
        "autocast": autocast,
        "init": init,
        "query": doc(query), "key": doc(key), "value": doc(value),
        "key_padding_mask": doc(key_padding_mask) if key_padding_mask is not None else None,
        "attn_mask": doc(attn_mask) if attn_mask is not None else None,
        "grad_output": doc(grad_output),
        "output": doc(out),
        "weights": doc(weights) if weights is not None else None,
        "grad_query": doc(query.grad),
        "grads": {n: doc(p.grad) for n, p in mha.named_parameters()},
    }


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                                 "multihead_attention_golden.json")
    causal = torch.ones(6, 6, dtype=torch.bool).triu(1)
    float_mask = torch.randn(5, 7, generator=torch.Generator().manual_seed(7)) * 0.5
    cases = dict([
        # Cross attention, padded keys (bool), an additive float mask, the weights returned.
        case("cross_float_mask_weights", 1, 16, 4, 3, 5, 7, key_padding_mask=padding_mask([7, 4, 2], 7),
             attn_mask=float_mask),
        # Self attention over a padded batch, batch first, causal: the SDPA path.
        case("self_padded_causal_sdpa", 2, 16, 2, 3, 6, 6, batch_first=True, self_attention=True,
             key_padding_mask=padding_mask([6, 3, 5], 6), attn_mask=causal, need_weights=False),
        # Other key and value widths, bias_k/bias_v and a zero attention slot.
        case("kdim_vdim_bias_kv_zero_attn", 3, 12, 3, 2, 4, 5, kdim=8, vdim=10, add_bias_kv=True,
             add_zero_attn=True, key_padding_mask=padding_mask([5, 3], 5)),
        # No biases at all.
        case("no_bias", 4, 8, 2, 2, 3, 3, bias=False),
        # The padded causal self attention under bf16 autocast: what --bf16 trains.
        case("self_padded_causal_bf16_autocast", 5, 16, 2, 3, 6, 6, batch_first=True, self_attention=True,
             key_padding_mask=padding_mask([6, 3, 5], 6), attn_mask=causal, need_weights=False, autocast=True),
    ])
    with open(out_path, "w") as f:
        json.dump({"torch": torch.__version__, "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out_path} ({len(cases)} cases, torch {torch.__version__})")


if __name__ == "__main__":
    main()
