"""A training state as its structure and its tensors' bytes, apart, as torch.save keeps them.

`split` pickles a state (nested dicts, lists, tensors, numbers, namedtuples...) with each tensor's data
left out: a tensor is its storage's place in a list, its dtype, offset, size and stride. The pickled
structure is small, and the storages can be copied where they must go (pod memory, another pod) without
pickling their bytes. `join` puts a structure and storages back together. One storage under two names (a
tensor and its view, shared weights) is one storage in the list, and shared again after `join`.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Split:
    structure: bytes  # the pickled state, each plain tensor a reference to its storage's place in `storages`
    storages: list[Any]  # torch.UntypedStorage, in index order

    @property
    def nbytes(self) -> int:
        return sum(storage.nbytes() for storage in self.storages)


_joining = threading.local()  # the storages of the structure being unpickled (join)


def _tensor(at: int, dtype: str, offset: int, size: tuple[int, ...], stride: tuple[int, ...], requires_grad: bool,
            parameter: bool) -> Any:
    import torch

    tensor = torch.empty(0, dtype=getattr(torch, dtype)).set_(_joining.storages[at], offset, size, stride)
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def split(value: Any) -> Split:
    """Tensors of any other kind (sparse, quantized, subclasses) keep torch's own pickling, bytes and all."""
    import torch

    storages: list[Any] = []
    index: dict[int, int] = {}  # storage's C pointer -> its place in `storages`
    plain = (torch.Tensor, torch.nn.Parameter)

    class LeavingStoragesOut(pickle.Pickler):
        # reducer_override, not persistent_id: pickle calls it for tensors and other objects of classes, not
        # for the dicts, lists, strings and numbers that make up most of a state dict.
        def reducer_override(self, obj: Any) -> Any:
            if (type(obj) not in plain or obj.layout != torch.strided or obj.is_quantized
                    or obj.device.type == "meta" or obj.is_conj() or obj.is_neg()):
                return NotImplemented
            storage = obj.untyped_storage()
            at = index.setdefault(storage._cdata, len(storages))
            if at == len(storages):
                storages.append(storage)
            return _tensor, (at, str(obj.dtype).removeprefix("torch."), obj.storage_offset(), tuple(obj.size()),
                             obj.stride(), obj.requires_grad, type(obj) is torch.nn.Parameter)

    buffer = io.BytesIO()
    LeavingStoragesOut(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return Split(buffer.getvalue(), storages)


def join(structure: bytes, storages: Sequence[Any]) -> Any:
    """The state `split` made `structure` of, with `storages` (CPU UntypedStorages) in its tensors."""
    _joining.storages = storages
    try:
        return pickle.loads(structure)
    finally:
        del _joining.storages


def cpu_copy(storage: Any) -> Any:
    import torch

    if storage.device.type == "meta":
        return storage  # no data to copy
    return torch.UntypedStorage(storage.nbytes()).copy_(storage)


def copied_to_cpu(value: Any) -> Any:
    """A copy of `value` with every tensor's data copied to CPU, so training may go on mutating it, that
    loads back as a synchronous save of `value` would: container types (namedtuples, defaultdicts, state
    dicts with their `_metadata`), Parameters and requires_grad are kept, and shared storages stay shared."""
    parts = split(value)
    return join(parts.structure, [cpu_copy(storage) for storage in parts.storages])
