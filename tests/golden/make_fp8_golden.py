#!/usr/bin/env python3
"""Writes the reference numbers of tests/fp8_test.cpp (mantissa::fp8):

* "current": torchao 0.18's own Float8Linear with the "tensorwise" recipe (dynamic per-tensor
  scales, e4m3 forward, e5m2 gradients), run on the CPU. torchao accepts the CPU here: its
  Float8TrainingTensor calls torch._scaled_mm, which 2.11 emulates on a CPU without AMX (with
  AMX-INT8 it runs oneDNN's kernel, whose fp32 sums are ordered differently; the test allows
  for that where the output is fp32). The committed file was made without AMX. Each
  case records the inputs (weight, bias, x, grad_output), the output, and the gradients of x,
  weight and bias after one backward. The C++ layer must match them within what the emulated
  GEMM allows: the fp8 operands and their scales are bit for bit the same, so what may differ is
  where the bias is added (torchao rounds the product to bf16 and then adds the bias in bf16;
  mantissa adds it inside _scaled_mm, before the one rounding) and the reduction order of the
  bias gradient.
* "delayed_state": a Python twin of TransformerEngine's delayed-scaling update
  (transformer_engine/common/recipe/delayed_scaling.cu, amax_and_scale_update): fixed sequences
  of recorded amaxes (zeros, inf and nan included) go through the update step by step, and the
  scales and the amax history after each update are written as float32 bit patterns, to be
  matched bit for bit.
* "delayed_layer": the delayed recipe through a whole linear layer for two steps: step 1 casts
  with the initial scales (1.0), the update turns the step-1 amaxes into new scales, and step 2
  casts with those. The layer is written out with torch._scaled_mm directly (no torchao, which
  dropped delayed scaling), so the C++ layer's step-2 output and gradients are compared with it.

Run with the project venv:  .venv/bin/python tests/golden/make_fp8_golden.py [OUT]
(default OUT: tests/golden/fp8_golden.json next to this script).
"""
import json
import math
import os
import struct
import sys

import torch

E4M3_MAX = 448.0
E5M2_MAX = 57344.0


def values(t):
    return [float(v) for v in t.detach().double().flatten().tolist()]


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f32(x):
    """Rounds a Python float to float32 (round to nearest even, as the C++ float does)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def tensor_doc(t):
    return {"dtype": str(t.dtype).split(".")[-1], "shape": list(t.shape), "values": values(t)}


# ---------------------------------------------------------------------------------------------
# current scaling: torchao's Float8Linear


def torchao_case(name, gen, batch_shape, in_features, out_features, bias, x_dtype, autocast):
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    linear = torch.nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(out_features, in_features, generator=gen) * 0.2)
        if bias:
            linear.bias.copy_(torch.randn(out_features, generator=gen))
    layer = Float8Linear.from_float(linear, config=Float8LinearConfig.from_recipe_name("tensorwise"))
    # One large value in x, so its scale is set by an outlier and small values lose precision.
    x = (torch.randn(*batch_shape, in_features, generator=gen) * 3).to(x_dtype)
    x.view(-1)[5] = 40.0
    x.requires_grad_(True)
    out_dtype = torch.bfloat16 if autocast else x_dtype
    grad_output = (torch.randn(*batch_shape, out_features, generator=gen) * 1e-3).to(out_dtype)
    # torchao's module only casts its input under CUDA autocast; under CPU autocast the fp8
    # tensors it builds are turned into bf16 ones by autocast's own cast of the mm operands.
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = layer(x)
    assert y.dtype == out_dtype, (name, y.dtype)
    y.backward(grad_output)
    return {
        "autocast": autocast,
        "weight": tensor_doc(layer.weight),
        "bias": tensor_doc(layer.bias) if bias else None,
        "x": tensor_doc(x),
        "grad_output": tensor_doc(grad_output),
        "output": tensor_doc(y),
        "grad_x": tensor_doc(x.grad),
        "grad_weight": tensor_doc(layer.weight.grad),
        "grad_bias": tensor_doc(layer.bias.grad) if bias else None,
    }


# ---------------------------------------------------------------------------------------------
# delayed scaling: a twin of TransformerEngine's update


def fmaxf(a, b):
    """C's fmaxf: a NaN argument is ignored."""
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return max(a, b)


