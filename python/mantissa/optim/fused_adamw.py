"""``mantissa.optim.FusedAdamW``: AdamW in one pass per tensor on mantissa's C++ kernels."""

import torch

_LOW_PRECISION = (torch.bfloat16, torch.float16)
_RULES = ("nearest", "kahan", "stochastic_rounding")
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
        self._check_options(defaults)
        super().__init__(params, defaults)
        # GradScaler.step() then sets self.grad_scale and self.found_inf and calls step()
        # without unscaling, as it does for torch.optim.AdamW(fused=True).
        self._step_supports_amp_scaling = True

    @staticmethod
    def _check_options(group):
        if not 0.0 <= group["lr"]:
            raise ValueError(f"Invalid learning rate: {group['lr']}")
        if not 0.0 <= group["eps"]:
            raise ValueError(f"Invalid epsilon value: {group['eps']}")
        beta1, beta2 = group["betas"]
        if not 0.0 <= beta1 < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {beta1}")
        if not 0.0 <= beta2 < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {beta2}")
        if not 0.0 <= group["weight_decay"]:
            raise ValueError(f"Invalid weight_decay value: {group['weight_decay']}")
        if group.get("amsgrad", False):
            raise ValueError("FusedAdamW: amsgrad=True is not supported")
        if group["low_precision_update"] not in _RULES:
            raise ValueError(
                "low_precision_update must be nearest, kahan or stochastic_rounding; got "
                f"{group['low_precision_update']!r}"
            )
        seed = group["stochastic_rounding_seed"]
        if not (isinstance(seed, int) and 0 <= seed < (1 << 64)):
            raise ValueError(f"stochastic_rounding_seed must be an integer in [0, 2**64); got {seed!r}")

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        self._check_options(group)
        for i, p in enumerate(group["params"]):
            if p.dtype not in _DTYPES:
                raise ValueError(
                    "FusedAdamW supports float32, bfloat16, float16 and float64 parameters; "
                    f"parameter {i} of group {len(self.param_groups) - 1} is {p.dtype}"
                )

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

    def load_state_dict(self, state_dict):
        """Python's ``Optimizer.load_state_dict``, but each tensor keeps the dtype this
        optimizer stores it in (the base class would cast fp32 masters and moments to a bf16
        parameter's dtype): ``step`` fp32, ``master_param`` fp32, moments as in a fresh state,
        ``kahan_comp`` in the parameter's dtype; all on the parameter's device. Also accepts
        what :func:`mantissa.optim.load_optimizer_pt` returns."""
        saved = {
            param_id: dict(values) for param_id, values in state_dict["state"].items()
        }
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            self._check_options(group)
        params = [(g, p) for g in self.param_groups for p in g["params"]]
        for param_id, (group, p) in zip(saved_ids, params):
            values = saved.get(param_id)
            if values is None:
                continue
            state = self.state[p]
            for key, value in values.items():
                if not isinstance(value, torch.Tensor):
                    if key == "step":
                        value = torch.tensor(float(value))
                    else:
                        continue
                if key == "step":
                    dtype = torch.float32
                    value = value.reshape(())
                elif key == "master_param":
                    dtype = torch.float32
                elif key in ("exp_avg", "exp_avg_sq"):
                    dtype = self._moment_dtype(group, p)
                else:
                    dtype = p.dtype
                state[key] = value.to(device=p.device, dtype=dtype, copy=True)

    def __setstate__(self, state):
        super().__setstate__(state)
        # A state saved by the C++ optimizer (or an older one) lacks the Python-only options:
        # they keep this optimizer's defaults.
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)
