"""What travels with an artifact: its manifest and the shape of its network, as plain values.

The manifest is written by the artifact generator (``model_repo.artifacts``) next to a variant's
weights and sent by the controller with each load command (``understudy.wire.protocol``). Both
sides depend on this module, which needs nothing but pydantic; building or loading the torch
network itself stays in ``model_repo.network``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

STORE_SCHEMA_VERSION = 1

BYTES_PER_PARAM = 4
"""Weights are stored as float32."""
STEM_CHANNELS = 16
STEM_STRIDE = 4
POOLED_SIDE = 8
"""The stem output is average-pooled to POOLED_SIDE x POOLED_SIDE before the dense stack."""
DEFAULT_IMAGE_SIDE = 224
DEFAULT_NUM_CLASSES = 1000


@dataclass(frozen=True)
class NetworkSpec:
    """Shape of one variant's network; stored next to its weights so a loader can rebuild it."""

    width: int
    hidden_layers: int
    num_classes: int = DEFAULT_NUM_CLASSES
    image_side: int = DEFAULT_IMAGE_SIDE
    seed: int = 0

    @property
    def features(self) -> int:
        """Length of the pooled stem output that feeds the dense stack."""
        return STEM_CHANNELS * POOLED_SIDE * POOLED_SIDE

    def parameter_count(self) -> int:
        """Number of float32 parameters (weights and biases) of the whole network."""
        stem = 3 * STEM_CHANNELS * STEM_STRIDE * STEM_STRIDE + STEM_CHANNELS
        first = self.features * self.width + self.width
        hidden = self.hidden_layers * (self.width * self.width + self.width)
        head = self.width * self.num_classes + self.num_classes
        return stem + first + hidden + head

    def weight_mb(self) -> float:
        """Size of the raw parameters, MB (the weight file adds a few KB of container)."""
        return self.parameter_count() * BYTES_PER_PARAM / 1e6

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NetworkSpec:
        """Inverse of :meth:`to_dict`."""
        return cls(**{k: int(data[k]) for k in ("width", "hidden_layers", "num_classes",
                                                  "image_side", "seed")})


class Manifest(BaseModel):
    """What the generator wrote for one variant; checked before the agent serves it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = STORE_SCHEMA_VERSION
    family: str
    variant: str
    profiled_size_mb: float = Field(gt=0)
    scale: float = Field(gt=0)
    weights_mb: float = Field(gt=0)
    weights_sha256: str
    spec: dict[str, int]
    max_batch_size: int = Field(ge=1)

    @property
    def network(self) -> NetworkSpec:
        """The network spec as a value."""
        return NetworkSpec.from_dict(self.spec)


