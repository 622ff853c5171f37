"""Transformer supernets (issue 5): actuation latency, and forward time of the actuated supernet divided by forward
time of the exported dense Hugging Face model, for a BERT-base-shaped model (random weights) on CPU.

Six subnets span depth 6..12 and width 0.25..1.0 (heads and FFN together). For each, the actuated model and
``model.export(cfg)`` run interleaved, ``--reps`` times each, and the ratio of medians is reported; the headline is
the median ratio over the subnets. Actuation is timed per call, cycling through the (already compiled) subnets.

    python benchmarks/bench_hf.py --batch-sizes 1 8 --seq 128
"""

from __future__ import annotations

import argparse
import time

import torch
import transformers

import subnetact

from _common import machine, median, percentile, timeit


def spanning(space: subnetact.Space, n: int, min_depth: int) -> list[subnetact.SubnetConfig]:
    """``n`` configs from (min_depth, smallest width) to (full depth, full width), interpolated together."""
    depths = [d for d in space.entries("depth")[0].choices if d >= min_depth]
    widths = space.entries("heads")[0].choices
    out = []
    for i in range(n):
        t = i / (n - 1)
        depth = depths[round(t * (len(depths) - 1))]
        width = widths[round(t * (len(widths) - 1))]
        out.append(space.make(depth=depth, width=width))
    return out


def actuation(model: torch.nn.Module, subnets: list, calls: int) -> dict[str, list[float]]:
    """Seconds per ``actuate`` call: with a config object, and with keywords (validated and snapped each call)."""
    for cfg in subnets:  # compile every plan once, as a server does at start-up
        model.actuate(cfg)
    by_config, by_keywords = [], []
    keywords = [{"depth": cfg["depth"][0], "width": cfg["heads"][0]} for cfg in subnets]
    for i in range(calls):
        cfg, kw = subnets[i % len(subnets)], keywords[i % len(subnets)]
        start = time.perf_counter()
        model.actuate(cfg)
        by_config.append(time.perf_counter() - start)
        start = time.perf_counter()
        model.actuate(**kw)
        by_keywords.append(time.perf_counter() - start)
    return {"actuate(cfg)": by_config, "actuate(depth=, width=)": by_keywords}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--intermediate", type=int, default=3072)
    parser.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="attention implementation")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--reps", type=int, default=11, help="timed forwards per model and subnet")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--subnets", type=int, default=6)
    parser.add_argument("--min-depth", type=int, default=6)
    parser.add_argument("--actuation-calls", type=int, default=20000)
    parser.add_argument("--skip-forward", action="store_true", help="only measure actuation")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice, all cores)"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=args.intermediate,
        num_labels=3,
        attn_implementation=args.attn,
    )
    model = subnetact.convert(transformers.BertForSequenceClassification(config).eval())
    subnets = spanning(model.space, args.subnets, args.min_depth)
    print(f"# BERT {args.layers}x{args.hidden}, {args.heads} heads, FFN {args.intermediate}, {args.attn}, {machine()}")

    times = actuation(model, subnets, args.actuation_calls)
    print("\n| actuation | median µs | p99 µs |")
    print("|---|---:|---:|")
    for label, xs in times.items():
        print(f"| {label} | {median(xs) * 1e6:.2f} | {percentile(xs, 99) * 1e6:.2f} |")
    if args.skip_forward:
        return

    exported = {cfg: model.export(cfg).eval() for cfg in subnets}
    print(f"\n| batch | subnet | params (M) | actuated ms | exported ms | ratio |  (seq {args.seq})")
    print("|---:|---|---:|---:|---:|---:|")
    with torch.inference_mode():
        for bs in args.batch_sizes:
            g = torch.Generator().manual_seed(bs)
            x = {
                "input_ids": torch.randint(1000, config.vocab_size, (bs, args.seq), generator=g),
                "attention_mask": torch.ones(bs, args.seq, dtype=torch.long),
            }
            ratios = []
            for cfg in subnets:
                dense = exported[cfg]
                model.actuate(cfg)
                for _ in range(args.warmup):
                    model(**x)
                    dense(**x)
                act, exp = [], []
                for _ in range(args.reps):  # interleaved, so drift on a shared machine hits both alike
                    act += timeit(lambda x=x: model(**x), 1)
                    exp += timeit(lambda x=x, dense=dense: dense(**x), 1)
                ratio = median(act) / median(exp)
                ratios.append(ratio)
                params = sum(p.numel() for p in dense.parameters()) / 1e6
                label = f"depth={cfg['depth'][0]} width={cfg['heads'][0]}"
                print(
                    f"| {bs} | {label} | {params:.1f} | {median(act) * 1e3:.1f} | {median(exp) * 1e3:.1f} "
                    f"| {ratio:.3f} |",
                    flush=True,
                )
            print(f"| {bs} | **median over {len(subnets)} subnets** | | | | **{median(ratios):.3f}** |", flush=True)


if __name__ == "__main__":
    main()
