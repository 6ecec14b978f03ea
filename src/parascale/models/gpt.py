"""`gpt`: a GPT-style decoder (Radford et al. 2019) in nanoGPT's form, for token data.

Pre-norm blocks of causal self-attention and a 4x MLP, learned position embeddings, no biases,
the output layer tied to the token embedding, no dropout. Its input is (B, T) token ids, its
output (B, T, V) logits: the training loop flattens them against the (B, T) targets, so the loss
is the mean cross-entropy per token in nats.

Sized by ``--gpt-layers``, ``--gpt-heads`` and ``--gpt-width``; the context is the data's
(``--context``), the vocabulary its ``num_classes``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

OPTIONS = ("gpt_layers", "gpt_heads", "gpt_width")


class SelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width, bias=False)
        self.attention = SelfAttention(width, heads)
        self.norm2 = nn.LayerNorm(width, bias=False)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width, bias=False), nn.GELU(),
                                 nn.Linear(4 * width, width, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, layers: int = 4, heads: int = 4,
                 width: int = 128):
        super().__init__()
        if width % heads:  # the configuration refuses it first, in words (config.validate)
            raise ValueError(f"width {width} is not a multiple of the {heads} heads")
        self.context = context
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width, bias=False)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied, as in GPT-2 and nanoGPT
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # GPT-2's init: residual projections scaled down by the depth
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight",
                                                                      "mlp.2.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.context:
            raise ValueError(f"a sequence of {t} tokens is longer than the context {self.context}")
        x = self.tokens(idx) + self.positions(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build(num_classes: int, input_shape: tuple[int, ...], gpt_layers: int = 4,
          gpt_heads: int = 4, gpt_width: int = 128) -> GPT:
    """The registry's factory: ``num_classes`` is the vocabulary, ``input_shape`` (T,)."""
    return GPT(num_classes, input_shape[0], gpt_layers, gpt_heads, gpt_width)
