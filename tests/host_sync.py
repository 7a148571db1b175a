"""A CPU stand-in for CUDA's sync detector: fails on every operation that would make the host
wait for the device, so "no host synchronisation in the step" is tested without a GPU."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


class HostSyncGuard(TorchDispatchMode):
    """Fails on every operation that would need a device value on the host.

    On CUDA these block the CPU until the GPU catches up: reading a value (`.item()`,
    `bool()`, `float()`: aten._local_scalar_dense), data-dependent shapes (nonzero,
    masked_select, boolean-mask indexing, bincount, which reads its largest index) and tensors
    built from Python data inside the step (aten.lift_fresh: a host-to-device copy). `.cpu()`,
    `.numpy()` and `.tolist()` do not dispatch on a CPU tensor, so they are patched separately
    (see `no_host_sync`).

    `host_tensors` live on the host on CUDA too (e.g. sequence lengths, transfer.HOST_KEYS):
    operations whose tensor arguments are all such tensors, and their results, are host work
    and allowed. So are the outputs that CUDA kernels return on the host (`HOST_OUTPUTS`:
    the batch sizes of a packed sequence, which the LSTM reads).
    """

    HOST_OUTPUTS = {torch.ops.aten._pack_padded_sequence.default: 1}

    FORBIDDEN = (
        torch.ops.aten._local_scalar_dense.default,
        torch.ops.aten.bincount.default,
        torch.ops.aten.nonzero.default,
        torch.ops.aten.masked_select.default,
        torch.ops.aten.lift_fresh.default,
    )

    def __init__(self, host_tensors: tuple[torch.Tensor, ...] = ()) -> None:
        super().__init__()
        self.host_tensors = list(host_tensors)

    def on_host(self, tensors: list[torch.Tensor]) -> bool:
        return bool(tensors) and all(any(t is h for h in self.host_tensors) for t in tensors)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        result = func(*args, **kwargs)
        if func in self.HOST_OUTPUTS:
            self.host_tensors.append(result[self.HOST_OUTPUTS[func]])
        if self.on_host(inputs):
            self.host_tensors += [
                t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)
            ]
            return result
        boolean_index = func is torch.ops.aten.index.Tensor and any(
            index is not None and index.dtype == torch.bool for index in args[1]
        )
        if func in self.FORBIDDEN or boolean_index:
            raise AssertionError(f"host synchronisation: {func}")
        return result


@contextlib.contextmanager
def no_host_sync(monkeypatch: pytest.MonkeyPatch, host_tensors: tuple[torch.Tensor, ...] = ()):
    def refuse(self: torch.Tensor, *args: object, **kwargs: object) -> None:
        raise AssertionError("host synchronisation: tensor copied to the host")

    with monkeypatch.context() as patch:
        for name in ("cpu", "numpy", "tolist"):
            patch.setattr(torch.Tensor, name, refuse)
        with HostSyncGuard(host_tensors):
            yield
