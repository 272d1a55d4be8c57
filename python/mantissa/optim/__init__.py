"""Optimizers on mantissa's C++ kernels, and the C++ optimizer's checkpoint file."""

from mantissa.optim.archive import load_optimizer_pt, save_optimizer_pt
from mantissa.optim.archive_families import load_adafactor_pt, load_adamw_8bit_pt, load_muon_pt
from mantissa.optim.fused_adamw import FusedAdamW

__all__ = ["FusedAdamW", "load_adafactor_pt", "load_adamw_8bit_pt", "load_muon_pt",
           "load_optimizer_pt", "save_optimizer_pt"]
