"""The elastic decode loop (issue 24, deliverable 5): per-iteration FFN width vs fixed widths on a bursty trace.

Three steps, each its own sub-command:

``measure``: the step-latency profile of a converted decoder LLM on this CPU, per FFN width (every layer) and batch
size: one decode step of ``B`` sequences on a left-padded cache of ``--context`` tokens, and one prefill of ``t``
prompt tokens (``t / --prompt`` prompts of ``--prompt`` tokens); median and p99 over ``--reps`` runs, widths
interleaved. Written as the two ``scheduling.Profile`` JSON files the scheduler plans with (subnet id ``ffn<w>``,
accuracy ``w``, config = the ``SubnetConfig``).

``simulate``: ``scheduling.simulate_decode`` on a seeded bursty trace (``scheduling.traces.bursty``): every sequence
has a ``--prompt``-token prompt and ``--output`` new tokens; the elastic loop (every width) against each fixed width,
same trace, same targets. Deterministic given the profile. ``--adaptive --overhead-ms 10 --stat p99`` models a
wall-clock run: each phase takes 10 ms more than profiled and the scheduler learns it online.

``real``: the same comparison on the model with the wall clock (``subnetact.hf.ElasticDecodeEngine``), on a shorter
trace; noisy on a shared machine.

    python benchmarks/bench_decode_loop.py measure --model smollm2 --out docs/figures/decode_loop_smollm2
    python benchmarks/bench_decode_loop.py simulate --profile docs/figures/decode_loop_smollm2
    python benchmarks/bench_decode_loop.py real --model smollm2 --profile docs/figures/decode_loop_smollm2
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import time

import torch
import transformers

import scheduling
import subnetact
from subnetact.hf import ElasticDecodeEngine

from _common import machine, median, percentile

WIDTHS = (0.25, 0.5, 0.75, 1.0)
BATCHES = (1, 2, 4, 8, 16)
PREFILL_TOKENS = (16, 32, 64, 128, 256)


def load(name: str) -> torch.nn.Module:
    if name == "smollm2":
        from bench_llm import load as load_smollm2

        model = load_smollm2()
    else:  # a small random Llama: 8 layers, 256 wide, FFN 1024, 4 query / 2 KV heads
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(
            vocab_size=4096, hidden_size=256, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, attn_implementation="sdpa",
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(cfg).eval()
    return subnetact.convert(model)


def width_configs(model) -> dict[str, subnetact.SubnetConfig]:
    depth = {"depth": model.config.num_hidden_layers} if "depth" in model.space.dims else {}
    return {f"ffn{w}": model.space.make(**depth, heads=1.0, ffn=w) for w in WIDTHS}


def _cache_kw(model) -> str:
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def measure(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    model = load(args.model)
    cfgs = width_configs(model)
    kw = _cache_kw(model)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    step_times: dict[tuple[str, int], list[float]] = {}
    fill_times: dict[tuple[str, int], list[float]] = {}
    with torch.no_grad():
        for b in BATCHES:
            ids = torch.randint(10, vocab, (b, args.context), generator=g)
            caches = {}
            for sid, cfg in cfgs.items():  # one cache per width (its K/V), filled once
                cache = transformers.DynamicCache(config=model.config)
                model(input_ids=ids, subnet=cfg, use_cache=True, **{kw: cache})
                caches[sid] = cache
            step = ids[:, -1:]
            mask = torch.ones(b, args.context + 1, dtype=torch.long)
            pos = torch.full((b, 1), args.context)
            for _ in range(args.reps):
                for sid, cfg in cfgs.items():  # interleaved: a load change hits every width alike
                    start = time.perf_counter()
                    model(input_ids=step, attention_mask=mask, position_ids=pos, subnet=cfg, use_cache=True,
                          logits_to_keep=1, **{kw: caches[sid]})  # fmt: skip
                    step_times.setdefault((sid, b), []).append(time.perf_counter() - start)
                    caches[sid].crop(-1)  # drop the token it added: the same context for the next run
        for t in PREFILL_TOKENS:
            n = max(t // args.prompt, 1)
            ids = torch.randint(10, vocab, (n, t // n), generator=g)
            for _ in range(max(args.reps // 2, 3)):
                for sid, cfg in cfgs.items():
                    start = time.perf_counter()
                    model(input_ids=ids, subnet=cfg, use_cache=True, logits_to_keep=1,
                          **{kw: transformers.DynamicCache(config=model.config)})  # fmt: skip
                    fill_times.setdefault((sid, t), []).append(time.perf_counter() - start)

    def profile(times: dict, sizes: tuple, kind: str) -> scheduling.Profile:
        subnets = []
        for w, (sid, cfg) in zip(WIDTHS, cfgs.items(), strict=True):
            lat = {s: scheduling.LatencyStats(median(times[sid, s]), percentile(times[sid, s], 99)) for s in sizes}
            subnets.append(scheduling.Subnet(sid, w, lat, cfg.to_dict()))
        meta = {"model": args.model, "kind": kind, "context": args.context, "prompt": args.prompt,
                "reps": args.reps, "threads": args.threads, "machine": machine(),
                "loadavg": os.getloadavg()[0]}  # fmt: skip
        return scheduling.Profile(tuple(subnets), name=f"{args.model}-{kind}", metadata=meta)

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    profile(step_times, BATCHES, "decode").save(f"{args.out}_decode.json")
    profile(fill_times, PREFILL_TOKENS, "prefill").save(f"{args.out}_prefill.json")
    print(f"load {os.getloadavg()[0]:.1f}; decode step median ms (rows: width, columns: batch {BATCHES})")
    for sid in cfgs:
        print(sid, [round(1e3 * median(step_times[sid, b]), 1) for b in BATCHES])
    print(f"prefill median ms (columns: prompt tokens {PREFILL_TOKENS})")
    for sid in cfgs:
        print(sid, [round(1e3 * median(fill_times[sid, t]), 1) for t in PREFILL_TOKENS])


def profiles(path: str) -> tuple[scheduling.Profile, scheduling.Profile]:
    return (
        scheduling.Profile.load(f"{path}_decode.json", check="ignore"),
        scheduling.Profile.load(f"{path}_prefill.json", check="ignore"),
    )


def trace(args: argparse.Namespace, duration_s: float) -> list[float]:
    rates = (args.base_rate, args.burst_rate)
    return scheduling.traces.bursty(*rates, cv2=args.cv2, duration_s=duration_s, seed=args.seed)


def row(name: str, s: scheduling.DecodeSummary, wall_s: float | None = None) -> dict:
    out = {
        "loop": name,
        "on_time": round(s.on_time_fraction, 4),
        "mean_width": round(s.mean_accuracy, 3),
        "tokens": s.tokens,
        "ttft_p50_s": round(s.ttft_p50_s, 3),
        "ttft_p99_s": round(s.ttft_p99_s, 3),
        "decode_steps": s.decode_steps,
        "tokens_per_width": s.tokens_per_subnet,
    }
    if wall_s is not None:
        out["wall_s"] = round(wall_s, 1)
    return out


def verdict(rows: list[dict]) -> tuple[bool, dict | None]:
    """Whether the issue's target is met on these rows (full width misses; elastic keeps >= 0.99 of the tokens on time
    with a higher mean width than every fixed width that does), and the best fixed width keeping >= 0.99."""
    fixed_ok = [r for r in rows if r["loop"] != "elastic" and r["on_time"] >= 0.99]
    best = max(fixed_ok, key=lambda r: r["mean_width"]) if fixed_ok else None
    el = next(r for r in rows if r["loop"] == "elastic")
    full = next((r for r in rows if r["loop"] == "fixed ffn1.0"), None)
    met = (
        full is not None
        and full["on_time"] < 0.99
        and el["on_time"] >= 0.99
        and (best is None or el["mean_width"] > best["mean_width"])
    )
    return met, best


def report(rows: list[dict]) -> None:
    _, best = verdict(rows)
    for r in rows:
        print(json.dumps(r))
    el = next(r for r in rows if r["loop"] == "elastic")
    full = next((r for r in rows if r["loop"] == "fixed ffn1.0"), None)
    print(
        f"target: full width misses: {full is not None and full['on_time'] < 0.99}; elastic on time "
        f"{el['on_time']} >= 0.99: {el['on_time'] >= 0.99}; mean width {el['mean_width']} > best fixed with >= 0.99 "
        f"({best['loop'] if best else None}, {best['mean_width'] if best else None}): "
        f"{best is None or el['mean_width'] > best['mean_width']}"
    )


def simulate(args: argparse.Namespace) -> None:
    steps, fill = profiles(args.profile)
    met = 0
    for seed in args.seed:
        args_seed = argparse.Namespace(**{**vars(args), "seed": seed})
        arrivals = trace(args_seed, args.duration)
        n = len(arrivals)
        if len(args.seed) == 1:
            print(f"{n} sequences over {args.duration} s (bursty {args.base_rate} + {args.burst_rate}/s, CV2 "
                  f"{args.cv2}, seed {seed}), prompt {args.prompt}, output {args.output}, TPOT {args.tpot} s, TTFT "
                  f"{args.ttft} s, max batch {args.max_batch}, plan at {args.stat}")  # fmt: skip
        rows = []
        for ids in [None] + [[f"ffn{w}"] for w in WIDTHS]:
            sched = scheduling.DecodeScheduler(steps, fill, tpot_s=args.tpot, ttft_s=args.ttft,
                                               max_batch=args.max_batch, subnet_ids=ids, latency_stat=args.stat,
                                               headroom=args.headroom, rate_window_s=args.rate_window,
                                               adaptive=args.adaptive)  # fmt: skip
            s = scheduling.simulate_decode(sched, arrivals, [args.prompt] * n, [args.output] * n,
                                           overhead_s=args.overhead_ms / 1e3)  # fmt: skip
            rows.append(row("elastic" if ids is None else f"fixed {ids[0]}", s))
        if len(args.seed) == 1:
            report(rows)
            continue
        # Several seeds: one line each (elastic on time / mean width, every fixed width's on time, the verdict).
        ok, best = verdict(rows)
        met += ok
        fixed = " ".join(f"{r['loop'][9:]}:{r['on_time']:.3f}" for r in rows[1:])
        best_width = best["loop"][9:] if best else None
        print(f"seed {seed} ({n} sequences): elastic {rows[0]['on_time']:.3f} / {rows[0]['mean_width']:.3f}; fixed "
              f"{fixed}; best fixed >= 0.99: {best_width}; {'met' if ok else 'not met'}")  # fmt: skip
    if len(args.seed) > 1:
        print(f"met on {met} of {len(args.seed)} seeds")


def real(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    steps, fill = profiles(args.profile)
    model = load(args.model)
    arrivals = trace(args, args.duration)
    n = len(arrivals)
    g = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(10, model.config.vocab_size, (n, args.prompt), generator=g).tolist()
    print(f"{n} sequences over {args.duration} s, wall clock, load {os.getloadavg()[0]:.1f}")
    rows = []
    loops = [None] + [[f"ffn{w}"] for w in args.real_fixed]
    for ids in loops:
        sched = scheduling.DecodeScheduler(steps, fill, tpot_s=args.tpot, ttft_s=args.ttft, max_batch=args.max_batch,
                                           subnet_ids=ids, latency_stat=args.stat, headroom=args.headroom,
                                           rate_window_s=args.rate_window, adaptive=args.adaptive)  # fmt: skip
        engine = ElasticDecodeEngine(model, sched)
        start = engine.now()
        for t, p in zip(arrivals, prompts, strict=True):
            engine.submit(p, max_new_tokens=args.output, arrival_s=start + t)
        engine.run()
        rows.append(row("elastic" if ids is None else f"fixed {ids[0]}", sched.summary(), engine.now() - start))
        print(json.dumps(rows[-1]), f"load {os.getloadavg()[0]:.1f}", flush=True)
    report(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    m.add_argument("--out", required=True, help="path prefix of the two profile JSON files")
    m.add_argument("--context", type=int, default=48, help="cached tokens of a decode step")
    m.add_argument("--prompt", type=int, default=16)
    m.add_argument("--reps", type=int, default=12)
    m.add_argument("--threads", type=int, default=1)
    for name in ("simulate", "real"):
        s = sub.add_parser(name)
        s.add_argument("--profile", required=True, help="path prefix given to measure --out")
        s.add_argument("--tpot", type=float, default=0.12, help="time per output token target (s)")
        s.add_argument("--ttft", type=float, default=2.0, help="time to first token target (s)")
        s.add_argument("--max-batch", type=int, default=16)
        s.add_argument("--prompt", type=int, default=16)
        s.add_argument("--output", type=int, default=32)
        s.add_argument("--base-rate", type=float, default=0.5)
        s.add_argument("--burst-rate", type=float, default=2.0)
        s.add_argument("--cv2", type=float, default=4.0)
        s.add_argument("--seed", type=int, nargs="+" if name == "simulate" else None, default=[0] if name == "simulate"
                       else 0, help="trace seed (simulate: several give one line each)")  # fmt: skip
        s.add_argument("--stat", choices=["mean", "p99"], default="mean" if name == "simulate" else "p99")
        s.add_argument("--headroom", type=float, default=1.0, help="DecodeScheduler(headroom=)")
        s.add_argument("--rate-window", type=float, default=None, help="DecodeScheduler(rate_window_s=)")
        s.add_argument("--duration", type=float, default=600.0 if name == "simulate" else 60.0)
        s.add_argument("--adaptive", action="store_true", help="DecodeScheduler(adaptive=True)")
        if name == "simulate":
            s.add_argument("--overhead-ms", type=float, default=0.0, help="simulate_decode(overhead_s=) in ms: the "
                           "host's own work per prefill and step, not in the profile")  # fmt: skip
        if name == "real":
            s.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
            s.add_argument("--threads", type=int, default=1)
            s.add_argument("--real-fixed", type=float, nargs="*", default=[1.0], help="fixed widths to run too")
    args = p.parse_args()
    {"measure": measure, "simulate": simulate, "real": real}[args.cmd](args)


if __name__ == "__main__":
    main()
