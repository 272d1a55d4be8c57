"""Loads libmantissa_ops.so, which registers ``torch.ops.mantissa``, and registers the fake
(meta) kernels that let ``torch.compile`` trace through the ops."""

import os
import pathlib

import torch

_LIBRARY_NAME = "libmantissa_ops.so"


def _candidates():
    # 1. An explicit path. 2. The copy a non-editable install carries in mantissa/lib.
    # 3. An editable install (pip install -e python/) in a checkout built with
    #    `cmake --preset default`: the build tree next to python/.
    explicit = os.environ.get("MANTISSA_OPS_LIBRARY")
    if explicit:
        yield pathlib.Path(explicit)
        return
    here = pathlib.Path(__file__).resolve().parent
    yield here / "lib" / _LIBRARY_NAME
    yield here.parent.parent / "build" / _LIBRARY_NAME


def _load():
    tried = []
    for candidate in _candidates():
        tried.append(str(candidate))
        if candidate.is_file():
            torch.ops.load_library(str(candidate))
            return str(candidate)
    raise ImportError(
        "mantissa: cannot find "
        + _LIBRARY_NAME
        + " (looked at: "
        + ", ".join(tried)
        + "). Build it with `cmake --build --preset default --target mantissa_ops`, or set "
        "MANTISSA_OPS_LIBRARY to its path."
    )


library_path = _load()


@torch.library.register_fake("mantissa::fused_adamw_")
def _fused_adamw_fake(
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    state_steps,
    master_params,
    kahan_comps,
    param_indices,
    *,
    lr,
    beta1,
    beta2,
    weight_decay,
    eps,
    maximize=False,
    low_precision_update="nearest",
    seed=0,
    grad_scale=None,
    found_inf=None,
):
    # Every output is an argument updated in place: nothing to allocate, nothing to return.
    return None
