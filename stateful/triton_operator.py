"""A stateless graph operator served by a registered Understudy app (a Triton model).

``kind="triton"`` with params ``app_id`` (a registered app of an image family), ``controller_url``
(filled in by the controller when it deploys the graph), ``channels`` and ``side`` (the input
image the graph carries, flattened, as the in-process ``cnn`` takes it) and ``out_dim``. Each
batch is resized to the variants' input (``image_side``, 3 channels, float32), sent through
``understudy.client.UnderstudyClient`` — which follows the app's placement events and retries
across its failovers (warm switch or progressive), so a server failure under the app delays the
operator, it never fails it — and the logits (1000 classes) are projected to ``out_dim``
features with a fixed matrix seeded like every operator, so every replica computes the same
function. The app answers with whichever variant serves it at the moment (a smaller one during
a progressive failover): stateless outputs may differ between executions, which NSPB allows
(HAMS §IV-F).

The graph's in-process ``cnn`` stays for the simulator and the benchmarks; this kind needs a
running controller and Triton.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from stateful.api import ComputeResult, ModelInput, OperatorModel
from stateful.errors import InvalidGraphRequestError

logger = logging.getLogger(__name__)

RECORDS_KEPT = 1000
"""The client keeps a record per request; a long-lived operator trims them."""


class TritonOperator(OperatorModel):
    """Stateless operator whose compute is an inference on an Understudy app."""

    def initialize(self, seed: int) -> None:
        p = self.params
        self.app_id = str(p.get("app_id", ""))
        self.controller_url = str(p.get("controller_url", ""))
        if not self.app_id or not self.controller_url:
            raise InvalidGraphRequestError(
                "a triton operator needs params app_id and controller_url")
        self.channels = int(p.get("channels", 1))
        self.side = int(p.get("side", 8))
        self.image_side = int(p.get("image_side", 224))
        self.out_dim = int(p.get("out_dim", 16))
        self.max_batch = int(p.get("max_batch", 8))
        self.timeout_s = float(p.get("timeout_s", 60.0))
        self.seed = seed
        self.projection: torch.Tensor | None = None
        # The client starts a thread and a websocket: only on the first compute, so building
        # the operator to validate a spec (in the controller) connects nowhere.
        self.client: Any = None

    def _images(self, batch: Sequence[ModelInput]) -> torch.Tensor:
        width = self.channels * self.side * self.side
        rows = []
        for item in batch:
            x = torch.cat([t.reshape(-1).to(torch.float32) for t in item.inputs])
            if x.numel() != width:
                raise InvalidGraphRequestError(f"triton operator: expected {width} input values, "
                                          f"got {x.numel()}")
            rows.append(x)
        x = torch.stack(rows).reshape(-1, self.channels, self.side, self.side)
        if self.channels != 3:
            x = x.mean(dim=1, keepdim=True).expand(-1, 3, -1, -1)
        if self.side != self.image_side:
            x = torch.nn.functional.interpolate(x, size=(self.image_side, self.image_side),
                                                mode="bilinear", align_corners=False)
        return x.contiguous()

    def _project(self, logits: torch.Tensor) -> torch.Tensor:
        if self.projection is None or self.projection.shape[0] != logits.shape[1]:
            gen = torch.Generator().manual_seed(self.seed)
            self.projection = torch.randn(logits.shape[1], self.out_dim, generator=gen) / \
                float(logits.shape[1]) ** 0.5
        return logits @ self.projection

    def compute(self, batch: Sequence[ModelInput]) -> ComputeResult:
        if self.client is None:
            from understudy.client import UnderstudyClient

            self.client = UnderstudyClient(self.controller_url, self.app_id).start()
        images = self._images(batch).numpy()
        parts = []
        for start in range(0, len(images), self.max_batch):
            result = self.client.infer(images[start:start + self.max_batch],
                                       timeout_s=self.timeout_s)
            parts.append(torch.from_numpy(result.logits.astype("float32")))
        records = self.client.records
        if len(records) > RECORDS_KEPT:
            del records[:len(records) - RECORDS_KEPT]
        features = self._project(torch.cat(parts).reshape(len(images), -1))
        return ComputeResult(outputs=list(features))
