"""Run by test_e2e_distill under ``python`` (1 process) and ``torchrun --nproc_per_node 2`` (gloo): distil a tiny
BERT encoder for a few steps on fixed global batches and save its weights before and after (rank 0)."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import transformers

import subnetact
from subnetact.train import Sandwich, distill

if __name__ == "__main__":
    torch.set_num_threads(1)
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
        max_position_embeddings=16, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, pad_token_id=0,
    )  # fmt: skip
    model = subnetact.convert(transformers.BertModel(config, add_pooling_layer=False))
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(3):
        ids = torch.randint(1, 64, (8, 12), generator=g)
        mask = (torch.arange(12)[None] < torch.randint(4, 13, (8, 1), generator=g)).long()
        batches.append({"input_ids": ids * mask, "attention_mask": mask})
    start = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    distill(model, batches, opt, epochs=2, loss="embedding", schedule=Sandwich(1), seed=0)
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    if rank == 0:
        torch.save({"start": start, "end": model.state_dict(), "world": world}, sys.argv[1])
    if distributed:
        # Every rank waits for rank 0's save before tearing gloo down: a rank that destroys its group while a peer is
        # still in it aborted once on torch 2.14.1 ("terminate called without an active exception").
        dist.barrier()
        dist.destroy_process_group()
