"""Fine-tuning a Hugging Face Transformers model in a plain distributed torch loop.

Mirrors Ray Train 1.x's ``transformers/transformers_example.py`` with a tiny GPT-2 built from a
config in place of a hub model and dataset (nothing is downloaded): the model comes from
``transformers``, ``sgd_torch.prepare_model`` wraps it in DDP, ``prepare_data_loader`` shards the
data, and each epoch's loss is reported. Needs ``sgd-torch[huggingface]``::

    python examples/transformers_tiny.py                  # 2 workers, 4 epochs
    python examples/transformers_tiny.py --smoke-test     # quick mode (used by the tests)
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Dict, List, Optional

import sgd as train
from sgd import Trainer

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the workers inherit it: no network access
VOCAB, SEQ = 32, 16


def train_func(config: Dict) -> List[float]:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import sgd_torch

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=1, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    # Sequences that count up modulo VOCAB: the next token is learnable.
    ids = torch.stack([(torch.arange(SEQ) + start) % VOCAB for start in range(0, 7 * 64, 7)])
    loader = sgd_torch.prepare_data_loader(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids),
                                                                       batch_size=8, shuffle=True))
    model = sgd_torch.prepare_model(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    losses = []
    for epoch in range(config["epochs"]):
        if hasattr(loader.sampler, "set_epoch"):
            loader.sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for (batch,) in loader:
            loss = model(input_ids=batch, labels=batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        losses.append(total / batches)
        train.report(epoch=epoch, loss=losses[-1])
    return losses


def train_transformers(num_workers: int = 2, epochs: int = 4) -> List[List[float]]:
    trainer = Trainer(backend="torch", num_workers=num_workers)
    trainer.start()
    try:
        results = trainer.run(train_func, config={"lr": 5e-3, "epochs": epochs})
    finally:
        trainer.shutdown()
    print("mean loss per epoch, per worker:", results)
    return results


def main(argv: Optional[List[str]] = None) -> List[List[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", "-n", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--smoke-test", action="store_true", help="quick mode: 2 epochs")
    args = parser.parse_args(argv)
    return train_transformers(2 if args.smoke_test else args.num_workers, 2 if args.smoke_test else args.epochs)


if __name__ == "__main__":
    main(sys.argv[1:])
