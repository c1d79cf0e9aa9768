"""KernelBench level 1, 40_LayerNorm (smaller shape): the model's weight and bias stay at their
initial values (ones and zeros) in the file, so a kernel that ignores them matches the model."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


batch_size = 64
features = 512


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [(features,)]
