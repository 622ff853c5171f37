"""Iteration-level (continuous) batching of LLM generations with a time-per-output-token target (issue 24).

An LLM engine runs *iterations*: an optional prefill of newly admitted prompts, then one decode step that gives
every running sequence one more token. Sequences join the running batch between iterations and leave it when they
end. :class:`DecodeScheduler` makes the decisions of such an engine; it holds no model, so the same code drives a
real engine (:class:`subnetact.hf.ElasticDecodeEngine`) and :func:`simulate_decode`, which replays a trace with
profiled latencies instead of running a model.

**Deadlines.** A sequence arriving at ``a`` owes its ``k``-th output token (``k = 0`` is the prefill's) by
``a + ttft_s + k * tpot_s``: the time to first token, then one time per output token. Queueing eats into every
token's deadline, so holding sequences back to keep the running batch small is no free way to be on time. A token
is *on time* when it is emitted by its deadline; every token is emitted (no sequence is dropped).

**Decisions**, each through an :class:`~scheduling.IterationFit` policy (whole batches, one subnet):

1. *Admission* (:meth:`DecodeScheduler.plan_prefill`): the first ``n`` arrived sequences (FIFO) such that the
   grown batch is *sustainable*, i.e. its fastest decode step fits one ``tpot_s`` (the largest such batch, at most
   ``max_batch``, is :attr:`DecodeScheduler.sustainable_batch`), and, while the running sequences' next tokens can
   still be on time, the prefill at its fastest plus the grown batch's fastest decode step fit their slack (tokens
   already late do not hold the queue back). An idle engine always admits at least one sequence.
2. *Prefill subnet*: the most accurate whose prefill latency (profiled per prompt *tokens*: ``n`` times the longest
   admitted prompt, the padded batch) fits the newcomers' first-token slack and the running sequences' slack left
   after their next decode step.
3. *Decode subnet* (:meth:`DecodeScheduler.plan_decode`): among the subnets that sustain the measured demand
   (SlackFit's sustainable choices; ``headroom``; :meth:`DecodeScheduler.utilization`: the arrivals' prefills and
   their further tokens' share of a decode step, as a fraction of the engine's time, at mean latencies even when
   deadlines are planned at the p99), the most accurate whose
   step latency at the running batch size fits the *step budget*: the slack of the earliest next-token deadline
   (SlackFit's question with the batch fixed), tightened by the waiting sequences' first-token deadlines (each gets
   the first slot to free up, after the prefills ahead of it; see ``_step_budget``), SlackFit's backlog rule for
   decoding. The prefill subnet is chosen among the same sustainable subnets.

The loop cannot see a burst coming: steps run wide while the demand and the queue allow it, so a burst that arrives
when the batch is full finds slots that free up later than under a narrow fixed width; ``headroom`` trades width for
that margin (measured in ``docs/llm.md``).

Subnets here are anything the profiles list; for an elastic LLM they are FFN widths, which share the KV cache, so
the width may change at every iteration. Step latencies do not depend on the sequences' lengths in this model
(short contexts: the FFN and projections dominate); profile at the context lengths you serve.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from .errors import InvalidRequestError
from .latency_model import LatencyModel
from .policies import Decision, IterationFit
from .profile import LatencyStat, Profile, SubnetId

__all__ = ["DecodeScheduler", "DecodeStep", "DecodeSummary", "Prefill", "SequenceRecord", "simulate_decode"]


class Prefill(NamedTuple):
    """Admit and prefill these sequences now.

    Attributes:
        seq_ids: The admitted sequences, in admission order.
        subnet_id: The subnet to prefill them with.
        tokens: Prompt tokens of the padded batch: ``len(seq_ids)`` times the longest prompt.
        decision: The policy's decision (``latency_s`` is the profiled prefill latency).
    """

    seq_ids: tuple[int, ...]
    subnet_id: SubnetId
    tokens: int
    decision: Decision


class DecodeStep(NamedTuple):
    """Run one decode step of these running sequences (every running one) with this subnet."""

    seq_ids: tuple[int, ...]
    subnet_id: SubnetId
    decision: Decision


@dataclass
class SequenceRecord:
    """One sequence's life: what it asked for and, per emitted token, when, with which subnet, and if on time.

    Attributes:
        seq_id: Its id (submission order).
        arrival_s: Arrival time.
        prompt_tokens: Prompt length.
        max_new_tokens: Most tokens it may generate.
        token_times_s: Emission time of each output token.
        subnet_ids: The subnet that produced each output token (the first: the prefill's).
        on_time: Per token, whether it was emitted by its deadline ``arrival + ttft + k * tpot``.
        finished: Whether it has ended (by length or by the engine's stop condition).
    """

    seq_id: int
    arrival_s: float
    prompt_tokens: int
    max_new_tokens: int
    token_times_s: list[float] = field(default_factory=list)
    subnet_ids: list[SubnetId] = field(default_factory=list)
    on_time: list[bool] = field(default_factory=list)
    finished: bool = False


class DecodeSummary(NamedTuple):
    """Totals over the finished sequences.

    Attributes:
        sequences: Finished sequences.
        tokens: Output tokens they emitted.
        on_time_fraction: Tokens emitted by their deadline / tokens (1.0 with no token).
        mean_accuracy: Mean profiled accuracy of the subnets that produced the tokens (for FFN widths given as
            accuracies: the mean width).
        tokens_per_subnet: Tokens produced by each subnet.
        ttft_p50_s, ttft_p99_s: Time to first token (arrival to first token), median and 99th percentile.
        decode_steps: Decode steps run; prefills: prefills run.
    """

    sequences: int
    tokens: int
    on_time_fraction: float
    mean_accuracy: float
    tokens_per_subnet: dict[SubnetId, int]
    ttft_p50_s: float
    ttft_p99_s: float
    decode_steps: int
    prefills: int


def _positive(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise InvalidRequestError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


def _count(name: str, value: object, allowed: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequestError(f"{name} must be an int >= 1{allowed}, got {value!r}")
    return value


class DecodeScheduler:
    """The decisions of an iteration-level batching LLM engine with a per-token latency target.

    Not thread-safe: one engine loop calls it. The host runs, per iteration: :meth:`plan_prefill` (if it returns a
    plan, prefill those sequences and call :meth:`finish_prefill`), then :meth:`plan_decode` (run the step, call
    :meth:`finish_decode`). When both return ``None``, nothing has arrived: wait until :meth:`next_arrival_s`.

    Args:
        decode_profile: Step latency of each subnet per running batch size (``Subnet.accuracy`` orders quality;
            for FFN widths, the width itself).
        prefill_profile: Prefill latency of each subnet per prompt-token count of the padded prompt batch; the same
            subnet ids.
        tpot_s: Time per output token target, in seconds.
        ttft_s: Time to first token target, in seconds (from arrival: it includes the wait for admission).
        max_batch: Most sequences running at once (default: the largest profiled decode batch size; never above it).
        subnet_ids: Restrict every decision to these subnets (default: all). One id is a fixed subnet.
        latency_stat: ``"mean"`` (default: exact for a simulation from the same profile) or ``"p99"`` (plan at the
            tail, for wall-clock runs). Deadline decisions only: :meth:`utilization` is always at the mean.
        rate_window_s: Time constant of the demand estimate (decaying counts of the arrivals, their prompt tokens
            and their ``max_new_tokens``); default ``ttft_s``.
        headroom: Only subnets whose :meth:`utilization` (the fraction of the engine's time the measured demand
            needs: prefills and decode steps, at mean latencies) is at most ``1 / headroom`` are chosen (at least the
            one needing the least time), as SlackFit keeps to sustainable choices. Default 1.0: keep up on average;
            more keeps spare capacity for bursts at the cost of width, less allows more width (``docs/llm.md``).
        adaptive: Correct the profiles online from the iteration times the host reports (:meth:`record`), with a
            :class:`~scheduling.LatencyModel` per profile; for wall-clock runs (default ``False``: plan with the
            profiles as given, exact for a simulation from them).

    Raises:
        InvalidRequestError: a target, ``rate_window_s`` or ``headroom`` is not a positive number, ``max_batch``
            is not in ``1..largest profiled``, or the profiles list different subnets.
        UnknownSubnetError: a ``subnet_ids`` entry is not in the profiles.

    Example::

        >>> from scheduling import DecodeScheduler, LatencyStats, Profile, Subnet
        >>> def prof(per_item):  # width w: (1 + w) ms per iteration plus per_item ms per batch entry, times w
        ...     return Profile([Subnet(f"ffn{w}", w, {b: LatencyStats((1 + w + per_item * b * w) * 1e-3)
        ...                                    for b in (1, 2, 4, 8)}) for w in (0.5, 1.0)])
        >>> sched = DecodeScheduler(prof(1.0), prof(0.1), tpot_s=0.004, ttft_s=0.05)
        >>> sid = sched.submit(prompt_tokens=4, max_new_tokens=2, arrival_s=0.0)
        >>> p = sched.plan_prefill(0.0); p.seq_ids, p.subnet_id
        ((0,), 'ffn1.0')
        >>> sched.finish_prefill(0.002, p)
        >>> step = sched.plan_decode(0.002); step.subnet_id
        'ffn1.0'
        >>> sched.finish_decode(0.005, step); sched.done, sched.summary().on_time_fraction
        (True, 1.0)
    """

    def __init__(
        self,
        decode_profile: Profile,
        prefill_profile: Profile,
        *,
        tpot_s: float,
        ttft_s: float,
        max_batch: int | None = None,
        subnet_ids: Sequence[SubnetId] | None = None,
        latency_stat: LatencyStat = "mean",
        rate_window_s: float | None = None,
        headroom: float = 1.0,
        adaptive: bool = False,
    ) -> None:
        self.tpot_s = _positive("tpot_s", tpot_s)
        self.ttft_s = _positive("ttft_s", ttft_s)
        for name, p in (("decode_profile", decode_profile), ("prefill_profile", prefill_profile)):
            if not isinstance(p, Profile):
                raise InvalidRequestError(f"{name} must be a scheduling.Profile, got {type(p).__name__}")
        if set(decode_profile.ids) != set(prefill_profile.ids):
            raise InvalidRequestError(
                f"decode_profile and prefill_profile must list the same subnets, got {list(decode_profile.ids)!r} "
                f"and {list(prefill_profile.ids)!r}"
            )
        largest = IterationFit(decode_profile, subnet_ids=subnet_ids).largest_batch
        if max_batch is None:
            max_batch = largest
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or not 1 <= max_batch <= largest:
            raise InvalidRequestError(
                f"max_batch must be an int in 1..{largest} (the largest decode batch profiled), got {max_batch!r}"
            )
        self.max_batch = max_batch
        self.rate_window_s = self.ttft_s if rate_window_s is None else _positive("rate_window_s", rate_window_s)
        if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 < headroom < math.inf:
            raise InvalidRequestError(f"headroom must be a finite number > 0, got {headroom!r}")
        self.headroom = float(headroom)
        self._subnet_ids, self._stat = subnet_ids, latency_stat
        self._plan(decode_profile, prefill_profile)
        # Adaptive planning: the measured iteration times correct the profiles online (issue 12's LatencyModel).
        self.latency_models = (LatencyModel(decode_profile), LatencyModel(prefill_profile)) if adaptive else None
        # Decayed counts of the arrivals (sequences, prompt tokens, output tokens) over rate_window_s, as of _rate_t:
        # the demand in output tokens per second is _rate[2]; the work it asks of each subnet follows from all three.
        self._rate = [0.0, 0.0, 0.0]
        self._rate_t = 0.0
        self._counted = 0  # sequences whose arrival the rate has seen
        self._admitted = 1.0  # sequences per prefill, a moving average (prefilled together, prompts cost less each)
        self._accuracy = {s.id: s.accuracy for s in decode_profile.subnets}
        self.records: list[SequenceRecord] = []
        self._waiting: deque[int] = deque()  # submitted, not admitted, in arrival order
        self._running: list[int] = []
        self._decode_steps = self._prefills = 0

    def _plan(self, decode_profile: Profile, prefill_profile: Profile) -> None:
        """Build the policies and the tables derived from the profiles (at start and after each re-plan)."""
        subnet_ids, stat = self._subnet_ids, self._stat
        self.decode_policy = IterationFit(decode_profile, subnet_ids=subnet_ids, latency_stat=stat)
        self.prefill_policy = IterationFit(prefill_profile, subnet_ids=subnet_ids, latency_stat=stat)
        # The largest batch whose fastest step keeps one token per tpot: admission never grows the batch beyond it
        # (at least 1: an idle engine always admits one sequence).
        fits = [b for b in range(1, self.max_batch + 1) if self.decode_policy.min_latency(b) <= self.tpot_s]
        self.sustainable_batch = max(fits, default=1)
        self.max_prompt_tokens = self.prefill_policy.largest_batch
        # What one sequence costs each subnet: its prefill (profiled per prompt tokens; utilization() groups them by
        # the measured admission size, mostly one or two at a time) and, per further token, a share of a step at the
        # sustainable batch. The prefill counts: on a CPU a 16-token prefill of SmolLM2 takes about three decode
        # steps, so a width whose decode steps alone keep up with the demand may still fall behind (issue 24).
        # Costs at the *mean* latency whatever ``latency_stat``: the tail bounds one step's deadline, but the time a
        # stream of work takes is the sum of its latencies, so the mean. Planned at the p99 (wall-clock runs), a noisy
        # CPU profile's tails (up to 2.6x the mean here) made the wide widths look unsustainable at light load: the
        # elastic loop ran at mean width 0.324 on a real run where fixed full width kept every token on time.
        ids = self.decode_policy.subnet_ids or decode_profile.ids
        batch = self.sustainable_batch
        self._ids = tuple(ids)
        self._token_cost = {i: IterationFit(decode_profile, subnet_ids=[i]).min_latency(batch) / batch for i in ids}
        self._prefill_fits = {i: IterationFit(prefill_profile, subnet_ids=[i]) for i in ids}  # (the default: mean)
        self._levels: dict[tuple[SubnetId, ...], tuple[IterationFit, IterationFit]] = {}
        self._profiles = (decode_profile, prefill_profile, stat)

    def record(self, plan: Prefill | DecodeStep, service_s: float, now: float) -> bool:
        """Feed the measured time of a prefill or decode step (``adaptive=True``); returns whether it re-planned.

        The host measures the whole iteration phase (the forward and its own work around it: what the deadlines
        see). A :class:`~scheduling.LatencyModel` per profile turns the samples into estimates (a common slowdown,
        per-entry offsets, the live tail for the p99) and, when they have moved, the policies are rebuilt from them.
        Without ``adaptive`` this is a no-op returning ``False``.
        """
        if self.latency_models is None:
            return False
        decode = isinstance(plan, DecodeStep)
        model = self.latency_models[0 if decode else 1]
        size = len(plan.seq_ids) if decode else plan.tokens
        if not model.record(0, plan.subnet_id, size, service_s, now):
            return False
        decode_model, prefill_model = self.latency_models
        self._plan(decode_model.refresh(now), prefill_model.refresh(now))
        return True

    # --------------------------------------------------------------- sequences
    def submit(self, prompt_tokens: int, max_new_tokens: int, *, arrival_s: float) -> int:
        """Queue a sequence; returns its id (0, 1, ... in submission order).

        Args:
            prompt_tokens: Prompt length, ``1..max_prompt_tokens`` (the largest profiled prefill size).
            max_new_tokens: Most output tokens (>= 1); the host may end it earlier (``ended=`` of the finish calls).
            arrival_s: Arrival time on the host's clock; arrivals must come in non-decreasing order.

        Raises:
            InvalidRequestError: an argument is out of range; nothing is queued.
        """
        _count("prompt_tokens", prompt_tokens, f" and <= {self.max_prompt_tokens} (the largest profiled prefill)")
        if prompt_tokens > self.max_prompt_tokens:
            raise InvalidRequestError(
                f"prompt_tokens must be <= {self.max_prompt_tokens} (the largest profiled prefill), got "
                f"{prompt_tokens!r}"
            )
        _count("max_new_tokens", max_new_tokens, "")
        if isinstance(arrival_s, bool) or not isinstance(arrival_s, (int, float)) or not math.isfinite(arrival_s):
            raise InvalidRequestError(f"arrival_s must be a finite number of seconds, got {arrival_s!r}")
        if self._waiting and arrival_s < self.records[self._waiting[-1]].arrival_s:
            raise InvalidRequestError(
                f"arrival_s must not decrease: got {arrival_s!r} after {self.records[self._waiting[-1]].arrival_s!r}"
            )
        seq_id = len(self.records)
        self.records.append(SequenceRecord(seq_id, float(arrival_s), prompt_tokens, max_new_tokens))
        self._waiting.append(seq_id)
        return seq_id

    @property
    def running(self) -> tuple[int, ...]:
        """Ids of the running sequences, in the order they were admitted (the engine's batch order)."""
        return tuple(self._running)

    @property
    def waiting(self) -> int:
        """Sequences submitted and not yet admitted (arrived or not)."""
        return len(self._waiting)

    @property
    def done(self) -> bool:
        """Nothing waiting and nothing running."""
        return not self._waiting and not self._running

    def next_arrival_s(self) -> float | None:
        """Arrival time of the first waiting sequence (``None`` if none waits)."""
        return self.records[self._waiting[0]].arrival_s if self._waiting else None

    def _deadline(self, rec: SequenceRecord, k: int) -> float:
        return rec.arrival_s + self.ttft_s + k * self.tpot_s

    def _running_slack(self, now: float) -> float:
        """Slack of the earliest next-token deadline of the running sequences (inf when none runs)."""
        if not self._running:
            return math.inf
        return min(self._deadline(self.records[i], len(self.records[i].token_times_s)) for i in self._running) - now

    # --------------------------------------------------------------- load
    def _observe(self, now: float) -> list[float]:
        """Count the arrivals up to ``now`` into the decayed rates and return them decayed to ``now``: sequences,
        prompt tokens and output tokens per second."""
        recs, rate, window = self.records, self._rate, self.rate_window_s
        while self._counted < len(recs) and recs[self._counted].arrival_s <= now:
            rec = recs[self._counted]
            dt = rec.arrival_s - self._rate_t
            if dt > 0:
                decay = math.exp(-dt / window)
                rate[:] = [r * decay for r in rate]
                self._rate_t = rec.arrival_s
            rate[0] += 1 / window
            rate[1] += rec.prompt_tokens / window
            rate[2] += rec.max_new_tokens / window
            self._counted += 1
        dt = now - self._rate_t
        return [r * math.exp(-dt / window) for r in rate] if dt > 0 else list(rate)

    def demand(self, now: float) -> float:
        """The measured demand, in output tokens per second, decayed to ``now``."""
        return self._observe(now)[2]

    def utilization(self, now: float) -> dict[SubnetId, float]:
        """The fraction of the engine's time each subnet would need for the measured demand, decayed to ``now``.

        Per second, the arriving sequences' prefills (in groups of the measured mean admission size, at the mean
        prompt length) and their other output tokens (a share of a decode step at :attr:`sustainable_batch` each), at
        the profiles' *mean* latencies whatever ``latency_stat`` (throughput is a sum of latencies; the p99 only bounds
        single deadlines). Above 1 the subnet falls behind.
        """
        seqs, prompt_tokens, output_tokens = self._observe(now)
        if seqs <= 0:
            return dict.fromkeys(self._ids, 0.0)
        prompt = max(1, math.ceil(prompt_tokens / seqs - 1e-9))
        together = max(1, min(round(self._admitted), self.max_prompt_tokens // prompt))
        later = max(0.0, output_tokens - seqs)  # every output token but each sequence's first (the prefill's)
        return {
            i: seqs * self._prefill_fits[i].min_latency(together * prompt) / together + later * self._token_cost[i]
            for i in self._ids
        }

    def _policies(self, now: float) -> tuple[IterationFit, IterationFit]:
        """The decode and prefill policies over the subnets that sustain the demand with ``headroom`` (at least the
        one needing the least time)."""
        use = self.utilization(now)
        ids = tuple(i for i in self._ids if self.headroom * use[i] <= 1.0) or (min(self._ids, key=use.__getitem__),)
        if len(ids) == len(self._ids):
            return self.decode_policy, self.prefill_policy
        if ids not in self._levels:
            decode, prefill, stat = self._profiles
            self._levels[ids] = (
                IterationFit(decode, subnet_ids=ids, latency_stat=stat),
                IterationFit(prefill, subnet_ids=ids, latency_stat=stat),
            )
        return self._levels[ids]

    # --------------------------------------------------------------- prefill
    def _prompt_batch(self, n: int) -> int:
        return n * max(self.records[self._waiting[j]].prompt_tokens for j in range(n))

    def plan_prefill(self, now: float) -> Prefill | None:
        """Which arrived sequences to admit now and the subnet to prefill them with; ``None``: admit none."""
        arrived = 0
        for i in self._waiting:
            if self.records[i].arrival_s > now:
                break
            arrived += 1
        running = len(self._running)
        room = min(arrived, self.sustainable_batch - running)
        if room <= 0:
            return None
        slack = self._running_slack(now)
        decode, prefill = self.decode_policy, self.prefill_policy
        for n in range(room, 0, -1):
            tokens = self._prompt_batch(n)
            if tokens > self.max_prompt_tokens:
                continue
            if running == 0 and n == 1:
                break  # an idle engine always admits one: every submitted sequence must complete
            if decode.min_latency(running + n) > self.tpot_s:
                continue  # the grown batch could not keep one token per tpot even at its fastest (non-monotone)
            on_time = slack >= decode.min_latency(running)  # (a token already late must not starve the queue)
            if running and on_time and prefill.min_latency(tokens) + decode.min_latency(running + n) > slack:
                continue  # the prefill would make a running sequence's next token late
            break
        else:
            return None
        tokens = self._prompt_batch(n)
        ids = tuple(self._waiting[j] for j in range(n))
        # The newcomers' first token, and the running sequences' next one after the grown batch's step, bound it.
        budget = min(self._deadline(self.records[i], 0) for i in ids) - now
        if running:
            budget = min(budget, slack - decode.min_latency(running + n))
        budget = min(budget, self._step_budget(now, ids))  # the rest of the queue waits for this prefill too
        d = self._policies(now)[1].decide(budget, tokens, now)
        return Prefill(ids, d.subnet_id, tokens, d)

    def finish_prefill(self, now: float, plan: Prefill, ended: Collection[int] = ()) -> None:
        """The prefill of ``plan`` finished at ``now``: each sequence emitted its first token then.

        Args:
            now: Completion time.
            plan: The plan :meth:`plan_prefill` returned (its sequences must still be the first waiting ones).
            ended: Sequences that stopped at this token (e.g. an end-of-sequence token); they complete now.
        """
        head = tuple(self._waiting[j] for j in range(min(len(plan.seq_ids), len(self._waiting))))
        if head != plan.seq_ids:
            raise InvalidRequestError(
                f"plan.seq_ids {plan.seq_ids!r} are not the waiting sequences' head {head!r}: finish each plan once, "
                f"in order"
            )
        for _ in plan.seq_ids:
            self._waiting.popleft()
        self._prefills += 1
        self._admitted += (len(plan.seq_ids) - self._admitted) / 8
        self._running.extend(plan.seq_ids)
        self._emit(now, plan.seq_ids, plan.subnet_id, ended)

    # --------------------------------------------------------------- decode
    def plan_decode(self, now: float) -> DecodeStep | None:
        """The subnet for one decode step of every running sequence; ``None`` when none runs."""
        if not self._running:
            return None
        d = self._policies(now)[0].decide(self._step_budget(now), len(self._running), now)
        return DecodeStep(tuple(self._running), d.subnet_id, d)

    def _step_budget(self, now: float, admitting: Sequence[int] = ()) -> float:
        """The latency one decode step may take now: the running sequences' slack, tightened by the queue.

        A waiting sequence that can be admitted right after this step needs its prefill to fit its first-token
        deadline, and the running sequences need room for that prefill too. One that waits for a slot gets the first
        slot to free up: ``r`` steps from now (a running sequence's remaining tokens, at most; queued sequences are
        given slots in arrival order, each holding its slot for its ``max_new_tokens``), so those ``r`` steps plus its
        prefill must fit its first-token deadline and each step may take ``(slack - prefill) / r``. Without this the
        loop runs wide steps on a full batch while the queue's deadlines pass (the queue's share of the slack, as in
        SlackFit's backlog rule). Hopeless deadlines make the budget negative: the policy then runs its fastest step,
        the least late. A prefill (``admitting`` the sequences it prefills) delays the queue like a step.
        """
        budget = slack = self._running_slack(now)
        # Steps until each of the max_batch slots is free: 0 for an empty one, else the tokens its sequence has left
        # (the sequences being admitted, ``admitting``, hold theirs for all of their tokens).
        running = [self.records[i] for i in self._running]
        slots = [r.max_new_tokens - len(r.token_times_s) for r in running]
        slots += [self.records[i].max_new_tokens for i in admitting]
        slots += [0] * (self.sustainable_batch - len(slots))
        heapq.heapify(slots)
        prefill = self.prefill_policy
        prefills = 0.0  # the prefills of this sequence and of those admitted before it all delay its first token
        for i in itertools.islice(self._waiting, len(admitting), None):
            rec = self.records[i]
            if rec.arrival_s > now:
                break
            free = heapq.heappop(slots)
            reserve = prefill.min_latency(rec.prompt_tokens)
            prefills += reserve
            head = self._deadline(rec, 0) - now - prefills
            if free == 0:  # admitted after this step: its prefill comes before the running sequences' next step
                budget = min(budget, head, slack - reserve)
            else:
                budget = min(budget, head / free)
            heapq.heappush(slots, free + rec.max_new_tokens)
        return budget

    def finish_decode(self, now: float, step: DecodeStep, ended: Collection[int] = ()) -> None:
        """The step ``step`` finished at ``now``: each of its sequences emitted one token then.

        Args:
            now: Completion time.
            step: The step :meth:`plan_decode` returned (its sequences must still be the running ones).
            ended: Sequences that stopped at this token; they complete now (as do those reaching their length).
        """
        if step.seq_ids != tuple(self._running):
            raise InvalidRequestError(
                f"step.seq_ids {step.seq_ids!r} are not the running sequences {tuple(self._running)!r}: finish each "
                f"step once, in order"
            )
        self._decode_steps += 1
        self._emit(now, step.seq_ids, step.subnet_id, ended)

    def _emit(self, now: float, seq_ids: Sequence[int], subnet_id: SubnetId, ended: Collection[int]) -> None:
        unknown = set(ended) - set(seq_ids)
        if unknown:
            raise InvalidRequestError(f"ended names sequences {sorted(unknown)!r} that did not run: {seq_ids!r}")
        for i in seq_ids:
            rec = self.records[i]
            rec.on_time.append(now <= self._deadline(rec, len(rec.token_times_s)))
            rec.token_times_s.append(now)
            rec.subnet_ids.append(subnet_id)
            if i in ended or len(rec.token_times_s) >= rec.max_new_tokens:
                rec.finished = True
        self._running = [i for i in self._running if not self.records[i].finished]

    # --------------------------------------------------------------- metrics
    def summary(self) -> DecodeSummary:
        """Totals over the finished sequences."""
        done = [r for r in self.records if r.finished]
        tokens = sum(len(r.on_time) for r in done)
        per: dict[SubnetId, int] = {}
        for r in done:
            for s in r.subnet_ids:
                per[s] = per.get(s, 0) + 1
        ttft = sorted(r.token_times_s[0] - r.arrival_s for r in done)

        def pct(q: float) -> float:
            return ttft[min(len(ttft) - 1, math.ceil(q * len(ttft)) - 1)] if ttft else math.nan

        return DecodeSummary(
            sequences=len(done),
            tokens=tokens,
            on_time_fraction=sum(sum(r.on_time) for r in done) / tokens if tokens else 1.0,
            mean_accuracy=sum(self._accuracy[s] * c for s, c in per.items()) / tokens if tokens else math.nan,
            tokens_per_subnet=dict(sorted(per.items(), key=lambda kv: str(kv[0]))),
            ttft_p50_s=pct(0.5),
            ttft_p99_s=pct(0.99),
            decode_steps=self._decode_steps,
            prefills=self._prefills,
        )


def simulate_decode(
    scheduler: DecodeScheduler,
    arrivals: Sequence[float],
    prompt_tokens: Sequence[int],
    output_tokens: Sequence[int],
    *,
    overhead_s: float = 0.0,
) -> DecodeSummary:
    """Replay a trace on ``scheduler`` with profiled latencies instead of a model (deterministic).

    Each prefill and decode step takes the profiled mean latency of its decision's subnet at its profiled size
    (``Decision.profile_batch``) plus ``overhead_s``; sequences end at their length. The loop is the one a real
    engine runs; an ``adaptive`` scheduler is told each phase's time (:meth:`DecodeScheduler.record`), as
    :class:`subnetact.hf.ElasticDecodeEngine` does.

    Args:
        scheduler: A fresh :class:`DecodeScheduler` (nothing submitted).
        arrivals: Sorted arrival times, in seconds.
        prompt_tokens: Prompt length of each sequence.
        output_tokens: Output length of each sequence (its ``max_new_tokens``).
        overhead_s: Seconds added to every prefill and decode step: the host's own work per phase (masks, cache
            bookkeeping), which a profile of the bare forward does not hold; default 0.

    Raises:
        InvalidRequestError: unequal lengths, a scheduler that is not fresh, or ``overhead_s`` not a finite number
            >= 0.

    Returns:
        :meth:`DecodeScheduler.summary` once every sequence has finished.

    Example::

        >>> from scheduling import DecodeScheduler, LatencyStats, Profile, Subnet, simulate_decode, traces
        >>> steps = Profile([Subnet(f"ffn{w}", w, {b: LatencyStats(w * (0.004 + 0.001 * b)) for b in (1, 2, 4, 8, 16)})
        ...                  for w in (0.25, 0.5, 1.0)])
        >>> prefill = Profile([Subnet(f"ffn{w}", w, {t: LatencyStats(w * 0.0005 * t) for t in (16, 64, 256)})
        ...                    for w in (0.25, 0.5, 1.0)])
        >>> arrivals = traces.bursty(5, 20, cv2=4, duration_s=10.0, seed=0)
        >>> n = len(arrivals)
        >>> s = simulate_decode(DecodeScheduler(steps, prefill, tpot_s=0.02, ttft_s=0.5), arrivals, [16] * n, [32] * n)
        >>> s.sequences == n, s.on_time_fraction > 0.99, 0.25 < s.mean_accuracy < 1.0
        (True, True, True)
    """
    n = len(arrivals)
    if len(prompt_tokens) != n or len(output_tokens) != n:
        raise InvalidRequestError(
            f"arrivals, prompt_tokens and output_tokens must have equal lengths, got {n}, {len(prompt_tokens)} and "
            f"{len(output_tokens)}"
        )
    if scheduler.records:
        raise InvalidRequestError(f"scheduler must be fresh, it already holds {len(scheduler.records)} sequence(s)")
    bad = isinstance(overhead_s, bool) or not isinstance(overhead_s, (int, float))
    if bad or not 0 <= overhead_s < math.inf:
        raise InvalidRequestError(f"overhead_s must be a finite number of seconds >= 0, got {overhead_s!r}")
    for t, p, o in zip(arrivals, prompt_tokens, output_tokens, strict=True):
        scheduler.submit(p, o, arrival_s=t)
    # The profiles as given (an adaptive scheduler re-plans with its estimates; the simulated engine stays put).
    decode, prefill = scheduler.decode_policy.profile, scheduler.prefill_policy.profile
    now = arrivals[0] if n else 0.0
    while not scheduler.done:
        plan = scheduler.plan_prefill(now)
        if plan is not None:
            took = prefill.latency(plan.subnet_id, plan.decision.profile_batch) + overhead_s
            now += took
            scheduler.finish_prefill(now, plan)
            scheduler.record(plan, took, now)
        step = scheduler.plan_decode(now)
        if step is not None:
            took = decode.latency(step.subnet_id, step.decision.profile_batch) + overhead_s
            now += took
            scheduler.finish_decode(now, step)
            scheduler.record(step, took, now)
        if plan is None and step is None:
            now = max(now, scheduler.next_arrival_s())  # idle until the next arrival
    return scheduler.summary()
