"""Several models and optimizers (a GAN) with v1's custom ``train_function`` / ``validation_function``."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from sgd_torch.v1 import TorchTrainer

LATENT = 4
TARGET = torch.tensor([2.0, -1.0])


def gan_model_creator(config):
    torch.manual_seed(0)
    discriminator = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    generator = nn.Sequential(nn.Linear(LATENT, 16), nn.ReLU(), nn.Linear(16, 2))
    return discriminator, generator


def gan_optimizer_creator(models, config):
    discriminator, generator = models
    return (torch.optim.Adam(discriminator.parameters(), lr=config["lr"], betas=(0.5, 0.999)),
            torch.optim.Adam(generator.parameters(), lr=config["lr"], betas=(0.5, 0.999)))


def gan_data_creator(config):
    g = torch.Generator().manual_seed(0)
    real = TARGET + 0.1 * torch.randn(512, 2, generator=g)  # the distribution the generator must learn
    return (DataLoader(TensorDataset(real), batch_size=16, shuffle=True),
            DataLoader(TensorDataset(real[:128]), batch_size=64))


def gan_train(models, iterator, criterion, optimizers, config):
    discriminator, generator = models  # DDP-wrapped with two workers
    d_optimizer, g_optimizer = optimizers
    d_total = g_total = 0.0
    samples = 0
    for (real,) in iterator:
        n = real.shape[0]
        fake = generator(torch.randn(n, LATENT))
        # Discriminator: one forward over real and fake, then its backward (DDP wants the pair).
        scores = discriminator(torch.cat([real, fake.detach()]))
        d_loss = criterion(scores, torch.cat([torch.ones(n, 1), torch.zeros(n, 1)]))
        d_optimizer.zero_grad()
        d_loss.backward()
        d_optimizer.step()
        # Generator: make the discriminator call its samples real.
        g_loss = criterion(discriminator(fake), torch.ones(n, 1))
        g_optimizer.zero_grad()
        g_loss.backward()
        g_optimizer.step()
        d_total += d_loss.item() * n
        g_total += g_loss.item() * n
        samples += n
    return {"loss_d": d_total / samples, "loss_g": g_total / samples, "num_samples": samples}


def gan_validate(models, iterator, criterion, config):
    discriminator, generator = models
    assert not torch.is_grad_enabled() and not generator.training  # run under no_grad, in eval mode
    torch.manual_seed(1)
    fake = generator(torch.randn(256, LATENT))
    real_scores = [torch.sigmoid(discriminator(real)).mean().item() for (real,) in iterator]
    return {"real_score": sum(real_scores) / len(real_scores),
            "fake_distance": (fake.mean(0) - TARGET).norm().item()}


def test_gan_with_custom_train_and_validation_functions(ray_cluster):
    trainer = TorchTrainer(
        model_creator=gan_model_creator,
        data_creator=gan_data_creator,
        optimizer_creator=gan_optimizer_creator,
        loss_creator=nn.BCEWithLogitsLoss,
        train_function=gan_train,
        validation_function=gan_validate,
        config={"lr": 0.01},
        num_workers=2,
    )
    try:
        before = trainer.validate()
        discriminator0, generator0 = trainer.get_model()
        results = [trainer.train() for _ in range(4)]
        after = trainer.validate()
        discriminator, generator = trainer.get_model()
    finally:
        trainer.shutdown()
    assert [r["epoch"] for r in results] == [1, 2, 3, 4]
    for r in results:
        assert set(r) == {"loss_d", "loss_g", "num_samples", "epoch"}
        assert r["num_samples"] == 512  # 256 on each worker
        assert 0 < r["loss_d"] < 10 and 0 < r["loss_g"] < 10
    assert set(before) == {"real_score", "fake_distance"}
    # Both models were trained, and the generator moved towards the data.
    assert type(generator) is nn.Sequential and type(discriminator) is nn.Sequential  # no DDP
    assert not torch.equal(generator[0].weight, generator0[0].weight)
    assert not torch.equal(discriminator[0].weight, discriminator0[0].weight)
    assert after["fake_distance"] < before["fake_distance"] / 2, (before, after)
