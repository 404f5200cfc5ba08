"""In-place recovery for PyTorch (:mod:`sgd.elastic` with a model and an optimizer).

::

    from sgd_torch import elastic, prepare_model

    def train_func(config):
        model = prepare_model(Net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = elastic.TorchState(model=model, optimizer=opt, step=0)

        @elastic.run
        def train(state):
            while state.step < config["steps"]:
                loss = state.model(next_batch()).mean()   # state.model: the live (re-wrapped) model
                state.optimizer.zero_grad(); loss.backward(); state.optimizer.step()
                state.step += 1
                state.commit()                             # in memory, cheap; no disk
                sgd.report({"step": state.step})
        return train(state)

    sgd.Trainer(backend="torch", num_workers=(2, 4)).run(train_func)

After a reset, ``state.model`` is wrapped again for the new process group (a
``DistributedDataParallel`` built on the old group cannot be used: use ``state.model``, not a
variable that still holds the old wrapper); ``state.optimizer`` is the same object, its state
restored. The model's parameters stay the same tensors throughout, so an optimizer or a
learning-rate scheduler built on them keeps working.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, Optional

import torch

from sgd.elastic import ObjectState, State, run

__all__ = ["ObjectState", "State", "TorchState", "run"]


class TorchState(State):
    """A model, an optimizer, and any other values (as attributes), kept in memory at each
    :meth:`commit` and restored after a reset.

    :param model: the model, as ``prepare_model`` returned it (a ``DistributedDataParallel``
        when the group has more than one worker), or ``None``.
    :param optimizer: its optimizer, or ``None``.
    :param values: other state (``epoch=0``, ``step=0``...), kept as deep copies.

    A commit copies the model's and optimizer's tensors into buffers kept from the last
    commit (no allocation after the first), on the host: about one memory copy of the model
    and optimizer state (see ``docs/elastic.md`` for what it costs).
    """

    def __init__(self, model: Optional[torch.nn.Module] = None, optimizer: Optional[torch.optim.Optimizer] = None,
                 **values: Any) -> None:
        super().__init__()
        self.model = model
        self.optimizer = optimizer
        self._values = ObjectState(**values)
        self._buffers: Dict[str, torch.Tensor] = {}
        self._ddp_kwargs: Optional[Dict[str, Any]] = None

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values")
        if values is not None and name in values.value_names():
            return getattr(values, name)
        raise AttributeError(f"{type(self).__name__} has no value {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        values = self.__dict__.get("_values")
        if values is not None and name in values.value_names():
            setattr(values, name, value)
        else:
            super().__setattr__(name, value)

    # --- snapshots ----------------------------------------------------------------------------

    def save(self) -> Dict[str, Any]:
        snapshot: Dict[str, Any] = {"values": self._values.save()}
        if self.model is not None:
            snapshot["model"] = self._copy("model", _unwrap(self.model).state_dict())
        if self.optimizer is not None:
            snapshot["optimizer"] = self._copy("optimizer", self.optimizer.state_dict())
        return snapshot

    def load(self, snapshot: Dict[str, Any]) -> None:
        self._values.load(snapshot["values"])
        if self.model is not None and "model" in snapshot:
            _unwrap(self.model).load_state_dict(snapshot["model"])  # copies into the live parameters
        if self.optimizer is not None and "optimizer" in snapshot:
            # A copy: the optimizer keeps the tensors it is given (on their device already), and
            # the next commit writes into these buffers.
            self.optimizer.load_state_dict(copy.deepcopy(snapshot["optimizer"]))

    def _copy(self, path: str, value: Any) -> Any:
        """``value`` with every tensor copied to the host, into the buffer of the last commit
        at the same place when it has the same shape and type."""
        if isinstance(value, torch.Tensor):
            buf = self._buffers.get(path)
            src = value.detach()
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                buf = torch.empty(src.shape, dtype=src.dtype, device="cpu")
                self._buffers[path] = buf
            buf.copy_(src)
            return buf
        if isinstance(value, dict):
            return {k: self._copy(f"{path}/{k}", v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._copy(f"{path}/{i}", v) for i, v in enumerate(value))
        return copy.deepcopy(value)

    def _peer_snapshot(self) -> Any:
        return self._saved

    # --- the group changes ----------------------------------------------------------------------

    def _before_reset(self) -> None:
        model = self.model
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            self._ddp_kwargs = dict(getattr(model, "_sgd_ddp_kwargs", {}))
            self.model = model.module
        elif model is not None and hasattr(model, "_sgd_ddp_kwargs"):
            self._ddp_kwargs = dict(model._sgd_ddp_kwargs)  # type: ignore[arg-type]

    def _after_reset(self) -> None:
        import torch.distributed as dist

        if self.model is None or self._ddp_kwargs is None or not dist.is_initialized():
            return
        if dist.get_world_size() > 1:
            # Built on the new process group (its constructor broadcasts rank 0's parameters,
            # which the restore then overwrites with the commit).
            wrapped = torch.nn.parallel.DistributedDataParallel(self.model, **self._ddp_kwargs)
            setattr(wrapped, "_sgd_ddp_kwargs", dict(self._ddp_kwargs))  # noqa: B010
            self.model = wrapped
        else:
            setattr(self.model, "_sgd_ddp_kwargs", dict(self._ddp_kwargs))  # noqa: B010


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model
