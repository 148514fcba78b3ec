#!/usr/bin/python3
"""Exports PyTorch models as ONNX files for the importer's tests (libs/onnx).

    export_onnx.py OUT_DIR [NAME...]

Writes OUT_DIR/NAME.onnx for each NAME (default: all):

  lenet      models.lenet(), the built-in lenet's PyTorch twin
  resnet18   models.resnet18(10, 1), the built-in resnet18's twin
  vgg_bn     a small VGG-style net no built-in covers: 3x3 convs with
             BatchNorm, max pooling, Dropout(0.25), two Linear layers
  grouped    grouped and dilated convolutions, LeakyRelu, Sigmoid, Tanh, a
             broadcasting Mul, Concat and a Transpose (ops that run on the
             importer's CPU-only path)
  lstm       an LSTM classifier: an op the importer does not support

Exported with torch.onnx.export in TRAINING mode and without constant
folding, so initializers keep their state_dict names and BatchNormalization
and Dropout stay in the graph (an eval-mode export folds batch norm into the
convolutions and drops Dropout). Opset 13, a symbolic batch dimension.
Weights: torch's default init under torch.manual_seed(0); the tests that need
other weights copy them in by name.
"""
import os
import sys
import warnings

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def vgg_bn():
    def block(cin, cout):
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(*block(1, 16), nn.MaxPool2d(2), *block(16, 32), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Dropout(0.25),
                         nn.Linear(64, 10))


class Grouped(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=4)
        self.conv3 = nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2)
        self.scale = nn.Parameter(torch.ones(1, 8, 1, 1))
        self.fc = nn.Linear(16 * 14 * 14, 10)

    def forward(self, x):
        y = nn.functional.leaky_relu(self.conv1(x), 0.1)
        y = torch.sigmoid(self.conv2(y)) * self.scale
        y = torch.tanh(self.conv3(y))
        y = torch.cat([y, y.transpose(2, 3)], dim=1)
        return self.fc(torch.flatten(y, 1))


class Lstm(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(28, 16, batch_first=True)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        y, _ = self.lstm(x.reshape(-1, 28, 28))
        return self.fc(y[:, -1])


BUILDERS = {
    "lenet": models.lenet,
    "resnet18": lambda: models.resnet18(10, in_channels=1),
    "vgg_bn": vgg_bn,
    "grouped": Grouped,
    "lstm": Lstm,
}


def export(model, path):
    model.train()
    x = torch.zeros(2, 1, 28, 28)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, x, path, opset_version=13,
                          training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=["x"],
                          output_names=["logits"],
                          dynamic_axes={"x": {0: "N"}, "logits": {0: "N"}})


def main():
    out_dir = sys.argv[1]
    names = sys.argv[2:] or list(BUILDERS)
    for name in names:
        torch.manual_seed(0)
        export(BUILDERS[name](), os.path.join(out_dir, name + ".onnx"))


if __name__ == "__main__":
    main()
