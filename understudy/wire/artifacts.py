"""What travels with an artifact: its manifest and the shape of its network, as plain values.

The manifest is written by the artifact generator (``model_repo.artifacts``) next to a variant's
weights and sent by the controller with each load command (``understudy.wire.protocol``). Both
sides depend on this module, which needs nothing but pydantic; building or loading the torch
network itself stays in ``model_repo.network``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

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


ArtifactFormat = Literal["synthetic", "onnx", "torchscript", "triton"]
"""What a variant's artifact file is: ``synthetic`` (seeded weights of a generated network,
``model_repo.network``), ``onnx`` or ``torchscript`` (a user's model, served through the
per-server runtime), or ``triton`` (a user's whole Triton model directory, packed as a tar and
served as it is by a Triton that has its backend)."""

SYNTHETIC_WEIGHTS_FILE = "weights.pt"


class TensorSpec(BaseModel):
    """One input or output of a model, as Triton declares it (``dims`` without the batch)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128)
    data_type: str = "FP32"
    """Triton's name of the element type (``FP32``, ``INT64``, ...)."""
    dims: tuple[int, ...]
    """Shape of one item; -1 for a dimension of any size."""


class Manifest(BaseModel):
    """What the generator or the importer wrote for one variant; checked before it is served."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = STORE_SCHEMA_VERSION
    family: str
    variant: str
    profiled_size_mb: float = Field(gt=0)
    scale: float = Field(gt=0)
    weights_mb: float = Field(gt=0)
    weights_sha256: str
    spec: dict[str, int] = Field(default_factory=dict)
    """The generated network's shape (``synthetic`` only)."""
    max_batch_size: int = Field(ge=1)
    format: ArtifactFormat = "synthetic"
    weights_file: str = Field(SYNTHETIC_WEIGHTS_FILE, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    """The artifact's one file in the variant's directory (what agents fetch and verify)."""
    inputs: tuple[TensorSpec, ...] = ()
    """The model's inputs (imported formats; a synthetic network takes ``image``)."""
    outputs: tuple[TensorSpec, ...] = ()
    backend: str | None = None
    """The Triton backend a ``triton`` directory needs (served as it is)."""

    @property
    def synthetic(self) -> bool:
        """Whether the artifact is a generated network with seeded (random) weights."""
        return self.format == "synthetic"

    @property
    def network(self) -> NetworkSpec:
        """The network spec as a value."""
        return NetworkSpec.from_dict(self.spec)


