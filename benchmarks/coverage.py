"""Which architectures ``subnetact.convert`` handles with no user-written rule, checked for parity; writes a table.

For every model (random weights, randomised BatchNorm statistics, eval mode):

1. ``convert`` it (timed). A refusal must leave the model exactly as it was (same module types, same tensors); its
   message goes into the table.
2. The largest subnet must equal the original model: relative max error <= 1e-5 (``convert`` itself already checks
   bit-for-bit on its own example input; this uses another input).
3. ``calibrate`` the smallest subnet and a random one on a batch of 4, then the actuated model must equal
   ``export()`` for both: relative max error <= 1e-4.

Usage::

    python benchmarks/coverage.py                       # all torchvision classification models
    python benchmarks/coverage.py --timm                # the timm models of issue 11 too
    python benchmarks/coverage.py --models resnet18 vit_b_16 --out /tmp/cov.md

Writes ``docs/coverage.md`` (``--out``) and prints one line per model.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import random
import sys
import time
import warnings

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import subnetact  # noqa: E402
from subnetact.verify import candidate_calls  # noqa: E402

TIMM_MODELS = (
    "resnet18",
    "resnet50",
    "resnext50_32x4d",
    "regnety_002",
    "efficientnet_b0",
    "mobilenetv3_small_100",
    "convnext_atto",
    "vit_tiny_patch16_224",
    "deit_tiny_patch16_224",
    "densenet121",
)


def randomize_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._NormBase) and m.running_mean is not None:
                n = m.num_features
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
    return model


def wake_up(model: nn.Module) -> nn.Module:
    """Parameters initialised at (nearly) zero get random values: ConvNeXt's layer scale (1e-6) and ViT's zero head
    would otherwise make every subnet's output (nearly) the original's."""
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() and p.abs().max() < 1e-3:
                p.copy_(torch.randn_like(p) * 0.5)
    return model


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-12)).item()


def snapshot(model: nn.Module) -> tuple:
    return (
        type(model),
        [(n, type(m)) for n, m in model.named_modules()],
        {k: v.clone() for k, v in model.state_dict().items()},
    )


def unchanged(model: nn.Module, snap: tuple) -> bool:
    cls, types, tensors = snap
    state = model.state_dict()
    return (
        type(model) is cls
        and [(n, type(m)) for n, m in model.named_modules()] == types
        and state.keys() == tensors.keys()
        and all(torch.equal(state[k], tensors[k]) for k in tensors)
    )


def output(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out[0]


def check(name: str, build) -> dict:
    torch.manual_seed(0)
    model = wake_up(randomize_norms(build())).eval()
    row = {"model": name, "params_m": sum(p.numel() for p in model.parameters()) / 1e6}
    snap = snapshot(model)
    reference = copy.deepcopy(model)
    t0 = time.perf_counter()
    try:
        subnetact.convert(model)
    except subnetact.SubnetActError as exc:
        row.update(status="refused", convert_s=time.perf_counter() - t0, message=str(exc).replace("|", "/"))
        row["unchanged"] = unchanged(model, snap)
        return row
    row["convert_s"] = time.perf_counter() - t0
    space = model.space
    row["depth"] = len(space.entries("depth")) if "depth" in space.dims else 0
    row["width"] = len(space.entries("width")) if "width" in space.dims else 0
    # A different input than convert's own check (seed 1), of the size convert found the model accepts.
    x = None
    for args, _kwargs in candidate_calls(reference, None):
        x = torch.randn(2, *args[0].shape[1:], generator=torch.Generator().manual_seed(1))
        try:
            with torch.no_grad():
                ref = output(reference(x))
            break
        except Exception:  # noqa: BLE001 (the model does not take this size)
            x = None
    with torch.no_grad():
        row["max_err"] = rel_err(output(model(x)), ref)
        cfgs = [space.min(), space.sample(random.Random(0))]
        batches = [torch.randn(4, *x.shape[1:], generator=torch.Generator().manual_seed(2))]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            subnetact.calibrate(model, batches, subnets=cfgs)
        if any("never ran in eval mode" in str(w.message) for w in caught):
            row["note"] = "calibrate skipped the norms of the auxiliary classifiers (they run only in training)"
        errs = []
        for cfg in cfgs:
            dense = subnetact.export(model, cfg).eval()
            errs.append(rel_err(output(model(x, subnet=cfg)), output(dense(x))))
        row["min_err"], row["random_err"] = errs
        # The smallest subnet must actually be smaller: its output differs from the largest's.
        row["min_vs_max"] = rel_err(output(model(x, subnet=cfgs[0])), ref)
        if max(errs) > 1e-4:
            # Random weights can amplify float32 rounding (the order of a sliced GEMM's sums) without bound; in
            # float64 a correct conversion agrees to ~1e-12, a wrong one does not.
            model.double()
            x64 = x.double()
            subnetact.calibrate(model, [b.double() for b in batches], subnets=cfgs)
            row["err_f64"] = max(
                rel_err(output(model(x64, subnet=cfg)), output(subnetact.export(model, cfg).eval()(x64)))
                for cfg in cfgs
            )
            errs = [row["err_f64"]]
    ok = row["max_err"] <= 1e-5 and max(errs) <= 1e-4 and row["min_vs_max"] > 1e-4
    row["status"] = ("converted (float64)" if "err_f64" in row else "converted") if ok else "PARITY FAIL"
    return row


# The largest models run last, so an interrupted sweep still has a table for the rest (written after every model).
HEAVY = (
    "convnext_large",
    "efficientnet_b6",
    "efficientnet_b7",
    "efficientnet_v2_l",
    "regnet_y_16gf",
    "regnet_y_32gf",
    "regnet_y_128gf",
    "vit_l_16",
    "vit_l_32",
    "vit_h_14",
)


def torchvision_models(names: list[str] | None) -> list[tuple[str, object]]:
    import torchvision

    all_names = torchvision.models.list_models(module=torchvision.models)
    order = sorted(all_names, key=lambda n: (n in HEAVY, HEAVY.index(n) if n in HEAVY else 0, n))
    out = []
    for n in names or order:
        if n not in all_names:
            continue
        kwargs = {"num_classes": 10}
        if n in ("googlenet", "inception_v3"):
            kwargs.update(init_weights=True)  # as built by default otherwise: auxiliary classifiers on
        out.append((n, lambda n=n, kw=kwargs: torchvision.models.get_model(n, **kw)))
    return out


def timm_models(names: list[str] | None) -> list[tuple[str, object]]:
    import timm

    return [
        (f"timm/{n}", lambda n=n: timm.create_model(n, pretrained=False, num_classes=10))
        for n in TIMM_MODELS
        if names is None or n in names or f"timm/{n}" in names
    ]


def write_table(
    rows: list[dict], path: str, command: str, keep: list[str] | None = None, header: str | None = None
) -> None:
    """Write the table; ``keep``: row lines of an earlier table for models not in ``rows``; ``header``: that table's
    "Generated by" line."""
    tv = [r for r in rows if not r["model"].startswith("timm/")]
    kept = [line for line in keep or [] if line.split("|")[1].strip() not in {r["model"] for r in rows}]
    statuses = [r["status"] for r in tv] + [
        line.split("|")[3].strip() for line in kept if "timm/" not in line.split("|")[1]
    ]
    converted = statuses.count("converted")
    in_float64 = statuses.count("converted (float64)")
    tv = tv + [line for line in kept if "timm/" not in line.split("|")[1]]
    head = [
        "# Coverage: which architectures `subnetact.convert` handles with no user-written rule",
        "",
        (header + f" Rows of {', '.join(r['model'] for r in rows)} re-measured by `{command}`.")
        if header
        else (
            f"Generated by `{command}` (random weights, randomised BatchNorm statistics, CPU, "
            f"{torch.get_num_threads()} thread(s), load average {os.getloadavg()[0]:.1f} at the end; convert times "
            "depend on the machine's load)."
        ),
        "",
        f"**torchvision: {converted + in_float64} of {len(tv)} classification models convert with parity** "
        f"({converted} in float32; {in_float64} where random weights amplify float32 rounding past 1e-4 agree in "
        "float64, see the notes). "
        "Parity: the largest subnet equals the original (relative max error <= 1e-5) and, after `calibrate`, the "
        "actuated model equals `export()` for the smallest and a random subnet (<= 1e-4); *min vs max* (the smallest "
        "subnet's output against the original's, relative) shows the smallest subnet really is smaller. A refused "
        "model is left unchanged (checked: same module types and tensors).",
        "",
        "| model | params (M) | status | convert (s) | depth entries | width entries | max err | min err | "
        "random err | min vs max | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    new_lines = []
    for r in rows:
        lines = new_lines
        if r["status"] == "refused":
            note = ("unchanged; " if r.get("unchanged") else "**CHANGED**; ") + r["message"]
            lines.append(
                f"| {r['model']} | {r['params_m']:.1f} | refused | {r['convert_s']:.2f} | | | | | | | {note} |"
            )
        elif r.get("err_f64") is not None:
            lines.append(
                f"| {r['model']} | {r['params_m']:.1f} | {r['status']} | {r['convert_s']:.2f} | {r['depth']} | "
                f"{r['width']} | {r['max_err']:.1e} | {r['min_err']:.1e} | {r['random_err']:.1e} | "
                f"{r['min_vs_max']:.2f} | float32 rounding amplified by the random weights: in float64 actuated vs "
                f"export {r['err_f64']:.1e} |"
            )
        elif "error" in r:
            lines.append(f"| {r['model']} | {r.get('params_m', 0):.1f} | ERROR | | | | | | | | {r['error']} |")
        else:
            lines.append(
                f"| {r['model']} | {r['params_m']:.1f} | {r['status']} | {r['convert_s']:.2f} | {r['depth']} | "
                f"{r['width']} | {r['max_err']:.1e} | {r['min_err']:.1e} | {r['random_err']:.1e} | "
                f"{r['min_vs_max']:.2f} | {r.get('note', '')} |"
            )
    # An update replaces rows in place, keeping the earlier table's order.
    by_model = {line.split("|")[1].strip(): line for line in new_lines}
    for line in keep or []:
        name = line.split("|")[1].strip()
        head.append(by_model.pop(name, line))
    head += list(by_model.values())
    with open(path, "w") as f:
        f.write("\n".join(head) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", help="only these model names (torchvision, or timm/<name>)")
    parser.add_argument("--timm", action="store_true", help="also the timm models of issue 11")
    parser.add_argument("--no-torchvision", action="store_true")
    parser.add_argument("--update", action="store_true", help="replace only these models' rows of the --out table")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "coverage.md"))
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads (0: leave as is); 1 is fastest for the tiny inputs",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    todo = [] if args.no_torchvision else torchvision_models(args.models)
    if args.timm:  # before the heaviest torchvision models
        heavy = [item for item in todo if item[0] in HEAVY]
        todo = [item for item in todo if item[0] not in HEAVY] + timm_models(args.models) + heavy
    keep = header = None
    if args.update and os.path.exists(args.out):
        with open(args.out) as f:
            old = [line.rstrip("\n") for line in f]
        keep = [line for line in old if line.startswith("| ") and not line.startswith("| model ")]
        header = next((line for line in old if line.startswith("Generated by")), None)
    rows = []
    for name, build in todo:
        try:
            row = check(name, build)
        except Exception as exc:  # noqa: BLE001 (reported in the table)
            row = {"model": name, "status": "ERROR", "error": f"{type(exc).__name__}: {exc}"[:300].replace("|", "/")}
        rows.append(row)
        shown = {k: (f"{v:.2e}" if isinstance(v, float) else v) for k, v in row.items() if k != "message"}
        print(shown, row.get("message", "")[:200], flush=True)
        gc.collect()
        write_table(rows, args.out, "python " + " ".join(sys.argv), keep, header)


if __name__ == "__main__":
    main()
