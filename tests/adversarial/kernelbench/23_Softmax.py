"""KernelBench level 1, 23_Softmax (as published): rows of 16384 columns, checked with
KernelBench's atol = rtol = 1e-2, under which every output of a row (about 6e-5) is "close" to 0."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch_size = 16
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
