"""An embeddable in-process batch scheduler for weight-shared supernets (SuperServe's SlackFit and baselines).

Pure Python and standard library: this package imports neither torch nor ``subnetact``. The model side is a callable
``fn(subnet_id, payloads) -> results`` that you pass to :class:`Scheduler`.

Main pieces:

- :class:`Profile`: subnets, accuracy and per-batch-size latency (own JSON schema + SuperServe importer).
- Policies: :class:`SlackFit`, :class:`MaxAcc`, :class:`MaxBatch`, :class:`Fixed` (Clipper+), :class:`MinCost`
  (INFaaS), :class:`GearPlan` (CascadeServe); ``latency_stat="p99"`` gives the tail-aware variant (Orloj).
- :func:`make_policy` / :func:`register_policy`: policies by name (one table for the CLI, the demo, HTTP and Ray).
- :class:`IterationFit`, :class:`DecodeScheduler`, :func:`simulate_decode`: iteration-level (continuous) batching of
  LLM generations with a time-per-output-token target, one subnet (e.g. FFN width) per iteration.
- :class:`EDFQueue`: earliest-deadline-first queue with the drop rule.
- :func:`dispatch_step`: the one drop/decide/pop step every scheduler here runs (live, simulated, Ray router).
- :func:`plan_batch`: the same step for a batch a serving framework already formed (Ray ``@serve.batch``, Triton).
- :class:`Scheduler`: the live, thread-based scheduler returning ``concurrent.futures.Future`` objects.
- :class:`LatencyModel`: online latency estimates fed by measured service times (adaptive planning).
- :func:`simulate`: a deterministic discrete-event simulator driving the same policy and queue code; it can inject
  :class:`Interference` (a time-varying slowdown per worker).
- :mod:`scheduling.traces` and :mod:`scheduling.datasets`: seeded traces and the shipped data.
"""

from . import datasets, traces
from .batcher import BatchPlan, plan_batch
from .decode import DecodeScheduler, DecodeStep, DecodeSummary, Prefill, SequenceRecord, simulate_decode
from .dispatch import Step, dispatch_step
from .edf import EDFQueue
from .errors import (
    DeadlineMissedError,
    InvalidProfileError,
    InvalidRequestError,
    NoWorkersError,
    ProfilePropertyWarning,
    QueueFullError,
    SchedulerClosedError,
    SchedulingError,
    UnknownSubnetError,
    WorkerFailedError,
    WorkerResultError,
)
from .gearplan import GearPlan
from .latency_model import LatencyModel
from .metrics import DecisionRecord, MetricsSummary, OutcomeRecord
from .policies import Decision, Fixed, IterationFit, MaxAcc, MaxBatch, MinCost, Policy
from .profile import LatencyStats, Profile, PropertyReport, PropertyViolation, Subnet, synthetic_profile
from .registry import make_policy, policy_names, register_policy
from .scheduler import Scheduler
from .simulator import Interference, SimConfig, SimResult, simulate
from .slackfit import SlackFit

__all__ = [
    "BatchPlan",
    "DeadlineMissedError",
    "Decision",
    "DecisionRecord",
    "DecodeScheduler",
    "DecodeStep",
    "DecodeSummary",
    "EDFQueue",
    "Fixed",
    "GearPlan",
    "Interference",
    "InvalidProfileError",
    "InvalidRequestError",
    "IterationFit",
    "LatencyModel",
    "LatencyStats",
    "MaxAcc",
    "MaxBatch",
    "MetricsSummary",
    "MinCost",
    "NoWorkersError",
    "OutcomeRecord",
    "Policy",
    "Prefill",
    "Profile",
    "ProfilePropertyWarning",
    "PropertyReport",
    "PropertyViolation",
    "QueueFullError",
    "Scheduler",
    "SchedulerClosedError",
    "SchedulingError",
    "SequenceRecord",
    "SimConfig",
    "SimResult",
    "SlackFit",
    "Step",
    "Subnet",
    "UnknownSubnetError",
    "WorkerFailedError",
    "WorkerResultError",
    "datasets",
    "dispatch_step",
    "make_policy",
    "plan_batch",
    "policy_names",
    "register_policy",
    "simulate",
    "simulate_decode",
    "synthetic_profile",
    "traces",
]
