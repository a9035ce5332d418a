"""The built-in model of ``stoker doctor``."""

from __future__ import annotations

from typing import Any, Callable


def builtin_step(model: str, num_classes: int, device: Any) -> Callable[[Any], None]:
    """A training step (SGD, cross-entropy) of a small CNN, for diagnosing without user code:
    "tiny" is 3 stride-2 convolutions; "small" 8 convolutions at ResNet-18's widths."""
    import torch
    import torch.nn as nn

    widths = {"tiny": [16, 32, 64], "small": [64, 64, 128, 128, 256, 256, 512, 512]}[model]
    layers, cin = [], 3
    for i, w in enumerate(widths):
        stride = 2 if model == "tiny" or i % 2 == 0 else 1
        layers += [nn.Conv2d(cin, w, 3, stride=stride, padding=1, bias=False),
                   nn.BatchNorm2d(w), nn.ReLU(inplace=True)]  # fmt: skip
        cin = w
    net = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, num_classes))
    net = net.to(device, memory_format=torch.channels_last)  # type: ignore[call-overload]
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step(batch: Any) -> None:
        images, labels = batch[0], batch[1]
        images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        if images.dtype == torch.uint8:
            images = images.float().div_(255)
        loss = nn.functional.cross_entropy(net(images.to(next(net.parameters()).dtype)), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step
