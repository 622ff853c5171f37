"""A DynaBERT-style BERT supernet from a Hugging Face model, end to end, in a few seconds on a CPU.

Random weights stand in for a fine-tuned checkpoint (no downloads): with a real one, replace the constructor by
``BertForSequenceClassification.from_pretrained(...)`` and the random batches by a slice of its dev set.

    python examples/bert_supernet.py
"""

from __future__ import annotations

import torch
import transformers

import subnetact


def main() -> None:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        hidden_size=128, num_hidden_layers=6, num_attention_heads=4, intermediate_size=512, num_labels=3
    )
    model = transformers.BertForSequenceClassification(config).eval()

    # 1. Convert in place: the encoder's layers become one LayerSelect stage, q/k/v/FFN layers weight slices.
    subnetact.convert(model)
    print(model.space)

    # 2. Importance order (DynaBERT's head-mask-gradient and Taylor scores), so that prefixes are the important
    #    heads and neurons. The full model computes the same function afterwards.
    batches = [
        {
            "input_ids": torch.randint(1000, config.vocab_size, (4, 32)),
            "attention_mask": torch.ones(4, 32, dtype=torch.long),
            "labels": torch.randint(0, 3, (4,)),
        }
        for _ in range(2)
    ]
    subnetact.reorder(model, batches)

    # 3. Actuate subnets in place (O(1) once a config has been seen) and run them.
    x = {"input_ids": torch.randint(1000, config.vocab_size, (2, 16)), "attention_mask": torch.ones(2, 16).long()}
    x["attention_mask"][1, 10:] = 0  # padding in the second sequence
    with torch.inference_mode():
        full = model(**x).logits
        model.actuate(depth=3, width=0.5)  # layers 0, 2, 4; half the heads and FFN neurons
        half = model(**x).logits
        small = model(**x, subnet=model.space.make(depth=2, heads=0.25, ffn=0.5)).logits  # this call only
    print(f"active: {model.active}")
    print(f"logits full {full[0].tolist()}\n       half {half[0].tolist()}\n      small {small[0].tolist()}")

    # 4. Export the active subnet as a plain BertForSequenceClassification with the smaller config.
    dense = model.export().eval()
    print(
        f"exported {type(dense).__name__}: {dense.config.num_hidden_layers} layers, "
        f"{dense.config.num_attention_heads} heads, FFN {dense.config.intermediate_size}"
    )
    with torch.inference_mode():
        diff = (dense(**x).logits - half).abs().max().item()
    print(f"max |exported - actuated| = {diff:.2e}")
    assert diff < 1e-4


if __name__ == "__main__":
    main()
