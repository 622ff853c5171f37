"""Serve a supernet over HTTP and across machines (optional extra ``serve``: starlette, uvicorn, prometheus-client;
``ray[serve]`` for :mod:`subnetact.serving.ray_serve`).

- :class:`ServingApp`: the ASGI front end (``POST /predict``, ``/healthz``, ``/readyz``, ``/metrics``).
- :func:`serve`: run it on uvicorn with header/body timeouts and a graceful drain on SIGTERM.
- :class:`LocalBackend`: an in-process :class:`scheduling.Scheduler` behind the front end, with an online
  :class:`scheduling.LatencyModel` correcting its profile.
- :class:`PlanGuard`: ``/readyz`` is 503 while no subnet can meet the deadline budget; probes until one can.
- :class:`ModelSpec` / :class:`SupernetRunner`: load a :func:`subnetact.save` file and run batches on its subnets.
- :mod:`subnetact.serving.codec`: the JSON and safetensors request formats.

``python -m subnetact.serving --help`` is the container entry point. Importing ``subnetact`` does not import this
package; importing this package imports neither starlette, uvicorn nor ray (they load when an app is built).
"""

from .app import ServingApp
from .backend import Backend, LocalBackend, make_policy, wall_to_monotonic
from .codec import RequestError, decode_json, decode_tensor, encode_tensor
from .plan_guard import PlanGuard, PlanStatus
from .runner import ModelSpec, SupernetRunner
from .server import make_server, serve, timed_protocol

__all__ = [
    "Backend",
    "LocalBackend",
    "ModelSpec",
    "PlanGuard",
    "PlanStatus",
    "RequestError",
    "ServingApp",
    "SupernetRunner",
    "decode_json",
    "decode_tensor",
    "encode_tensor",
    "make_policy",
    "make_server",
    "serve",
    "timed_protocol",
    "wall_to_monotonic",
]
