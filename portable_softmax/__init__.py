"""portable_softmax: torch.softmax and torch.log_softmax from one Triton kernel source, for NVIDIA
(CUDA), AMD (ROCm) and Huawei Ascend (NPU); CPU tensors run the same source through Triton's
interpreter.

    >>> import torch, portable_softmax
    >>> portable_softmax.softmax(torch.randn(3, 5), dim=-1).sum(-1)
"""
# First: one ImportError naming the versions found and needed where Python, torch or Triton is
# missing or too old, rather than a failure somewhere deeper.
from portable_softmax import compat  # noqa: F401
from portable_softmax import vendors  # noqa: F401  (registers the built-in backends)
from portable_softmax.backend import Backend, get_backend, register_backend, registered_backends
from portable_softmax.device import device_info
from portable_softmax.op_arguments import DimensionError
from portable_softmax.ops import log_softmax, softmax
from portable_softmax import torch_ops  # noqa: F401,E402  (registers the custom operators for torch.compile)
from portable_softmax import distributed  # noqa: F401,E402  (sharded dimensions; routes DTensors to it)
from portable_softmax import fused  # noqa: F401,E402  (scale, mask, causal; ops routes those calls to it)
from portable_softmax.enable import Served, disable, enable, enabled  # whole models: torch's softmax served
from portable_softmax.loss import cross_entropy, logsumexp  # noqa: E402
from portable_softmax.head import linear_cross_entropy  # noqa: E402
from portable_softmax import nn  # noqa: F401,E402  (CrossEntropyLoss, Softmax, LogSoftmax)
from portable_softmax.plan_grid import LaunchPlan
from portable_softmax.targets import plan_launch
from portable_softmax.record import DeviceRecord, KernelResources

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "DeviceRecord",
    "DimensionError",
    "KernelResources",
    "LaunchPlan",
    "Served",
    "cross_entropy",
    "device_info",
    "disable",
    "enable",
    "enabled",
    "get_backend",
    "linear_cross_entropy",
    "log_softmax",
    "logsumexp",
    "nn",
    "plan_launch",
    "register_backend",
    "registered_backends",
    "softmax",
]
