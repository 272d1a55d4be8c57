"""The C++ Trainer's ``optimizer.pt`` of ``--optim adafactor``, ``muon`` and
``adamw_torch_8bit`` as the ``state_dict`` of the Python optimizer each one follows:
``transformers.optimization.Adafactor`` (as HF's Trainer builds it), ``torch.optim.Muon`` plus
``torch.optim.AdamW``, and ``torchao.optim.AdamW8bit``.

The file has the layout ``archive.py`` describes for FusedAdamW (``state/<number>/...``,
``param_groups/<i>/{params/..., options/...}``), with each optimizer's own option and state
keys, which are the Python optimizer's keys (docs/optimizers.md). Parameters are numbered 0,
1, ... over the groups in order, as a Python ``state_dict`` numbers them; build the Python
optimizer over the same tensors in the same groups and order as the C++ Trainer (HF's two
weight-decay groups: the tensors of 2 or more dimensions in the model's order, then the 1-d
ones) and ``load_state_dict`` the result.
"""

import warnings

import torch

from mantissa.optim import _checks
from mantissa.optim.archive import _count, _get, _level, open_archive

_STATE_KEYS = ("step", "exp_avg", "exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col",
               "momentum_buffer", "exp_avg_codes", "exp_avg_scale", "exp_avg_sq_codes",
               "exp_avg_sq_scale", "kahan_comp")
_NON_NEGATIVE = ("exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq_scale",
                 "exp_avg_scale")
_FAMILY_MARKS = {"adafactor": "clip_threshold", "muon": "use_muon", "adamw_torch_8bit":
                 "block_size"}
_LOADERS = {"adafactor": "load_adafactor_pt", "muon": "load_muon_pt",
            "adamw_torch_8bit": "load_adamw_8bit_pt"}


def family_of(options):
    """The ``--optim`` name whose options ``options`` (an archive level) holds, or None for
    the AdamW family (FusedAdamW, LibTorch's AdamW)."""
    for name, mark in _FAMILY_MARKS.items():
        if options.hasattr(mark):
            return name
    return None


def loader_name(family):
    """The function of this module that reads an optimizer.pt of ``family``."""
    return _LOADERS[family]


def _read(path, family, option_keys):
    """The groups (options by ``option_keys``, and parameter numbers) and the per-parameter
    state of a C++ optimizer.pt of ``family``, checked: what no finite run writes is refused
    with a ValueError naming the entry."""
    saved_states, groups_archive, num_groups = open_archive(path, _LOADERS[family])
    groups, states, seen = [], {}, {}
    for g in range(num_groups):
        where = f"param_groups/{g}"
        group_archive = _level(groups_archive, where, "param_groups")
        options = _level(group_archive, "options", where)
        found = family_of(options)
        if found != family:
            hint = (f"use {_LOADERS[found]}" if found is not None else
                    "it is an AdamW file: use load_optimizer_pt")
            raise ValueError(f"optimizer.pt: {where} holds the options of "
                             f"{found or 'AdamW'}, not of {family}; {hint}")
        group = {key: options.getattr(key) for key in option_keys if options.hasattr(key)}
        size = _count(group_archive, "params/size", where)
        group["params"] = []
        for j in range(size):
            key = _get(group_archive, f"params/{j}", where)
            if not isinstance(key, str) or key in seen:
                raise ValueError(f"optimizer.pt: {where}/params/{j} must name a parameter once; "
                                 f"got {_checks.shorten(key)}")
            index = len(seen)
            seen[key] = index
            group["params"].append(index)
            saved = saved_states.get(key)
            if saved is not None:
                states[index] = _read_state(saved, f"optimizer.pt: the state of parameter {index}")
        groups.append(group)
    return groups, states


