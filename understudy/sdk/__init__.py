"""The client SDK: inference on any app, over HTTP or gRPC, sync or asyncio, across failovers.

```python
from understudy.sdk import Client

with Client("http://controller:8000", protocol="grpc") as client:
    meta = client.metadata("my-app")
    result = client.infer("my-app", {meta.inputs[0].name: meta.inputs[0].zeros(4)})
    print(result.outputs, result.record.server_id, result.record.variant)
```

Inside: ``follower`` learns routes from the controller, ``exchange`` resends a call across
failovers, ``transport`` is the one caller of tritonclient, ``aio`` and ``sync`` are the two
clients, ``signals`` a clean stop. docs/sdk.md has the whole story.
"""

from understudy.sdk.aio import AsyncClient
from understudy.sdk.errors import (
    AppDeletedError,
    ClientError,
    ClosedError,
    DeadlineError,
    InferenceError,
    SdkError,
    UnavailableError,
    UnknownAppError,
)
from understudy.sdk.locations import (
    Location,
    location_of_event,
    location_of_replica,
    location_of_serving,
)
from understudy.sdk.records import InferResult, ModelMetadata, RequestRecord, TensorSpec
from understudy.sdk.signals import run_until_signal, run_until_signal_async
from understudy.sdk.sync import Client

__all__ = [
    "AppDeletedError",
    "AsyncClient",
    "Client",
    "ClientError",
    "ClosedError",
    "DeadlineError",
    "InferResult",
    "InferenceError",
    "Location",
    "ModelMetadata",
    "RequestRecord",
    "SdkError",
    "TensorSpec",
    "UnavailableError",
    "UnknownAppError",
    "location_of_event",
    "location_of_replica",
    "location_of_serving",
    "run_until_signal",
    "run_until_signal_async",
]
