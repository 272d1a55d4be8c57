"""The C++ optimizer's file (the Trainer's ``optimizer.pt``) as a Python ``state_dict``, and back.

The C++ ``FusedAdamW`` saves a LibTorch archive, i.e. a TorchScript module: attribute
``pytorch_version`` ("1.5.0"), a submodule ``state`` with one submodule per parameter (named by
a number that identifies the parameter within the file) holding ``step`` (an integer),
``exp_avg``, ``exp_avg_sq`` and optionally ``max_exp_avg_sq`` and ``kahan_comp``; and a
submodule ``param_groups`` with a tensor ``param_groups/size`` and submodules
``param_groups/<i>``, each with ``params/size``, ``params/<j>`` (the parameter's number, a string)
and an ``options`` submodule (``lr``, ``betas``, ``eps``, ``weight_decay``, ``amsgrad``,
``maximize``, ``low_precision_update``, ``stochastic_rounding_seed``, ``fp32_moments``).

A Python ``state_dict`` numbers the parameters 0, 1, ... over the groups in order, with the
same per-parameter and per-group keys. Only the optimizer's own file is converted: the C++
Trainer keeps fp32 master weights in ``master_weights.pt``, so a state loaded from
``optimizer.pt`` into ``FusedAdamW(master_weights=True)`` starts its masters from the model's
parameters.
"""

import torch

_OPTION_TYPES = (
    ("lr", float),
    ("betas", lambda v: (float(v[0]), float(v[1]))),
    ("eps", float),
    ("weight_decay", float),
    ("amsgrad", bool),
    ("maximize", bool),
    ("low_precision_update", str),
    ("stochastic_rounding_seed", int),
    ("fp32_moments", bool),
)
_STATE_TENSORS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "kahan_comp")


def _get(module, name, where):
    if not module._c.hasattr(name):
        raise ValueError(f"optimizer.pt: {where} has no '{name}'")
    return module._c.getattr(name)


def load_optimizer_pt(path):
    """Reads an ``optimizer.pt`` written by mantissa's C++ ``FusedAdamW`` (or LibTorch's
    ``torch::optim::AdamW``) into the ``state_dict`` layout ``FusedAdamW.load_state_dict``
    takes. Tensors are loaded on the CPU. Options the file lacks (LibTorch's AdamW has no
    ``low_precision_update``, ...) get the C++ defaults."""
    archive = torch.jit.load(str(path), map_location="cpu")
    version = _get(archive, "pytorch_version", "the file")
    if version != "1.5.0":
        raise ValueError(f"optimizer.pt: unknown layout version {version!r} (expected '1.5.0')")
    saved_states = dict(archive.state.named_children())
    groups_archive = archive.param_groups
    num_groups = int(_get(groups_archive, "param_groups/size", "param_groups"))
    state, param_groups, index = {}, [], 0
    for g in range(num_groups):
        group_archive = getattr(groups_archive, f"param_groups/{g}")
        options = group_archive.options
        group = {
            "lr": 1e-3,
            "betas": (0.9, 0.999),
            "eps": 1e-8,
            "weight_decay": 1e-2,
            "amsgrad": False,
            "maximize": False,
            "low_precision_update": "nearest",
            "stochastic_rounding_seed": 0,
            "fp32_moments": False,
        }
        for key, convert in _OPTION_TYPES:
            if options._c.hasattr(key):
                group[key] = convert(options._c.getattr(key))
        # The C++ side stores the seed's 64 bits in a signed integer.
        group["stochastic_rounding_seed"] %= 1 << 64
        size = int(_get(group_archive, "params/size", f"param_groups/{g}"))
        group["params"] = []
        for j in range(size):
            key = _get(group_archive, f"params/{j}", f"param_groups/{g}")
            group["params"].append(index)
            saved = saved_states.get(key)
            if saved is not None:
                values = {}
                if saved._c.hasattr("step"):
                    step = saved._c.getattr("step")
                    step = step.item() if isinstance(step, torch.Tensor) else step
                    values["step"] = torch.tensor(float(step), dtype=torch.float32)
                for name in _STATE_TENSORS:
                    if saved._c.hasattr(name):
                        values[name] = saved._c.getattr(name).detach().clone()
                state[index] = values
            index += 1
        param_groups.append(group)
    return {"state": state, "param_groups": param_groups}


class _Archive(torch.nn.Module):
    """One level of a LibTorch archive: tensors as parameters (what ``OutputArchive::write``
    registers), other values as attributes, nested archives as submodules."""

    def __init__(self, values):
        super().__init__()
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                self.register_parameter(
                    key, torch.nn.Parameter(value.detach().cpu().clone(), requires_grad=False)
                )
            elif isinstance(value, torch.nn.Module):
                self.add_module(key, value)
            else:
                setattr(self, key, value)


def save_optimizer_pt(state_dict, path):
    """Writes a ``FusedAdamW.state_dict()`` as the C++ ``FusedAdamW`` saves it, so that the
    C++ Trainer's ``--resume_from_checkpoint`` (or ``FusedAdamW::load``) reads it. Masters
    (``master_param``) are not written: the C++ Trainer keeps them in ``master_weights.pt``."""
    # LibTorch reads every attribute of the `state` level as a parameter's state, so that level
    # must hold nothing else: not the `training` flag and hook slot a scripted nn.Module has.
    states = torch._C.ScriptModule("__torch__.mantissa.OptimizerState", torch._C.CompilationUnit(),
                                   True)
    for param_id, values in state_dict["state"].items():
        entry = {}
        if "step" in values:
            step = values["step"]
            entry["step"] = int(step.item() if isinstance(step, torch.Tensor) else step)
        for name in _STATE_TENSORS:
            if name in values:
                entry[name] = values[name]
        scripted = torch.jit.script(_Archive(entry))._c
        states._register_attribute(str(param_id), scripted._type(), scripted)
    groups = {"param_groups/size": torch.tensor(len(state_dict["param_groups"]))}
    for g, group in enumerate(state_dict["param_groups"]):
        options = {}
        for key, convert in _OPTION_TYPES:
            if key in group:
                options[key] = convert(group[key])
        seed = options.get("stochastic_rounding_seed", 0)
        options["stochastic_rounding_seed"] = seed - (1 << 64) if seed >= (1 << 63) else seed
        values = {"params/size": torch.tensor(len(group["params"]))}
        for j, param_id in enumerate(group["params"]):
            values[f"params/{j}"] = str(param_id)
        values["options"] = _Archive(options)
        groups[f"param_groups/{g}"] = _Archive(values)
    archive = torch.jit.script(
        _Archive({"pytorch_version": "1.5.0", "param_groups": _Archive(groups)}))._c
    archive._register_attribute("state", states._type(), states)
    archive.save(str(path))
