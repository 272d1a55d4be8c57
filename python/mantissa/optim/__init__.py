"""Optimizers on mantissa's C++ kernels."""

from mantissa.optim.fused_adamw import FusedAdamW

__all__ = ["FusedAdamW"]
