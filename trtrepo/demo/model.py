"""The demo network: conv + BatchNorm + ReLU blocks with residual Adds, global pooling, linear head."""

from __future__ import annotations

import torch
from torch import nn


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, stride: int = 1, relu: bool = True) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if relu:
            layers.append(nn.ReLU(inplace=True))
        super().__init__(*layers)


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = ConvBNReLU(channels, channels)
        self.conv2 = ConvBNReLU(channels, channels, relu=False)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(x + self.conv2(self.conv1(x)))


class ResidualCNN(nn.Module):
    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 16) -> None:
        super().__init__()
        w = width
        self.features = nn.Sequential(
            ConvBNReLU(in_channels, w),
            ResidualBlock(w),
            ConvBNReLU(w, 2 * w, stride=2),
            ResidualBlock(2 * w),
            ConvBNReLU(2 * w, 4 * w, stride=2),
            ResidualBlock(4 * w),
        )
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(4 * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.pool(self.features(x)), 1))
