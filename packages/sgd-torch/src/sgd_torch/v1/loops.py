"""The train and validate loops of Ray SGD v1's ``TrainingOperator``.

``train_epoch`` calls ``train_batch`` per batch and steps the schedulers; ``validate`` calls
``validate_batch`` per batch without gradients; the batch methods run under the operator's
mixed precision (``autocast``, ``backward``, ``step_optimizer``). ``run_train_epoch`` and
``run_validation`` are one ``train()`` / ``validate()`` of the v1 trainer on one worker. Any of
them may be overridden. A base of :class:`sgd_torch.v1.TrainingOperator`.
"""

from __future__ import annotations

import time
from typing import Any, ContextManager, Dict, Iterable, Optional

import torch

from sgd_torch.loaders import to_device
from sgd_torch.v1.data import Batches, batch_size
from sgd_torch.v1.metrics import NUM_SAMPLES, Meters
from sgd_torch.v1.registration import _Registration


class _Loops(_Registration):
    """Mixed precision, the epoch and batch loops, and the passes the v1 trainer runs."""

    #: Batches trained so far (all epochs); set by TrainingOperator.__init__.
    global_step: int

    # --- mixed precision --------------------------------------------------------------------

    @property
    def scaler(self) -> Optional[torch.amp.GradScaler]:
        """The ``GradScaler`` with ``use_fp16`` on a GPU, else ``None``."""
        return self._amp.scaler

    def autocast(self) -> ContextManager[Any]:
        """Context for forward passes: ``torch.autocast`` with ``use_fp16``, else nothing."""
        return self._amp.autocast()

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled with ``use_fp16`` on a GPU."""
        self._amp.backward(loss)

    def step_optimizer(self, optimizer: Any, update_scale: bool = True) -> None:
        """``optimizer.step()`` through the gradient scaler when there is one.

        :param update_scale: update the loss scale after the step; when several optimizers
            step after one shared backward pass, pass ``False`` to all but the last.
        """
        self._amp.step(optimizer, update=update_scale)

    # --- loops ------------------------------------------------------------------------------

    def _set_mode(self, train: bool) -> None:
        for model in self._models:
            model.train(train)

    def _step_schedulers(self, when: str) -> None:
        if self._scheduler_step_freq == when:
            for scheduler in self._schedulers:
                scheduler.step()

    def train_epoch(self, iterator: Iterable[Any], info: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """One pass over ``iterator``: :meth:`train_batch` per batch, schedulers stepped per
        ``scheduler_step_freq``. Returns the sample-weighted means of the batch metrics, each
        metric's ``last_`` value, ``batch_count`` and ``num_samples``."""
        self._ensure_setup()
        info = dict(info or {})
        meters = Meters()
        self._set_mode(True)
        for batch_idx, batch in enumerate(iterator):
            batch_info = {"batch_idx": batch_idx, "global_step": self.global_step, **info}
            meters.update(self.train_batch(batch, batch_info))
            self._step_schedulers("batch")
            self.global_step += 1
        self._step_schedulers("epoch")
        return meters.summary()

    def _features_and_target(self, batch: Any, method: str) -> Any:
        if not (isinstance(batch, (list, tuple)) and len(batch) == 2):
            raise TypeError(
                f"the default {method} expects (features, target) batches, got {type(batch).__name__}"
                + (f" of length {len(batch)}" if isinstance(batch, (list, tuple)) else "")
                + f"; override {type(self).__name__}.{method}"
            )
        features, target = batch
        return to_device(features, self._device), to_device(target, self._device)

    def _single(self, method: str) -> None:
        self._ensure_setup()
        if len(self._models) != 1 or len(self._optimizers) != 1:
            raise RuntimeError(
                f"the default {method} trains one model with one optimizer; {type(self).__name__} registered "
                f"{len(self._models)} model(s) and {len(self._optimizers)} optimizer(s). Override {method} "
                "(or pass train_function / validation_function to TorchTrainer)."
            )
        if self._criterion is None and "criterion" not in self._overrides:
            raise RuntimeError(
                f"the default {method} needs a loss: pass loss_creator to TorchTrainer or "
                f"register(criterion=...), or override {method}."
            )

    def train_batch(self, batch: Any, batch_info: Dict[str, Any]) -> Dict[str, Any]:
        """Forward, loss, backward and optimizer step on one ``(features, target)`` batch.

        :returns: ``{"train_loss": ..., "num_samples": ...}``.
        """
        self._single("train_batch")
        features, target = self._features_and_target(batch, "train_batch")
        with self.autocast():
            output = self.model(features)
            loss = self.criterion(output, target)
        self.optimizer.zero_grad()
        self.backward(loss)
        self.step_optimizer(self.optimizer)
        return {"train_loss": loss.item(), NUM_SAMPLES: batch_size(features)}

    def validate(self, val_iterator: Iterable[Any], info: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """One pass over ``val_iterator`` without gradients: :meth:`validate_batch` per batch."""
        self._ensure_setup()
        info = dict(info or {})
        meters = Meters()
        self._set_mode(False)
        try:
            with torch.no_grad():
                for batch_idx, batch in enumerate(val_iterator):
                    meters.update(self.validate_batch(batch, {"batch_idx": batch_idx, **info}))
        finally:
            self._set_mode(True)
        return meters.summary()

    def validate_batch(self, batch: Any, batch_info: Dict[str, Any]) -> Dict[str, Any]:
        """Loss on one ``(features, target)`` batch, and accuracy when it is a classification
        (2-D output, integer class targets).

        :returns: ``{"val_loss": ..., "num_samples": ...}`` (+ ``"val_accuracy"``).
        """
        self._single("validate_batch")
        features, target = self._features_and_target(batch, "validate_batch")
        with self.autocast():
            output = self.model(features)
            loss = self.criterion(output, target)
        metrics = {"val_loss": loss.item(), NUM_SAMPLES: batch_size(target)}
        if (
            isinstance(output, torch.Tensor) and isinstance(target, torch.Tensor) and output.dim() == 2
            and output.shape[1] > 1 and target.dim() == 1 and not target.is_floating_point()
        ):
            metrics["val_accuracy"] = (output.argmax(dim=1) == target).float().mean().item()
        return metrics

    # --- what the v1 trainer calls (usable in a v2 train_func too) ---------------------------

    def _base_info(self, num_steps: Optional[int]) -> Dict[str, Any]:
        return {"epoch_idx": self._epoch, "num_steps": num_steps, "use_fp16": self._use_fp16,
                "scheduler_step_freq": self._scheduler_step_freq}

    def run_train_epoch(
        self, num_steps: Optional[int] = None, info: Optional[Dict[str, Any]] = None, profile: bool = False
    ) -> Dict[str, Any]:
        """One ``train()`` of the v1 trainer on this worker: a pass over the registered
        training data (shuffled for this epoch), then the epoch counter goes up.

        :param num_steps: stop after this many batches.
        :param info: extra entries for the ``info`` dict ``train_epoch`` receives.
        :param profile: add ``profile: {"train_epoch_s": ...}``.
        :returns: ``train_epoch``'s metrics and ``epoch`` (passes done, this one included).
        """
        self._ensure_setup()
        if self._train_loader is None:
            raise RuntimeError(
                f"{type(self).__name__} has no training data: return a loader from data_creator or call "
                "self.register_data(train_loader=...) in setup()."
            )
        self._train_loader.set_epoch(self._epoch)
        batches = Batches(self._train_loader, self._device, num_steps)
        start = time.perf_counter()
        stats = dict(self.train_epoch(batches, {**self._base_info(num_steps), **(info or {})}) or {})
        self._epoch += 1
        stats["epoch"] = self._epoch
        if profile:
            stats["profile"] = {"train_epoch_s": time.perf_counter() - start}
        return stats

    @property
    def has_validation_data(self) -> bool:
        return self.validation_loader is not None

    def run_validation(
        self, num_steps: Optional[int] = None, info: Optional[Dict[str, Any]] = None, profile: bool = False
    ) -> Dict[str, Any]:
        """One ``validate()`` of the v1 trainer on this worker: a pass over the registered
        validation data (its first ``num_steps`` batches if given)."""
        self._ensure_setup()
        if self._validation_loader is None:
            raise RuntimeError(
                f"{type(self).__name__} has no validation data: return (train_loader, validation_loader) from "
                "data_creator or call self.register_data(validation_loader=...) in setup()."
            )
        batches = Batches(self._validation_loader, self._device, num_steps)
        start = time.perf_counter()
        stats = dict(self.validate(batches, {**self._base_info(num_steps), **(info or {})}) or {})
        if profile:
            stats["profile"] = {"validate_s": time.perf_counter() - start}
        return stats
