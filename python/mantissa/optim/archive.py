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

import numbers
import os

import torch

from mantissa.optim import _checks

_STATE_TENSORS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "kahan_comp")


def _get(module, name, where):
    """Entry ``name`` of one level of the archive (a ``torch._C.ScriptModule``)."""
    if not module.hasattr(name):
        raise ValueError(f"optimizer.pt: {where} has no '{name}'")
    return module.getattr(name)


def _level(module, name, where):
    """A nested level of the archive."""
    value = _get(module, name, where)
    if not isinstance(value, torch._C.ScriptModule):
        raise ValueError(f"optimizer.pt: {where}/{name} is not a nested archive; got "
                         f"{_checks.shorten(value)}")
    return value


def _count(module, name, where):
    """A ``.../size`` entry: a one-element integer tensor (or an int) >= 0."""
    value = _get(module, name, where)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_floating_point() or value.is_complex() or \
                value.dtype == torch.bool:
            raise ValueError(f"optimizer.pt: {where}/{name} must be one integer; got a "
                             f"{value.dtype} tensor of shape {list(value.shape)}")
        value = value.item()
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"optimizer.pt: {where}/{name} must be an integer; got "
                         f"{_checks.shorten(value)}")
    if value < 0:
        raise ValueError(f"optimizer.pt: {where}/{name} is {value}; a count is >= 0")
    return value


def _read_option(key, value, where):
    """One option from the file, as the Python type the group holds."""
    def wrong(kind):
        return ValueError(f"optimizer.pt: {where}: option '{key}' must be {kind}; got "
                          f"{_checks.shorten(value)}")

    def number(v):
        if not isinstance(v, numbers.Real) or isinstance(v, bool):
            raise wrong("a number")
        return float(v)

    if key == "betas":
        if not isinstance(value, (tuple, list)) or len(value) != 2:
            raise wrong("a pair of numbers")
        return (number(value[0]), number(value[1]))
    if key in ("lr", "eps", "weight_decay"):
        return number(value)
    if key in ("amsgrad", "maximize", "fp32_moments"):
        if not isinstance(value, bool):
            raise wrong("a bool")
        return value
    if key == "low_precision_update":
        if not isinstance(value, str):
            raise wrong("a string")
        return value
    if key == "stochastic_rounding_seed":
        if not isinstance(value, int) or isinstance(value, bool):
            raise wrong("an integer")
        # The C++ side stores the seed's 64 bits in a signed integer.
        return value % (1 << 64)
    raise AssertionError(key)


def open_archive(path, caller):
    """The levels every C++ optimizer.pt has, checked: the per-parameter states (by the
    parameter's number), the ``param_groups`` level and its group count. ``caller`` names the
    function in the error for a path that is not a regular file (refused without opening it)."""
    _checks.check_regular_file(path, caller)
    archive = torch.jit.load(os.fspath(path), map_location="cpu")
    version = _get(archive._c, "pytorch_version", "the file")
    if version != "1.5.0":
        raise ValueError("optimizer.pt: unknown layout version "
                         f"{_checks.shorten(version)} (expected '1.5.0')")
    _level(archive._c, "state", "the file")
    saved_states = dict(archive.state.named_children())
    groups_archive = _level(archive._c, "param_groups", "the file")
    return saved_states, groups_archive, _count(groups_archive, "param_groups/size", "param_groups")


