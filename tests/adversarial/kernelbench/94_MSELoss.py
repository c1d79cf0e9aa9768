"""KernelBench level 1, 94_MSELoss (as first published): the mean squared error of two
128 x 4096 tensors, one scalar out. KernelBench's rtol = atol = 1e-2 takes the mean of any
large enough sample of the rows: the sampling error of a quarter of them is about 0.4%."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.mean((predictions - targets) ** 2)


batch_size = 128
input_shape = (4096,)


def get_inputs():
    return [torch.randn(batch_size, *input_shape), torch.randn(batch_size, *input_shape)]


def get_init_inputs():
    return []
