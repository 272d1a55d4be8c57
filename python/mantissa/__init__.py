"""mantissa for Python: the fused master-weight AdamW of the C++ library, as a PyTorch custom
operator (``torch.ops.mantissa.fused_adamw_``) and a ``torch.optim.Optimizer``
(``mantissa.optim.FusedAdamW``).

Importing the package loads ``libmantissa_ops.so`` (see ``mantissa._ops.library_path``).
"""

from mantissa import _ops
from mantissa import optim

__all__ = ["optim", "library_path"]
__version__ = "0.1.0"

library_path = _ops.library_path
