"""A small transformer language model on synthetic tokens: the workload of the examples.

Shared by ``train_cpu.py``, ``train_ddp_cpu.py``, ``benchmarks/bench_collector.py`` and the
collector tests, so that every one of them measures the same model. Small on purpose: a step takes
tens of milliseconds on one CPU thread and a profiled step a few hundred kB of trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ToyConfig:
    """Model and batch shape. The defaults give ~0.5 M parameters (2 MB of fp32)."""

    vocab: int = 512
    d_model: int = 128
    heads: int = 4
    layers: int = 2
    ff: int = 256
    seq: int = 64
    batch: int = 8


class ToyTransformer(nn.Module):
    """Embedding, pre-norm encoder layers with a causal mask, and an untied LM head."""

    def __init__(self, cfg: ToyConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Parameter(torch.zeros(cfg.seq, cfg.d_model))
        layer = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.heads, cfg.ff, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab)
        self.register_buffer(
            "mask", nn.Transformer.generate_square_subsequent_mask(cfg.seq), persistent=False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        x = self.blocks(x, mask=self.mask, is_causal=True)
        return self.head(self.norm(x))


def build(cfg: ToyConfig, seed: int = 0) -> tuple[ToyTransformer, torch.optim.Optimizer]:
    """The model and its AdamW optimizer, initialised from ``seed`` (same on every rank)."""
    torch.manual_seed(seed)
    model = ToyTransformer(cfg)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def synthetic_batch(cfg: ToyConfig, generator: torch.Generator) -> torch.Tensor:
    """Random tokens, one longer than ``seq``: inputs and next-token targets. Only the work matters."""
    return torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=generator)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    """One forward/backward/update; returns the loss."""
    logits = model(batch[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())