def te_update(history, scales, fp8_maxes, algo, margin):
    """One amax_and_scale_update over every scale (one column of `history` each).

    history[0] holds the amaxes recorded since the last update; rows 1.. the earlier ones.
    Returns the rolled history and the new scales (float32 values as Python floats)."""
    length = len(history)
    new_history = [[0.0] * len(scales) for _ in range(length)]
    new_scales = []
    for s in range(len(scales)):
        last = history[0][s]
        window = 0.0
        for i in range(length):
            a = history[i + 1][s] if i < length - 1 else last
            window = fmaxf(window, a)
            new_history[i][s] = a if i > 0 else 0.0
        amax = last if algo == "most_recent" else window
        scaled_max = f32(fp8_maxes[s] * 2.0 ** -margin)
        if math.isfinite(amax) and amax > 0:
            new_scales.append(f32(scaled_max / amax))  # one correctly rounded fp32 division
        else:
            new_scales.append(scales[s])
    return new_history, new_scales


def record(history, slot, amax):
    """What the layer does between two updates: slot keeps the max of what it saw (NaN sticks)."""
    old = history[0][slot]
    history[0][slot] = amax if (math.isnan(amax) or math.isnan(old)) else max(old, f32(amax))


def delayed_state_case(gen, history_len, algo, margin, fp8_format, steps):
    """`steps` updates of one layer's three scales (input, weight, grad_output)."""
    grad_max = E5M2_MAX if fp8_format == "HYBRID" else E4M3_MAX
    fp8_maxes = [E4M3_MAX, E4M3_MAX, grad_max]
    history = [[0.0] * 3 for _ in range(history_len)]
    scales = [1.0, 1.0, 1.0]
    specials = {2: [0, 0.0], 4: [2, math.inf], 5: [1, math.nan], 7: [0, 1e-30]}
    recorded, after = [], []
    for step in range(steps):
        this_step = []
        for slot in range(3):
            # two micro-batches per step: the larger of the two counts
            for _ in range(2):
                amax = f32(float(torch.rand((), generator=gen)) * 10 ** (2 * slot - 2) * (step + 1))
                this_step.append([slot, amax])
        if step in specials:
            slot, value = specials[step]
            this_step = [[s, value if s == slot else a] for s, a in this_step]
        for slot, amax in this_step:
            record(history, slot, amax)
        history, scales = te_update(history, scales, fp8_maxes, algo, margin)
        recorded.append([[s, "nan" if math.isnan(a) else ("inf" if math.isinf(a) else a)]
                         for s, a in this_step])
        after.append({"scale_bits": [f32_bits(v) for v in scales],
                      "history_bits": [[f32_bits(v) for v in row] for row in history]})
    return {"amax_history_len": history_len, "amax_compute_algo": algo, "margin": margin,
            "fp8_format": fp8_format, "recorded": recorded, "after_update": after}


def saturated_cast(x, scale, dtype, fmax):
    return (x.float() * scale).clamp(-fmax, fmax).to(dtype)