def load_optimizer_pt(path):
    """Reads an ``optimizer.pt`` written by mantissa's C++ ``FusedAdamW`` (or LibTorch's
    ``torch::optim::AdamW``) into the ``state_dict`` layout ``FusedAdamW.load_state_dict``
    takes. Tensors are loaded on the CPU. Options the file lacks (LibTorch's AdamW has no
    ``low_precision_update``, ...) get the C++ defaults.

    Refuses, with a ValueError that names the entry and the value, what no finite run writes:
    options out of range, a NaN/inf moment, master or Kahan buffer, a negative second moment,
    a negative or fractional step, a negative count. A path that is not a regular file (a FIFO,
    a device) is refused without being opened."""
    saved_states, groups_archive, num_groups = open_archive(path, "load_optimizer_pt")
    state, param_groups, index, seen = {}, [], 0, {}
    for g in range(num_groups):
        where = f"param_groups/{g}"
        group_archive = _level(groups_archive, where, "param_groups")
        options = _level(group_archive, "options", where)
        from mantissa.optim import archive_families  # it imports this module's readers
        other = archive_families.family_of(options)
        if other is not None:
            raise ValueError(f"optimizer.pt: {where} holds the options of --optim {other}, not of "
                             f"AdamW; read it with {archive_families.loader_name(other)}")
        group = dict(_checks.CPP_DEFAULTS)
        for key in _checks.CPP_DEFAULTS:
            if options.hasattr(key):
                group[key] = _read_option(key, options.getattr(key), where)
        _checks.check_options(group, f"optimizer.pt: {where}", amsgrad_supported=True)
        size = _count(group_archive, "params/size", where)
        group["params"] = []
        for j in range(size):
            key = _get(group_archive, f"params/{j}", where)
            if not isinstance(key, str):
                raise ValueError(f"optimizer.pt: {where}/params/{j} must be a string; got "
                                 f"{_checks.shorten(key)}")
            if key in seen:
                raise ValueError(f"optimizer.pt: {where}/params/{j} names parameter "
                                 f"{_checks.shorten(key)} again (it is parameter {seen[key]})")
            seen[key] = index
            group["params"].append(index)
            saved = saved_states.get(key)
            if saved is not None:
                state[index] = _read_state(saved, f"optimizer.pt: the state of parameter {index}")
            index += 1
        param_groups.append(group)
    return {"state": state, "param_groups": param_groups}


def _read_state(saved, where):
    values = {}
    if saved._c.hasattr("step"):
        values["step"] = torch.tensor(_checks.step_value(saved._c.getattr("step"), where),
                                      dtype=torch.float32)
    for name in _STATE_TENSORS:
        if saved._c.hasattr(name):
            value = saved._c.getattr(name)
            _checks.check_state_tensor(name, value, where)
            values[name] = value.detach().clone()
    return values


def _state_entry(values, where):
    """What ``save_optimizer_pt`` writes of one parameter's state, checked."""
    if not isinstance(values, dict):
        raise TypeError(f"{where} must be a dict; got {_checks.shorten(values)}")
    entry = {}
    if "step" in values:
        entry["step"] = int(_checks.step_value(values["step"], where))
    shape = None
    for name in _STATE_TENSORS:
        if name in values:
            _checks.check_state_tensor(name, values[name], where, shape)
            shape = values[name].shape
            entry[name] = values[name]
    return entry


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


