"""What FusedAdamW, load_optimizer_pt and save_optimizer_pt accept: a group's options and a
parameter's state, checked in full before anything is changed. Each error is a ValueError (a
wrong value) or a TypeError (a wrong kind of value) that names where the value is (``where``),
the key and the value."""

import errno
import math
import numbers
import os
import stat

import torch

RULES = ("nearest", "kahan", "stochastic_rounding")
# The C++ FusedAdamWOptions' defaults: what a group saved without a key gets.
CPP_DEFAULTS = {
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
_BOOLEAN_OPTIONS = ("amsgrad", "maximize", "master_weights", "fp32_moments")
# The per-parameter tensors a state may hold, and which of them are second moments (>= 0).
STATE_TENSORS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "kahan_comp", "master_param")
_SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq")
_SHOWN_CHARS = 80  # as the C++ side's mantissa::detail::shorten


def shorten(value):
    """``repr(value)``, cut to its first 80 characters and "..." when longer: a hostile value
    costs a line of a message, not pages."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def shorten_path(path):
    """A path of at most 80 characters itself; a longer one as its start, "..." and its end
    (which names the file), as the C++ side's mantissa::detail::shorten_path."""
    text = os.fsdecode(path)
    if len(text) <= _SHOWN_CHARS:
        return text
    head = _SHOWN_CHARS // 3
    return text[:head] + "..." + text[len(text) - (_SHOWN_CHARS - head):]


def _prefix(where):
    return f"{where}: " if where else ""


def _is_real(value):
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _finite_non_negative(group, key, label, where):
    value = group[key]
    if isinstance(value, torch.Tensor):
        raise TypeError(f"{_prefix(where)}{key} must be a float, not a tensor")
    if not _is_real(value):
        raise TypeError(f"{_prefix(where)}{key} must be a number; got {shorten(value)}")
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{_prefix(where)}Invalid {label}: {value} ({key} must be finite and >= 0)")


def check_options(group, where="", amsgrad_supported=False):
    """Checks the options of one parameter group (a dict with every key of ``CPP_DEFAULTS``;
    ``master_weights`` is checked when present). ``amsgrad=True`` is refused unless
    ``amsgrad_supported`` (the file converters pass LibTorch AdamW's option through). Never
    changes ``group``."""
    for key in CPP_DEFAULTS:
        if key not in group:
            raise ValueError(f"{_prefix(where)}the group has no '{key}'")
    _finite_non_negative(group, "lr", "learning rate", where)
    _finite_non_negative(group, "eps", "epsilon value", where)
    _finite_non_negative(group, "weight_decay", "weight_decay value", where)
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise TypeError(f"{_prefix(where)}betas must be a pair (beta1, beta2); got {shorten(betas)}")
    for index, beta in enumerate(betas):
        if not _is_real(beta):
            raise TypeError(
                f"{_prefix(where)}betas[{index}] must be a number; got {shorten(beta)}")
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"{_prefix(where)}Invalid beta parameter at index {index}: {beta}")
    for key in _BOOLEAN_OPTIONS:
        if key in group and not isinstance(group[key], bool):
            raise TypeError(f"{_prefix(where)}{key} must be True or False; got {shorten(group[key])}")
    if group["amsgrad"] and not amsgrad_supported:
        raise ValueError(f"{_prefix(where)}FusedAdamW: amsgrad=True is not supported")
    rule = group["low_precision_update"]
    if not isinstance(rule, str) or rule not in RULES:
        raise ValueError(
            f"{_prefix(where)}low_precision_update must be nearest, kahan or stochastic_rounding; "
            f"got {shorten(rule)}"
        )
    seed = group["stochastic_rounding_seed"]
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(
            f"{_prefix(where)}stochastic_rounding_seed must be an integer; got {shorten(seed)}")
    if not 0 <= seed < (1 << 64):
        raise ValueError(
            f"{_prefix(where)}stochastic_rounding_seed must be an integer in [0, 2**64); "
            f"got {shorten(seed)}")


def step_value(value, where):
    """A state's ``step`` (a number or a one-element tensor) as a float, or an error unless it
    is a finite, non-negative whole number. Reads a CUDA tensor (a sync)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"{_prefix(where)}step must be one number; got a tensor of shape {list(value.shape)}")
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{_prefix(where)}step must be a real number; got a {value.dtype} tensor")
        value = value.item()
    elif not _is_real(value):
        raise TypeError(f"{_prefix(where)}step must be a number; got {shorten(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not (math.isfinite(number) and number >= 0 and number == math.floor(number)):
        raise ValueError(f"{_prefix(where)}step must be a whole number >= 0; got {shorten(value)}")
    return number


def _bad_values(mask, tensor):
    """"2 of its 12 values (the first, nan, at flat index 5)" for the elements where ``mask``
    holds, as the C++ readers of optimizer.pt word it."""
    flat = mask.reshape(-1)
    count = int(flat.sum().item())
    position = int(flat.nonzero()[0].item())
    value = tensor.reshape(-1)[position].item()
    return f"{count} of its {tensor.numel()} values (the first, {value}, at flat index {position})"


def check_state_tensor(key, value, where, shape=None, values=True):
    """Checks one state tensor: a dense real floating-point tensor (of ``shape`` when given)
    whose values (unless ``values`` is False) are all finite, and >= 0 for a second moment:
    what a finite run writes. Reads every element (a sync on CUDA)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{_prefix(where)}{key} must be a tensor; got {shorten(value)}")
    if value.layout != torch.strided or not value.is_floating_point():
        raise TypeError(
            f"{_prefix(where)}{key} must be a dense floating-point tensor; got {value.dtype} "
            f"({value.layout})")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise ValueError(
            f"{_prefix(where)}{key} has shape {list(value.shape)} but the parameter has "
            f"{list(shape)}")
    if not values:
        return
    bad = ~torch.isfinite(value)
    if bool(bad.any()):
        raise ValueError(
            f"{_prefix(where)}{key} is not finite in {_bad_values(bad, value)}; no finite run "
            "writes that")
    if key in _SECOND_MOMENTS:
        bad = value < 0
        if bool(bad.any()):
            raise ValueError(
                f"{_prefix(where)}{key} is negative in {_bad_values(bad, value)}; a second moment "
                "is >= 0")


def check_regular_file(path, what, for_writing=False):
    """Refuses at once, without opening it, a path that is not a regular file (symbolic links
    followed): a FIFO, a device, a socket or a directory would block a reader or a writer, or
    never end. A missing path is an error for reading and fine for writing."""
    verb = "write" if for_writing else "read"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if for_writing:
            return
        raise FileNotFoundError(
            errno.ENOENT, f"{what}: cannot read '{shorten_path(path)}': no such file") from None
    except OSError as e:  # a name too long, a loop of links, a folder that may not be read
        raise OSError(e.errno, f"{what}: cannot {verb} '{shorten_path(path)}': {e.strerror}") \
            from None
    if not stat.S_ISREG(info.st_mode):
        kind = ("a directory" if stat.S_ISDIR(info.st_mode)
                else "a FIFO" if stat.S_ISFIFO(info.st_mode)
                else "a socket" if stat.S_ISSOCK(info.st_mode)
                else "a character device" if stat.S_ISCHR(info.st_mode)
                else "a block device" if stat.S_ISBLK(info.st_mode)
                else "not a regular file")
        raise ValueError(
            f"{what}: cannot {verb} '{shorten_path(path)}': "
            f"it is {kind}, not a regular file")
