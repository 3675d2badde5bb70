"""One rank of the tensor-parallel check: a saved random-weight Llama-style model loaded with
transformers' ``tp_plan="auto"`` and the ``"attnc"`` attention implementation, run on the saved
token ids and then one decode step over its KV cache; rank 0 writes both logits. Started by
``torchrun --nproc-per-node 2``."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

import attnc.integrations.transformers  # noqa: F401  (registers "attnc")


def prompt_and_step_logits(model, ids: torch.Tensor, step_ids: torch.Tensor) -> dict:
    """Float32 logits of the prompt and of one decode step (``step_ids``) over its cache."""
    first = model(ids, use_cache=True)
    step = model(step_ids, past_key_values=first.past_key_values, use_cache=True)
    return {"prompt": first.logits.float().cpu(), "step": step.logits.float().cpu()}


def main(model_dir: str, out_path: str) -> None:
    """Load the model sharded over the ranks, run the prompt and a decode step, save rank 0's
    logits."""
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, tp_plan="auto", dtype=torch.bfloat16, attn_implementation="attnc"
    )
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    ids = torch.load(os.path.join(model_dir, "ids.pt")).to(device)
    step_ids = torch.load(os.path.join(model_dir, "step_ids.pt")).to(device)
    with torch.no_grad():
        logits = prompt_and_step_logits(model, ids, step_ids)
    if rank == 0:
        torch.save(logits, out_path)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
