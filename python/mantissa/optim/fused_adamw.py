"""``mantissa.optim.FusedAdamW``: AdamW in one pass per tensor on mantissa's C++ kernels."""

import copy
from collections import defaultdict

import torch

from mantissa.optim import _checks

_LOW_PRECISION = (torch.bfloat16, torch.float16)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _signed64(seed):
    """The seed's 64 bits as the signed integer a schema ``int`` carries."""
    return seed - (1 << 64) if seed >= (1 << 63) else seed


class FusedAdamW(torch.optim.Optimizer):
    """AdamW whose whole update (unscale, skip on inf/nan, decoupled weight decay, the Adam
    step, the cast back to a bf16/fp16 model) runs as one pass per tensor in mantissa's C++
    kernels (``torch.ops.mantissa.fused_adamw_``), on the CPU and on CUDA.

    On fp32 parameters it computes what ``torch.optim.AdamW`` computes. On bf16/fp16 parameters
    the arithmetic is fp32 and the result is written one of two ways:

    - ``master_weights=True``: the optimizer state keeps an fp32 copy of each bf16/fp16
      parameter (``state["master_param"]``, plus fp32 moments); the update runs on the copy and
      the parameter receives it rounded to nearest, in the same pass. 16 bytes of state per
      parameter, plus the parameter itself.
    - ``master_weights=False``: the parameter is updated in its own dtype, with moments in that
      dtype (``fp32_moments=True`` keeps them in fp32), rounded by ``low_precision_update``:
      ``"nearest"``, ``"kahan"`` (a compensation buffer ``state["kahan_comp"]`` of the
      parameter's dtype keeps what rounding lost) or ``"stochastic_rounding"`` (random rounding
      keyed by ``stochastic_rounding_seed``, the step and the parameter's index, so a run is
      reproducible and matches the C++ optimizer bit for bit). With Kahan, a bf16 parameter
      costs 2 + 2 + 2 + 2 (+ 2 for the gradient) = 10 bytes instead of 20 with masters.

    Under ``torch.amp.GradScaler`` it takes the scale and the found-inf flag as tensors
    (``_step_supports_amp_scaling``): ``scaler.step(opt)`` calls ``step()`` without unscaling
    the gradients first, the kernel divides by the scale, and a step with inf/nan leaves
    parameters, moments, masters and step counts unchanged, without the host reading the flag
    on CUDA.

    The state uses the names of mantissa's C++ ``FusedAdamW`` (``step``, ``exp_avg``,
    ``exp_avg_sq``, ``kahan_comp``; group options ``lr``, ``betas``, ``eps``, ``weight_decay``,
    ``amsgrad``, ``maximize``, ``low_precision_update``, ``stochastic_rounding_seed``,
    ``fp32_moments``), so :func:`mantissa.optim.load_optimizer_pt` and
    :func:`mantissa.optim.save_optimizer_pt` move it to and from the Trainer's optimizer.pt.

    ``amsgrad`` is not supported. Sparse gradients are refused.
    """

    def __init__(
        self,
        params,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=1e-2,
        master_weights=False,
        low_precision_update="nearest",
        *,
        maximize=False,
        stochastic_rounding_seed=0,
        fp32_moments=False,
    ):
        if isinstance(lr, torch.Tensor):
            raise ValueError("FusedAdamW: lr must be a float, not a tensor")
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=False,
            maximize=maximize,
            master_weights=master_weights,
            low_precision_update=low_precision_update,
            stochastic_rounding_seed=stochastic_rounding_seed,
            fp32_moments=fp32_moments,
        )
        self._check_options(defaults, "FusedAdamW")
        super().__init__(params, defaults)
        # GradScaler.step() then sets self.grad_scale and self.found_inf and calls step()
        # without unscaling, as it does for torch.optim.AdamW(fused=True).
        self._step_supports_amp_scaling = True

    @staticmethod
    def _check_options(group, where):
        """A ValueError or TypeError naming ``where``, the option and its value unless every
        option of ``group`` is one a step can run with (finite, in range, of its type)."""
        _checks.check_options(group, where)

    @staticmethod
    def _param_tensors(params, where):
        """A group's ``params`` as PyTorch's ``add_param_group`` takes them (a tensor, or an
        ordered collection of tensors or of (name, tensor) pairs) as a list, each tensor
        checked."""
        if isinstance(params, torch.Tensor):
            params = [params]
        if isinstance(params, set):
            raise TypeError(f"{where}: params must be an ordered collection, not a set")
        try:
            params = list(params)
        except TypeError:
            raise TypeError(
                f"{where}: params must be a tensor or a list of tensors; got "
                f"{_checks.shorten(params)}") from None
        for i, p in enumerate(params):
            if isinstance(p, tuple) and len(p) == 2:
                p = p[1]
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"{where}: parameter {i} is not a tensor: {_checks.shorten(p)}")
            if p.dtype not in _DTYPES:
                raise ValueError(
                    "FusedAdamW supports float32, bfloat16, float16 and float64 parameters; "
                    f"parameter {i} of {where} is {p.dtype}"
                )
        return params

    def add_param_group(self, param_group):
        """``Optimizer.add_param_group``, but every option and parameter is checked before
        the group is added: a rejected group leaves the optimizer as it was."""
        where = f"param group {len(self.param_groups)}"
        if not isinstance(param_group, dict):
            raise TypeError(f"{where} must be a dict; got {_checks.shorten(param_group)}")
        if "params" not in param_group:
            raise ValueError(f"{where} has no 'params'")
        params = self._param_tensors(param_group["params"], where)
        candidate = dict(self.defaults)
        candidate.update(param_group)
        self._check_options(candidate, where)
        # A generator is consumed once: the base class gets the list.
        param_group["params"] = params
        super().add_param_group(param_group)

    @staticmethod
    def _has_master(group, p):
        return group["master_weights"] and p.dtype in _LOW_PRECISION

    @staticmethod
    def _moment_dtype(group, p):
        if FusedAdamW._has_master(group, p):
            return torch.float32
        if group["fp32_moments"] and p.dtype in _LOW_PRECISION:
            return torch.float32
        return p.dtype

    @staticmethod
    def _uses_kahan(group, p):
        return (
            group["low_precision_update"] == "kahan"
            and p.dtype in _LOW_PRECISION
            and not FusedAdamW._has_master(group, p)
        )

    def _init_state(self, group, p, state):
        """Fills what a step needs and the state lacks (a fresh parameter, or one loaded from a
        file saved without a master or a compensation buffer)."""
        if "step" not in state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
        if self._has_master(group, p) and "master_param" not in state:
            state["master_param"] = p.detach().to(torch.float32, copy=True)
        moments = dict(dtype=self._moment_dtype(group, p), memory_format=torch.preserve_format)
        for key in ("exp_avg", "exp_avg_sq"):
            if key not in state:
                state[key] = torch.zeros_like(p, **moments)
        if self._uses_kahan(group, p) and "kahan_comp" not in state:
            state["kahan_comp"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW update of every parameter with a gradient. Python's ``optimizer.step()``.
        Never syncs on CUDA; on the CPU, a found-inf flag is read from memory."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        if found_inf is not None:
            found_inf = found_inf.reshape(())
        if grad_scale is not None:
            grad_scale = grad_scale.reshape(())
        # An option set by hand or by a scheduler (lr NaN) is refused before anything is written.
        for g, group in enumerate(self.param_groups):
            self._check_options(group, f"param group {g}")
        index = 0  # over all groups: stochastic rounding's key, numbered as in C++
        for group in self.param_groups:
            calls = {}
            for p in group["params"]:
                position = index
                index += 1
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("FusedAdamW does not support sparse gradients")
                state = self.state[p]
                self._init_state(group, p, state)
                # One call per kind: the op takes masters and Kahan buffers for all or none.
                kind = (p.device, self._has_master(group, p), self._uses_kahan(group, p))
                lists = calls.setdefault(kind, ([], [], [], [], [], [], [], []))
                lists[0].append(p)
                lists[1].append(p.grad)
                lists[2].append(state["exp_avg"])
                lists[3].append(state["exp_avg_sq"])
                lists[4].append(state["step"])
                if kind[1]:
                    lists[5].append(state["master_param"])
                if kind[2]:
                    lists[6].append(state["kahan_comp"])
                lists[7].append(position)
            beta1, beta2 = group["betas"]
            for lists in calls.values():
                torch.ops.mantissa.fused_adamw_(
                    *lists,
                    lr=float(group["lr"]),
                    beta1=float(beta1),
                    beta2=float(beta2),
                    weight_decay=float(group["weight_decay"]),
                    eps=float(group["eps"]),
                    maximize=bool(group["maximize"]),
                    low_precision_update=group["low_precision_update"],
                    seed=_signed64(group["stochastic_rounding_seed"]),
                    grad_scale=grad_scale,
                    found_inf=found_inf,
                )
        return loss

    @torch._disable_dynamo
    def load_state_dict(self, state_dict):
        """Python's ``Optimizer.load_state_dict``, but each tensor keeps the dtype this
        optimizer stores it in (the base class would cast fp32 masters and moments to a bf16
        parameter's dtype): ``step`` fp32, ``master_param`` fp32, moments as in a fresh state,
        ``kahan_comp`` in the parameter's dtype; all on the parameter's device. Also accepts
        what :func:`mantissa.optim.load_optimizer_pt` returns.

        Everything is checked before anything changes, and a state no finite run writes is
        refused with a ValueError (or a TypeError for a value of the wrong kind) naming the
        key, the parameter and the value: options out of range, a NaN/inf moment, master or
        Kahan buffer, a negative second moment, a negative or fractional step, a tensor of
        another shape than its parameter. A rejected call leaves the optimizer as it was.
        Reads every tensor (a sync on CUDA)."""
        if not isinstance(state_dict, dict):
            raise TypeError(
                f"FusedAdamW.load_state_dict: state_dict must be a dict; got "
                f"{_checks.shorten(state_dict)}")
        state_dict = state_dict.copy()
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        groups, state = self._checked_state(state_dict)
        self.__setstate__({"state": state, "param_groups": groups})
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def _checked_state(self, state_dict):
        """The param_groups and state ``load_state_dict`` installs, built and checked without
        touching the optimizer: what PyTorch's ``Optimizer.load_state_dict`` computes, plus the
        checks."""
        where = "FusedAdamW.load_state_dict"
        for key in ("state", "param_groups"):
            if key not in state_dict:
                raise ValueError(f"{where}: state_dict has no '{key}'")
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if not isinstance(saved_groups, (list, tuple)):
            raise TypeError(f"{where}: state_dict['param_groups'] must be a list; got "
                            f"{_checks.shorten(saved_groups)}")
        if not isinstance(saved_state, dict):
            raise TypeError(f"{where}: state_dict['state'] must be a dict; got "
                            f"{_checks.shorten(saved_state)}")
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"{where}: state_dict has {len(saved_groups)} parameter groups, this optimizer "
                f"{len(self.param_groups)}")
        groups, id_map = [], {}
        for g, (group, saved) in enumerate(zip(self.param_groups, saved_groups)):
            at = f"{where}: state_dict['param_groups'][{g}]"
            if not isinstance(saved, dict) or "params" not in saved:
                raise ValueError(f"{at} must be a dict with 'params'")
            saved_ids = saved["params"]
            if not isinstance(saved_ids, (list, tuple)):
                raise TypeError(f"{at}['params'] must be a list; got {_checks.shorten(saved_ids)}")
            if len(saved_ids) != len(group["params"]):
                raise ValueError(
                    f"{at} has {len(saved_ids)} parameters, this optimizer's group "
                    f"{len(group['params'])}")
            for j, (param_id, p) in enumerate(zip(saved_ids, group["params"])):
                try:
                    duplicate = param_id in id_map
                except TypeError:
                    raise TypeError(f"{at}['params'][{j}] is not a parameter id: "
                                    f"{_checks.shorten(param_id)}") from None
                if duplicate:
                    raise ValueError(f"{at}['params'][{j}] lists parameter "
                                     f"{_checks.shorten(param_id)} again")
                id_map[param_id] = (len(id_map), g, p)
            new_group = copy.deepcopy({k: v for k, v in saved.items() if k != "params"})
            new_group["params"] = group["params"]
            if "param_names" in group and "param_names" not in new_group:
                new_group["param_names"] = group["param_names"]
            for key, value in self.defaults.items():
                new_group.setdefault(key, value)
            self._check_options(new_group, at)
            groups.append(new_group)
        state = defaultdict(dict)
        for param_id, values in saved_state.items():
            try:
                entry = id_map.get(param_id)
            except TypeError:
                entry = None
            if entry is None:
                raise ValueError(f"{where}: state_dict['state'] has an entry for parameter "
                                 f"{_checks.shorten(param_id)}, which no group lists")
            index, g, p = entry
            at = f"{where}: the state of parameter {index}"
            if not isinstance(values, dict):
                raise TypeError(f"{at} must be a dict; got {_checks.shorten(values)}")
            state[p] = self._checked_param_state(groups[g], p, values, at)
        return groups, state

    def _checked_param_state(self, group, p, values, where):
        """One parameter's state, each tensor a copy in the dtype this optimizer stores it in,
        on the parameter's device, checked after the cast (a value that overflows the
        parameter's dtype is refused)."""
        state = {}
        for key, value in values.items():
            if key == "step":
                state[key] = torch.tensor(_checks.step_value(value, where), dtype=torch.float32,
                                          device=p.device)
                continue
            if not isinstance(value, torch.Tensor):
                state[key] = copy.deepcopy(value)
                continue
            if key == "master_param":
                dtype = torch.float32
            elif key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq"):
                dtype = self._moment_dtype(group, p)
            else:
                dtype = p.dtype
            if key in _checks.STATE_TENSORS:
                # The kind and shape before the cast (a complex or int tensor would cast), the
                # values after it (a value beyond the range of a bf16 moment becomes inf).
                _checks.check_state_tensor(key, value, where, p.shape, values=False)
            value = value.to(device=p.device, dtype=dtype, copy=True)
            if key in _checks.STATE_TENSORS:
                _checks.check_state_tensor(key, value, where)
            state[key] = value
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        # A state saved by the C++ optimizer (or an older one) lacks the Python-only options:
        # they keep this optimizer's defaults.
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)