def _read_state(saved, where):
    values = {}
    for key in _STATE_KEYS:
        if not saved._c.hasattr(key):
            continue
        value = saved._c.getattr(key)
        if key == "step":
            values[key] = _checks.step_value(value, where)
            continue
        if key.endswith("_codes"):
            if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8:
                raise ValueError(f"{where}: {key} must be a uint8 tensor; got "
                                 f"{_checks.shorten(value)}")
        else:
            _checks.check_state_tensor(key, value, where)
            if key in _NON_NEGATIVE and bool((value < 0).any()):
                raise ValueError(f"{where}: {key} has negative values; it is >= 0 in every run")
        values[key] = value.detach().clone()
    return values


def _drop_kahan(states, family):
    if any("kahan_comp" in values for values in states.values()):
        warnings.warn(f"optimizer.pt: the {family} state holds kahan_comp (pure bf16/fp16 with "
                      "low_precision_update kahan), which the Python optimizer has no key for; "
                      "it is left out, so the first steps in Python round as that optimizer does",
                      stacklevel=3)
    for values in states.values():
        values.pop("kahan_comp", None)


def load_adafactor_pt(path):
    """Reads a C++ ``--optim adafactor`` optimizer.pt as the ``state_dict`` of
    ``transformers.optimization.Adafactor(params, lr=..., scale_parameter=False,
    relative_step=False)``, HF's Trainer's settings: ``eps`` becomes HF's pair ``(eps, 1e-3)``
    (the second only scales with ``scale_parameter``), ``warmup_init`` False, and ``RMS``, which
    HF recomputes from the parameter before each use, 0. A pure bf16/fp16 run's ``kahan_comp``
    is left out with a warning. Tensors are loaded on the CPU."""
    groups, states = _read(path, "adafactor",
                           ("lr", "eps", "clip_threshold", "decay_rate", "beta1", "weight_decay"))
    _drop_kahan(states, "adafactor")
    param_groups = []
    for group in groups:
        param_groups.append({
            "lr": float(group["lr"]),
            "eps": (float(group["eps"]), 1e-3),
            "clip_threshold": float(group["clip_threshold"]),
            "decay_rate": float(group["decay_rate"]),
            "beta1": float(group["beta1"]) if "beta1" in group else None,
            "weight_decay": float(group["weight_decay"]),
            "scale_parameter": False,
            "relative_step": False,
            "warmup_init": False,
            "params": group["params"],
        })
    state = {}
    for index, values in states.items():
        entry = {"step": int(values.pop("step", 0)), "RMS": 0}
        entry.update(values)
        state[index] = entry
    return {"state": state, "param_groups": param_groups}