def _checked_state_dict(state_dict):
    """The groups (options filled with the C++ defaults and checked) and the per-parameter
    entries to write, or an error naming what is wrong; ``state_dict`` is not changed."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"save_optimizer_pt: state_dict must be a dict; got "
                        f"{_checks.shorten(state_dict)}")
    for key in ("state", "param_groups"):
        if key not in state_dict:
            raise ValueError(f"save_optimizer_pt: state_dict has no '{key}'")
    saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
    if not isinstance(saved_groups, (list, tuple)):
        raise TypeError("save_optimizer_pt: state_dict['param_groups'] must be a list; got "
                        f"{_checks.shorten(saved_groups)}")
    if not isinstance(saved_state, dict):
        raise TypeError("save_optimizer_pt: state_dict['state'] must be a dict; got "
                        f"{_checks.shorten(saved_state)}")
    groups, listed = [], set()
    for g, saved in enumerate(saved_groups):
        where = f"save_optimizer_pt: state_dict['param_groups'][{g}]"
        if not isinstance(saved, dict) or "params" not in saved:
            raise ValueError(f"{where} must be a dict with 'params'")
        group = {key: saved.get(key, default) for key, default in _checks.CPP_DEFAULTS.items()}
        _checks.check_options(group, where, amsgrad_supported=True)
        params = saved["params"]
        if not isinstance(params, (list, tuple)):
            raise TypeError(f"{where}['params'] must be a list; got {_checks.shorten(params)}")
        for j, param_id in enumerate(params):
            if not isinstance(param_id, int) or isinstance(param_id, bool):
                raise TypeError(f"{where}['params'][{j}] must be an integer; got "
                                f"{_checks.shorten(param_id)}")
            if param_id in listed:
                raise ValueError(f"{where}['params'][{j}] lists parameter {param_id} again")
            listed.add(param_id)
        group["params"] = list(params)
        groups.append(group)
    entries = {}
    for param_id, values in saved_state.items():
        if param_id not in listed:
            raise ValueError(f"save_optimizer_pt: state_dict['state'] has an entry for "
                             f"parameter {_checks.shorten(param_id)}, which no group lists")
        entries[param_id] = _state_entry(
            values, f"save_optimizer_pt: state_dict['state'][{param_id}]")
    return groups, entries


def save_optimizer_pt(state_dict, path):
    """Writes a ``FusedAdamW.state_dict()`` as the C++ ``FusedAdamW`` saves it, so that the
    C++ Trainer's ``--resume_from_checkpoint`` (or ``FusedAdamW::load``) reads it. Masters
    (``master_param``) are not written: the C++ Trainer keeps them in ``master_weights.pt``.

    Checks everything first (the options, the steps, every tensor finite and second moments
    >= 0, as ``load_optimizer_pt`` does) and writes nothing when something is wrong. Callable
    any number of times in a process. A ``path`` that exists and is not a regular file (a FIFO,
    a device) is refused without being opened."""
    groups, entries = _checked_state_dict(state_dict)
    _checks.check_regular_file(path, "save_optimizer_pt", for_writing=True)
    # LibTorch reads every attribute of the `state` level as a parameter's state, so that level
    # must hold nothing else: not the `training` flag and hook slot a scripted nn.Module has.
    # It and the top level are built as bare modules, each of a type of its own (a fresh
    # compilation unit): torch.jit.script caches a module's type by its attributes, so a
    # scripted top level would be the type of the previous call, which already has a `state`
    # of the previous call's type.
    states = torch._C.ScriptModule("__torch__.mantissa.OptimizerState", torch._C.CompilationUnit(),
                                   True)
    for param_id, entry in entries.items():
        scripted = torch.jit.script(_Archive(entry))._c
        states._register_attribute(str(param_id), scripted._type(), scripted)
    levels = {"param_groups/size": torch.tensor(len(groups))}
    for g, group in enumerate(groups):
        options = {key: group[key] for key in _checks.CPP_DEFAULTS}
        options["betas"] = (float(options["betas"][0]), float(options["betas"][1]))
        for key in ("lr", "eps", "weight_decay"):
            options[key] = float(options[key])
        seed = options["stochastic_rounding_seed"]
        options["stochastic_rounding_seed"] = seed - (1 << 64) if seed >= (1 << 63) else seed
        values = {"params/size": torch.tensor(len(group["params"]))}
        for j, param_id in enumerate(group["params"]):
            values[f"params/{j}"] = str(param_id)
        values["options"] = _Archive(options)
        levels[f"param_groups/{g}"] = _Archive(values)
    param_groups = torch.jit.script(_Archive(levels))._c
    archive = torch._C.ScriptModule("__torch__.mantissa.OptimizerArchive",
                                    torch._C.CompilationUnit(), True)
    archive._register_attribute("pytorch_version", torch._C.StringType.get(), "1.5.0")
    archive._register_attribute("param_groups", param_groups._type(), param_groups)
    archive._register_attribute("state", states._type(), states)
    archive.save(os.fspath(path))
