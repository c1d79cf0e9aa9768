"""y = relu(x W^T + b) * s: a tiny KernelBench-format problem with weights and two inputs."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x, s):
        return torch.relu(self.linear(x)) * s


def get_inputs():
    return [torch.randn(3, 10), torch.rand(3, 7)]


def get_init_inputs():
    return [10, 7]
