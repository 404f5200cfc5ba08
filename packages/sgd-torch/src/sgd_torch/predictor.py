"""``TorchPredictor``: Ray AIR's predictor for a PyTorch model (see :mod:`sgd.predictor`)."""

from __future__ import annotations

from typing import Any

from sgd.checkpoint import Checkpoint
from sgd.predictor import Predictor
from sgd_torch.checkpoint import TorchCheckpoint

__all__ = ["TorchPredictor"]


class TorchPredictor(Predictor):
    """Predictions of a PyTorch model, in eval mode, without gradients.

    :param model: the model.
    :param preprocessor: applied to a DataFrame batch first (``transform_batch``).
    :param use_gpu: run on ``cuda`` (``ValueError`` if no GPU is visible).
    """

    def __init__(self, model: Any, preprocessor: Any = None, use_gpu: bool = False):
        import torch

        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"TorchPredictor takes a torch.nn.Module, got {type(model).__name__}")
        if use_gpu and not torch.cuda.is_available():
            raise ValueError("TorchPredictor(use_gpu=True): no CUDA GPU is visible to this process")
        super().__init__(preprocessor)
        self.device = torch.device("cuda" if use_gpu else "cpu")
        self.model = model.to(self.device).eval()

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, model: Any = None, use_gpu: bool = False,
                        trusted: Any = None) -> TorchPredictor:  # type: ignore[override]
        """A predictor of the model in ``checkpoint`` (``model``: the module a state dict loads into;
        ``trusted``: see :meth:`sgd_torch.TorchCheckpoint.get_model`)."""
        torch_checkpoint = TorchCheckpoint.from_checkpoint(checkpoint)
        loaded = torch_checkpoint.get_model(model, trusted=trusted)
        return cls(loaded, preprocessor=torch_checkpoint.get_preprocessor(trusted=trusted), use_gpu=use_gpu)

    def _predict_numpy(self, data: Any, dtype: Any = None) -> Any:  # type: ignore[override]
        import torch

        with torch.no_grad():
            if isinstance(data, dict):  # several columns: the model takes the dict (as in Ray AIR)
                inputs: Any = {k: torch.as_tensor(v, dtype=dtype, device=self.device) for k, v in data.items()}
            else:
                inputs = torch.as_tensor(data, dtype=dtype, device=self.device)
            out = self.model(inputs)
        return out.detach().cpu().numpy()

    def __repr__(self) -> str:
        return f"TorchPredictor(model={type(self.model).__name__}, preprocessor={self._preprocessor!r})"
