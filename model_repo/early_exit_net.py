"""An early-exit convolutional network: blocks in sequence, a classifier head after each.

A request leaves at the first exit whose softmax confidence (its largest class probability)
reaches that exit's threshold; the last exit's threshold is 0, so every request leaves by then.
A request that leaves early computes no later block: in a batch, each stage runs on the members
still inside, so a batch costs what its slowest member costs (Orloj's model of a batch: the
maximum of its members' times), and members that left are not carried along.

:meth:`EarlyExitNet.stage` runs one block and its head on the members given and says which of
them leave there; ``forward`` chains the stages (TorchScript compiles both, with the
data-dependent control flow), answering ``(logits N x 10, exit_index N int32)``. The per-server
runtime drives the stages itself when it serves the model (``model_repo.early_exit``), to time
each member's exit; both paths run the same :meth:`stage`.

Importing this module imports torch: only training and tests use it, the runtime loads the
exported TorchScript file.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

NUM_CLASSES = 10


class ExitStage(nn.Module):
    """One block (convolutions with ReLU at the input's 8 x 8 resolution) and its exit head.

    A block whose input has its width adds its input to its output (a residual block), so a
    later exit starts from what the earlier ones learnt.
    """

    def __init__(self, in_channels: int, channels: int, convs: int) -> None:
        super().__init__()
        self.residual = in_channels == channels
        layers: list[nn.Module] = []
        previous = in_channels
        for _ in range(convs):
            layers += [nn.Conv2d(previous, channels, 3, padding=1), nn.ReLU()]
            previous = channels
        self.block = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.MaxPool2d(2), nn.Flatten(),
                                  nn.Linear(channels * 16, NUM_CLASSES))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The block's features and the exit's logits."""
        h = self.block(x)
        if self.residual:
            h = h + x
        return h, self.head(h)


class EarlyExitNet(nn.Module):
    """Stages of equal width; ``thresholds`` (one per exit, the last 0) decide the exits.

    The first block has one convolution more than the others: its first one reads the single
    input channel and costs little, so every block costs about the same.
    """

    def __init__(self, channels: int, stages: int, convs: int, in_channels: int = 1) -> None:
        super().__init__()
        self.stages = nn.ModuleList(
            [ExitStage(in_channels if i == 0 else channels, channels, convs + (i == 0))
             for i in range(stages)])
        self.num_exits = stages
        self.num_classes = NUM_CLASSES
        self.register_buffer("thresholds", torch.zeros(stages))

    def set_thresholds(self, values: list[float]) -> None:
        """The confidence each exit needs (the last one is forced to 0: everyone leaves)."""
        if len(values) != self.num_exits:
            raise ValueError(f"{self.num_exits} thresholds needed, got {len(values)}")
        fixed = [float(v) for v in values[:-1]] + [0.0]
        self.thresholds.copy_(torch.tensor(fixed))

    def all_exits(self, x: Tensor) -> list[Tensor]:
        """Every exit's logits for every input (training and calibration; not exported)."""
        outputs = []
        for stage in self.stages:
            x, out = stage(x)
            outputs.append(out)
        return outputs

    @torch.jit.export
    def stage(self, index: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Run stage ``index`` on ``x``: its features, its exit's logits, who leaves there."""
        features = x
        logits = torch.zeros(x.shape[0], self.num_classes, dtype=x.dtype, device=x.device)
        for i, module in enumerate(self.stages):
            if i == index:
                features, logits = module(x)
        confidence = torch.softmax(logits, dim=1).amax(dim=1)
        leave = confidence >= self.thresholds[index]
        if index == self.num_exits - 1:
            leave = torch.ones_like(leave)
        return features, logits, leave

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Logits (N x 10) and the exit each input took (N, int32)."""
        n = x.shape[0]
        logits = torch.zeros(n, self.num_classes, dtype=x.dtype, device=x.device)
        exits = torch.full((n,), self.num_exits - 1, dtype=torch.int32, device=x.device)
        members = torch.arange(n, device=x.device)
        features = x
        for index in range(self.num_exits):
            if members.shape[0] == 0:
                break
            features, out, leave = self.stage(index, features)
            leaving = members[leave]
            logits[leaving] = out[leave]
            exits[leaving] = index
            stay = torch.logical_not(leave)
            features = features[stay]
            members = members[stay]
        return logits, exits
