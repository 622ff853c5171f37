"""Soak: ``subnetact.load`` on thousands of damaged checkpoints (issue 22: 10,000 cases, deep nesting included).

Each case is the same saved tiny supernet, damaged one of four ways (chosen at random):

- ``bytes``: 1-3 random byte flips/sets/deletions/insertions in the 8-byte length prefix or the JSON header;
- ``nest``: the subnetact header with a list nested 1 to 300,000 deep added (version 2 with its checksum left stale,
  or version 1, whose header the checksum does not cover);
- ``truncate``: the file cut at a random byte;
- ``header-bytes``: random byte edits inside the subnetact header text only (version 1: not covered by the checksum).

Contract checked on every case: ``load`` returns the saved model bit for bit or raises ``CheckpointError`` (and no
other exception), and the model passed in is unchanged after a failure. Prints the counts of each outcome and exits 1
on any violation. Example::

    python benchmarks/soak_load_fuzz.py --cases 10000 --seed 0
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import random
import struct
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from tiny_models import TINY_MODELS, image_batch  # noqa: E402

import subnetact  # noqa: E402
from subnetact import CheckpointError  # noqa: E402


def saved_model(tmp: Path):
    model = subnetact.convert(TINY_MODELS["basic"](seed=1))
    subnets = [model.space.min(), model.space.sample(3)]
    subnetact.calibrate(model, [image_batch(2)], subnets=subnets)
    model.actuate(subnets[1])
    path = tmp / "fuzz.safetensors"
    subnetact.save(model, path)
    return model, path.read_bytes()


def with_inner_text(raw: bytes, inner_text: str, version: int) -> bytes:
    (n,) = struct.unpack("<Q", raw[:8])
    outer = json.loads(raw[8 : 8 + n])
    outer["__metadata__"]["subnetact"] = inner_text
    if version == 1:
        outer["__metadata__"].pop("subnetact.sha256", None)
    new = json.dumps(outer).encode()
    new += b" " * (-len(new) % 8)
    return struct.pack("<Q", len(new)) + new + raw[8 + n :]


def inner_text(raw: bytes, version: int) -> str:
    (n,) = struct.unpack("<Q", raw[:8])
    inner = json.loads(json.loads(raw[8 : 8 + n])["__metadata__"]["subnetact"])
    if version == 1:
        inner["format_version"] = 1
    return json.dumps(inner)


def damage(raw: bytes, rng: random.Random) -> tuple[str, bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    kind = rng.choice(["bytes", "nest", "truncate", "header-bytes"])
    if kind == "bytes":
        data = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(0, min(len(data), 8 + n))
            op = rng.choice(["flip", "set", "delete", "insert"])
            if op == "flip":
                data[pos] ^= 1 << rng.randrange(8)
            elif op == "set":
                data[pos] = rng.randrange(256)
            elif op == "delete":
                del data[pos]
            else:
                data.insert(pos, rng.randrange(256))
        return kind, bytes(data)
    if kind == "truncate":
        return kind, raw[: rng.randrange(len(raw))]
    version = rng.choice([1, 2])
    text = inner_text(raw, version)
    if kind == "nest":
        depth = int(10 ** rng.uniform(0, 5.5))
        where = rng.randrange(1, len(text) - 1)
        if rng.random() < 0.5:  # as a new field
            text = text[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"
        else:  # anywhere (mostly invalid JSON)
            text = text[:where] + "[" * depth + text[where:]
        return f"nest-v{version}", with_inner_text(raw, text, version)
    chars = list(text)
    for _ in range(rng.randint(1, 3)):
        pos = rng.randrange(len(chars))
        chars[pos] = chr(rng.choice([rng.randrange(32, 127), ord("["), ord("{"), ord('"'), ord("9")]))
    return f"header-bytes-v{version}", with_inner_text(raw, "".join(chars), version)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)  # tiny tensors: threads only add contention (10x slower on a loaded 2-core box)
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp())
    original, raw = saved_model(tmp)
    reference = {k: v.clone() for k, v in original.state_dict().items()}
    template = subnetact.convert(TINY_MODELS["basic"](seed=2))
    before = {k: v.clone() for k, v in template.state_dict().items()}
    outcomes: collections.Counter = collections.Counter()
    violations = []
    path = tmp / "case.safetensors"
    t0 = time.perf_counter()
    model = copy.deepcopy(template)
    for i in range(args.cases):
        kind, data = damage(raw, rng)
        path.write_bytes(data)
        try:
            loaded = subnetact.load(path, model)
        except CheckpointError:
            state = model.state_dict()
            if not all(torch.equal(state[k], v) for k, v in before.items()):
                violations.append((i, kind, "model changed after CheckpointError"))
                model = copy.deepcopy(template)
            outcomes[(kind, "CheckpointError")] += 1
            continue  # unchanged: the next case loads into the same model
        except BaseException as exc:  # noqa: BLE001 - the point: count anything that is not CheckpointError
            violations.append((i, kind, f"{type(exc).__name__}: {str(exc)[:200]}"))
            outcomes[(kind, type(exc).__name__)] += 1
            model = copy.deepcopy(template)
            continue
        state = loaded.state_dict()
        same = loaded.active == original.active and all(torch.equal(state[k], v) for k, v in reference.items())
        if not same:
            violations.append((i, kind, "loaded but not the saved model"))
        outcomes[(kind, "loaded identically" if same else "loaded DIFFERENT")] += 1
        model = copy.deepcopy(template)
    took = time.perf_counter() - t0
    print(f"{args.cases} cases, seed {args.seed}, {took:.1f} s, torch {torch.__version__}")
    for (kind, outcome), count in sorted(outcomes.items()):
        print(f"  {kind:18s} {outcome:22s} {count:6d}")
    print(f"violations: {len(violations)}")
    for v in violations[:20]:
        print("  ", v)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