def load_muon_pt(path):
    """Reads a C++ ``--optim muon`` optimizer.pt as two ``state_dict``s: ``(muon, adamw)``,
    for ``torch.optim.Muon`` over the tensors of the Muon group (the 2-d weights inside the
    blocks, in the model's order) and ``torch.optim.AdamW`` over the rest, in the C++ groups'
    order (the decaying ones, then the others), each numbered from 0. A C++ group with no
    tensor is left out. Tensors are loaded on the CPU."""
    groups, states = _read(path, "muon",
                           ("lr", "weight_decay", "use_muon", "momentum", "nesterov",
                            "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn", "betas",
                            "adam_eps"))
    _drop_kahan(states, "muon")
    muon = {"state": {}, "param_groups": []}
    adamw = {"state": {}, "param_groups": []}
    for group in groups:
        if not group["params"]:
            continue
        if group["use_muon"]:
            target = muon
            options = {
                "lr": float(group["lr"]),
                "weight_decay": float(group["weight_decay"]),
                "momentum": float(group["momentum"]),
                "nesterov": bool(group["nesterov"]),
                "ns_coefficients": tuple(float(c) for c in group["ns_coefficients"]),
                "eps": float(group["eps"]),
                "ns_steps": int(group["ns_steps"]),
                # "original" is what torch.optim.Muon's default None means.
                "adjust_lr_fn": None if group["adjust_lr_fn"] == "original" else
                group["adjust_lr_fn"],
            }
        else:
            target = adamw
            options = {
                "lr": float(group["lr"]),
                "betas": tuple(float(b) for b in group["betas"]),
                "eps": float(group["adam_eps"]),
                "weight_decay": float(group["weight_decay"]),
                "amsgrad": False,
                "maximize": False,
                "foreach": None,
                "capturable": False,
                "differentiable": False,
                "fused": None,
                "decoupled_weight_decay": True,
            }
        numbers = []
        for index in group["params"]:
            number = sum(len(g["params"]) for g in target["param_groups"]) + len(numbers)
            numbers.append(number)
            values = states.get(index)
            if values is None:
                continue
            if group["use_muon"]:
                if "momentum_buffer" not in values:
                    raise ValueError(f"optimizer.pt: parameter {index} of a Muon group has no "
                                     "momentum_buffer")
                target["state"][number] = {"momentum_buffer": values["momentum_buffer"]}
            else:
                if "exp_avg" not in values or "exp_avg_sq" not in values:
                    raise ValueError(f"optimizer.pt: parameter {index} of an AdamW group lacks "
                                     "exp_avg or exp_avg_sq")
                target["state"][number] = {
                    "step": torch.tensor(float(values.get("step", 0)), dtype=torch.float32),
                    "exp_avg": values["exp_avg"],
                    "exp_avg_sq": values["exp_avg_sq"],
                }
        options["params"] = numbers
        target["param_groups"].append(options)
    return muon, adamw


def load_adamw_8bit_pt(path, dtype=torch.float32):
    """Reads a C++ ``--optim adamw_torch_8bit`` optimizer.pt as the ``state_dict`` of
    ``torchao.optim.AdamW8bit``: a quantised moment becomes torchao's ``OptimState8bit`` from
    its codes and block scales, with torchao's quantisation maps and ``dtype`` (the dtype it
    shows: the parameter's, float32 by default); a small tensor's moments stay plain tensors.
    ``lr`` is a float32 tensor, as torchao keeps it. A pure bf16/fp16 run's ``kahan_comp`` is
    left out with a warning. Needs torchao. Tensors are loaded on the CPU."""
    from torchao.optim.subclass_8bit import OptimState8bit, get_qmap_signed, get_qmap_unsigned

    groups, states = _read(path, "adamw_torch_8bit",
                           ("lr", "betas", "eps", "weight_decay", "block_size"))
    _drop_kahan(states, "adamw_torch_8bit")
    qmaps = {True: torch.tensor(get_qmap_signed(), dtype=torch.float32),
             False: torch.tensor(get_qmap_unsigned(), dtype=torch.float32)}
    param_groups = []
    for group in groups:
        param_groups.append({
            "lr": torch.tensor(float(group["lr"]), dtype=torch.float32),
            "betas": tuple(float(b) for b in group["betas"]),
            "eps": float(group["eps"]),
            "weight_decay": float(group["weight_decay"]),
            "amsgrad": False,
            "params": group["params"],
        })
    state = {}
    for index, values in states.items():
        entry = {"step": torch.tensor(float(values.get("step", 0)), dtype=torch.float32)}
        for name, signed in (("exp_avg", True), ("exp_avg_sq", False)):
            if f"{name}_codes" in values:
                codes, scale = values[f"{name}_codes"], values[f"{name}_scale"]
                if scale.dim() != 1 or scale.numel() == 0 or codes.numel() % scale.numel():
                    raise ValueError(f"optimizer.pt: parameter {index}'s {name}_scale has "
                                     f"{scale.numel()} blocks for {codes.numel()} codes")
                entry[name] = OptimState8bit(codes, scale, qmaps[signed].clone(), signed,
                                             dtype=dtype)
            elif name in values:
                entry[name] = values[name]
            else:
                raise ValueError(f"optimizer.pt: parameter {index} has no {name}")
        state[index] = entry
    return {"state": state, "param_groups": param_groups}