def delayed_layer_step(weight, bias, x, grad_output, scales):
    """The delayed recipe's three GEMMs with given scales; returns outputs and the step's amaxes."""
    sx, sw, sg = (torch.tensor(s, dtype=torch.float32) for s in scales)
    x2 = x.reshape(-1, x.shape[-1])
    g2 = grad_output.reshape(-1, grad_output.shape[-1])
    x8 = saturated_cast(x2, sx, torch.float8_e4m3fn, E4M3_MAX)
    w8 = saturated_cast(weight, sw, torch.float8_e4m3fn, E4M3_MAX)
    g8 = saturated_cast(g2, sg, torch.float8_e5m2, E5M2_MAX)
    out = torch._scaled_mm(x8, w8.t(), sx.reciprocal(), sw.reciprocal(), bias=bias.bfloat16(),
                           out_dtype=torch.bfloat16, use_fast_accum=True)
    grad_x = torch._scaled_mm(g8, w8, sg.reciprocal(), sw.reciprocal(), out_dtype=torch.bfloat16)
    grad_w = torch._scaled_mm(g8.t().contiguous(), x8, sg.reciprocal(), sx.reciprocal(),
                              out_dtype=torch.bfloat16)
    amaxes = [float(t.abs().max().float()) for t in (x2, weight, g2)]
    return out.reshape(*x.shape[:-1], -1), grad_x.reshape(x.shape), grad_w, amaxes


def delayed_layer_case(gen):
    out_features, in_features = 32, 48
    weight = torch.randn(out_features, in_features, generator=gen) * 0.1
    bias = torch.randn(out_features, generator=gen) * 0.5
    xs = [(torch.randn(2, 8, in_features, generator=gen) * 2).bfloat16() for _ in range(2)]
    gs = [(torch.randn(2, 8, out_features, generator=gen) * 1e-4).bfloat16() for _ in range(2)]
    scales = [1.0, 1.0, 1.0]
    history = [[0.0] * 3 for _ in range(4)]
    _, _, _, amaxes = delayed_layer_step(weight, bias, xs[0], gs[0], scales)
    for slot, amax in enumerate(amaxes):
        record(history, slot, amax)
    history, scales = te_update(history, scales, [E4M3_MAX, E4M3_MAX, E5M2_MAX], "max", 1)
    out, grad_x, grad_w, _ = delayed_layer_step(weight, bias, xs[1], gs[1], scales)
    return {"amax_history_len": 4, "amax_compute_algo": "max", "margin": 1, "fp8_format": "HYBRID",
            "weight": tensor_doc(weight), "bias": tensor_doc(bias),
            "x": [tensor_doc(x) for x in xs], "grad_output": [tensor_doc(g) for g in gs],
            "step2_scale_bits": [f32_bits(s) for s in scales], "step2_output": tensor_doc(out),
            "step2_grad_x": tensor_doc(grad_x), "step2_grad_weight": tensor_doc(grad_w),
            "step2_grad_bias": tensor_doc(gs[1].float().reshape(-1, out_features).sum(0))}


def main():
    import torchao

    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "fp8_golden.json")
    torch.set_num_threads(1)
    doc = {"torch": torch.__version__, "torchao": torchao.__version__, "current": {},
           "delayed_state": {}}
    current = {
        "bf16_autocast_bias": ([32], 64, 48, True, torch.bfloat16, True),
        "bf16_autocast_3d_no_bias": ([2, 16], 32, 64, False, torch.bfloat16, True),
        "fp32_autocast_input": ([16], 48, 32, True, torch.float32, True),
        "fp32_no_autocast": ([16], 32, 32, True, torch.float32, False),
    }
    for index, (name, spec) in enumerate(current.items()):
        doc["current"][name] = torchao_case(name, torch.Generator().manual_seed(2400 + index), *spec)
    delayed = {
        "max_len4_margin0_hybrid": (4, "max", 0, "HYBRID"),
        "max_len1_margin0_hybrid": (1, "max", 0, "HYBRID"),
        "most_recent_len3_margin2_hybrid": (3, "most_recent", 2, "HYBRID"),
        "max_len16_margin1_e4m3": (16, "max", 1, "E4M3"),
    }
    for index, (name, spec) in enumerate(delayed.items()):
        doc["delayed_state"][name] = delayed_state_case(
            torch.Generator().manual_seed(2500 + index), *spec, steps=9)
    doc["delayed_layer"] = delayed_layer_case(torch.Generator().manual_seed(2600))
    with open(out_path, "w") as f:
        json.dump(doc, f)
        f.write("\n")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
