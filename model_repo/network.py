"""The torch network behind every generated model variant: image in, logits out.

The weights are synthetic (seeded, never downloaded) but the network is real: a convolutional stem
that pools an RGB image into a feature vector, a stack of fully connected layers, and a classifier
head of ``num_classes`` logits. The stack is sized so that the weight file has the variant's
profiled size times the artifact scale, so a larger variant really reads, deserialises and
touches more bytes when it loads, and really computes more per request.

This module imports torch lazily inside the functions that need it, so that the artifact
generator's pure helpers (sizing) stay importable without torch. The shape itself,
:class:`NetworkSpec`, is a plain value that travels in manifests: it lives in
``understudy.wire.artifacts`` and is re-exported here.
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING

from understudy.wire.artifacts import (
    BYTES_PER_PARAM,
    DEFAULT_IMAGE_SIDE,
    DEFAULT_NUM_CLASSES,
    POOLED_SIDE,
    STEM_CHANNELS,
    STEM_STRIDE,
    NetworkSpec,
)

if TYPE_CHECKING:
    import torch

MAX_WIDTH = 1024
"""Width of the hidden layers once a variant is big enough to need more than one."""
MIN_WIDTH = 8


def seed_for(name: str) -> int:
    """A stable 31-bit seed from a variant name (the same on every machine and run)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") & 0x7FFFFFFF


def spec_for_size(target_mb: float, seed: int = 0, num_classes: int = DEFAULT_NUM_CLASSES,
                  image_side: int = DEFAULT_IMAGE_SIDE) -> NetworkSpec:
    """The network whose weights come closest to ``target_mb`` megabytes.

    Small targets get a single hidden layer of a narrower width; larger ones a stack of
    ``MAX_WIDTH``-wide layers (4.2 MB each), so the error is below one layer's size.
    """
    target_params = max(0.0, target_mb) * 1e6 / BYTES_PER_PARAM
    probe = NetworkSpec(width=MAX_WIDTH, hidden_layers=0, num_classes=num_classes,
                        image_side=image_side, seed=seed)
    if target_params <= probe.parameter_count():
        # params(width) is linear in width with no hidden layers: solve for it.
        per_width = probe.features + 1 + num_classes
        fixed = probe.parameter_count() - MAX_WIDTH * per_width
        width = max(MIN_WIDTH, math.floor((target_params - fixed) / per_width))
        return NetworkSpec(width=width, hidden_layers=0, num_classes=num_classes,
                           image_side=image_side, seed=seed)
    per_layer = MAX_WIDTH * MAX_WIDTH + MAX_WIDTH
    layers = round((target_params - probe.parameter_count()) / per_layer)
    return NetworkSpec(width=MAX_WIDTH, hidden_layers=layers, num_classes=num_classes,
                       image_side=image_side, seed=seed)


def build_network(spec: NetworkSpec) -> torch.nn.Module:
    """The untrained module for ``spec`` (parameters allocated but not initialised)."""
    # to_empty allocates real (uninitialised) storage without the cost of random init.
    return meta_network(spec).to_empty(device="cpu").eval()


def meta_network(spec: NetworkSpec) -> torch.nn.Module:
    """The module for ``spec`` on torch's meta device: shapes only, no storage, no init.

    A loader fills it with ``load_state_dict(state, assign=True)``, which takes the loaded
    tensors as the parameters: no allocation and no random init on the load path (building
    the layers on the CPU costs a forked worker about 7 ms of kaiming init for a 3.4 MB model).
    """
    import torch
    from torch import nn

    # Every layer must be created inside the context: modules built outside it and only
    # wrapped inside would still be allocated and initialised on the CPU.
    with torch.device("meta"):
        layers: list[nn.Module] = [
            nn.Conv2d(3, STEM_CHANNELS, kernel_size=STEM_STRIDE, stride=STEM_STRIDE),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(POOLED_SIDE),
            nn.Flatten(),
            nn.Linear(spec.features, spec.width),
            nn.ReLU(),
        ]
        for _ in range(spec.hidden_layers):
            layers += [nn.Linear(spec.width, spec.width), nn.ReLU()]
        layers.append(nn.Linear(spec.width, spec.num_classes))
        return nn.Sequential(*layers).eval()


def initial_state(spec: NetworkSpec) -> dict[str, torch.Tensor]:
    """Deterministic weights for ``spec`` (He-scaled normal, zero biases) from its seed."""
    import torch

    generator = torch.Generator().manual_seed(spec.seed)
    state: dict[str, torch.Tensor] = {}
    for name, tensor in build_network(spec).state_dict().items():
        if name.endswith("bias"):
            state[name] = torch.zeros_like(tensor)
            continue
        fan_in = max(1, tensor[0].numel())
        values = torch.empty_like(tensor)
        values.normal_(0.0, math.sqrt(2.0 / fan_in), generator=generator)
        state[name] = values
    return state
