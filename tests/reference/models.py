#!/usr/bin/python3
"""PyTorch model definitions shared by the reference and benchmark scripts.

All models are the ones from the "Computational Performance" chapter of
Dive into Deep Learning (zh.d2l.ai, PyTorch edition), written as
nn.Sequential so that state_dict names match the C++ side:

  mlp          Flatten, Linear(784,256), ReLU, Linear(256,10)
               -> 1.weight 1.bias 3.weight 3.bias
  mlp_chapter  the hybridize section's get_net():
               Linear(512,256), ReLU, Linear(256,128), ReLU, Linear(128,2)
               -> 0.* 2.* 4.*
  lenet        the multi-GPU-from-scratch section's (slightly modified) LeNet:
               Conv2d(1,20,3), ReLU, AvgPool2d(2), Conv2d(20,50,5), ReLU,
               AvgPool2d(2), Flatten, Linear(800,128), ReLU, Linear(128,10)
               -> 0.* 3.* 7.* 9.*
               (the chapter keeps W3 as [800,128] and computes X @ W3; the
               nn.Linear weight here is its transpose, [128,800]).
  resnet18     the concise multi-GPU section's resnet18(10, in_channels=1):
               0 Conv2d(1,64,3,s1,p1), 1 BatchNorm2d(64), 2 ReLU,
               resnet_block1..4 (each two d2l Residual blocks),
               global_avg_pool AdaptiveAvgPool2d((1,1)),
               fc Sequential(Flatten, Linear(512,10)).
               Input 1x28x28 (no resize): 28 -> 28 -> 14 -> 7 -> 4 -> 1.

Only torch is imported; nothing here touches global RNG state.
"""
import torch
from torch import nn
from torch.nn import functional as F

MODEL_NAMES = ("mlp", "mlp_chapter", "lenet", "resnet18")


class Residual(nn.Module):
    """d2l.Residual (PyTorch edition), attribute order conv1, conv2, conv3,
    bn1, bn2 -- this is also the named_parameters() order."""

    def __init__(self, input_channels, num_channels, use_1x1conv=False,
                 strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(input_channels, num_channels, kernel_size=3,
                               padding=1, stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, kernel_size=3,
                               padding=1)
        if use_1x1conv:
            self.conv3 = nn.Conv2d(input_channels, num_channels,
                                   kernel_size=1, stride=strides)
        else:
            self.conv3 = None
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3 is not None:
            X = self.conv3(X)
        Y += X
        return F.relu(Y)


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                         nn.Linear(256, 10))


def mlp_chapter():
    return nn.Sequential(nn.Linear(512, 256), nn.ReLU(),
                         nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 2))


def lenet():
    return nn.Sequential(
        nn.Conv2d(1, 20, kernel_size=3), nn.ReLU(),
        nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Conv2d(20, 50, kernel_size=5), nn.ReLU(),
        nn.AvgPool2d(kernel_size=2, stride=2),
        nn.Flatten(),
        nn.Linear(800, 128), nn.ReLU(),
        nn.Linear(128, 10))


def resnet18(num_classes=10, in_channels=1):
    def resnet_block(in_channels, out_channels, num_residuals,
                     first_block=False):
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(Residual(in_channels, out_channels,
                                    use_1x1conv=True, strides=2))
            else:
                blk.append(Residual(out_channels, out_channels))
        return nn.Sequential(*blk)

    net = nn.Sequential(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU())
    net.add_module("resnet_block1", resnet_block(64, 64, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(64, 128, 2))
    net.add_module("resnet_block3", resnet_block(128, 256, 2))
    net.add_module("resnet_block4", resnet_block(256, 512, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(),
                                       nn.Linear(512, num_classes)))
    return net


def build(name):
    """Returns a freshly constructed model (PyTorch default init)."""
    if name == "mlp":
        return mlp()
    if name == "mlp_chapter":
        return mlp_chapter()
    if name == "lenet":
        return lenet()
    if name == "resnet18":
        return resnet18(10, in_channels=1)
    raise ValueError("unknown model %r (known: %s)" % (name, MODEL_NAMES))


def input_shape(name):
    """Per-sample input shape (without the batch dimension)."""
    return (512,) if name == "mlp_chapter" else (1, 28, 28)


def num_classes(name):
    return 2 if name == "mlp_chapter" else 10


def init_d2l(model, zero_bias=True):
    """d2l's init_weights: normal(0, 0.01) on the weight of every nn.Linear
    and nn.Conv2d. With zero_bias (the from-scratch LeNet section's
    b = torch.zeros(...)), their biases are set to zero as well; BatchNorm
    keeps its defaults (gamma 1, beta 0). Uses torch's global RNG."""
    for m in model.modules():
        if type(m) in (nn.Linear, nn.Conv2d):
            nn.init.normal_(m.weight, std=0.01)
            if zero_bias and m.bias is not None:
                nn.init.zeros_(m.bias)
    return model
