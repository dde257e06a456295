"""Train a small decoder-only transformer (a GPT) on token records with FSDP2 under torchrun, each rank
reading its own Pipe-mode channel (the demo of ``sagemaker-dist local --demo --distribution torchrun
--model gpt``; no TensorFlow needed).

Each record is a run of ``context + 1`` little-endian uint16 tokens (``local/demo_data.py`` writes them):
``RecordBatches(record_bytes=...)`` frames them straight into ``[batch, 2 * (context + 1)]`` uint8
tensors, viewed as tokens; the model reads ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]``. Every
block and the whole model are sharded with ``fully_shard`` (FSDP2), so ``PipeTraining`` checkpoints
them sharded: every rank writes its shard through DCP, in the background every ``--checkpoint-every``
steps and at each epoch's end, and at once on a stop; a resume (on any number of ranks) loads them
back. The toolkit passes the hyperparameters as ``--name value``:

    --epochs 2 --batch-size 16 --learning-rate 0.001 (scaled by the rank count) [--checkpoint-every 8]
    [--log-every 4]
    [--tensorboard-s3-uri s3://bucket/tb/job] [--tensorboard-interval 30]

Rank 0 prints the step's loss (averaged over the ranks) every ``--log-every`` steps, the metric line at each
epoch's end, and saves the whole model (gathered from the shards) to ``$SM_MODEL_DIR/model.pt``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from train_torch import parse_args as demo_arguments  # the source dir's other script: on sys.path
from train_torch import reader_shuffle

from sagemaker_dist.contract.paths import opt_ml_root
from sagemaker_dist.runtime import PipeTraining, RecordBatches, ddp_main, setup_ddp

VOCAB = 512  # the demo data's (local/demo_data.py: TOKEN_VOCAB, TOKEN_CONTEXT)
CONTEXT = 64


def parse_args(argv=None) -> argparse.Namespace:
    """The torch demo's hyperparameters (``train_torch.py`` beside this script), and this one's."""

    def more(arg):
        arg("checkpoint-every", type=int, default=8, help="steps between background checkpoints")
        arg("log-every", type=int, default=4, help="steps between loss lines (rank 0)")

    return demo_arguments(argv, description=__doc__.splitlines()[0], more=more, batch_size=16)


class Block(torch.nn.Module):
    """Pre-norm causal self-attention and an MLP, each added to the residual stream."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attn_norm, self.mlp_norm = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.attn = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.mlp_norm(x))


class GPT(torch.nn.Module):
    """Token and position embeddings, ``layers`` blocks, a final norm and the next-token head."""

    def __init__(
        self, vocab: int = VOCAB, context: int = CONTEXT, width: int = 64, layers: int = 2, heads: int = 4
    ):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, width)
        self.positions = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.tokens(tokens) + self.positions(torch.arange(length, device=tokens.device))
        mask = torch.ones(length, length, dtype=torch.bool, device=tokens.device).triu(1)  # no peeking
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def sharded_model(device: torch.device) -> torch.nn.Module:
    """The GPT with each block, then the whole model, sharded over the ranks (FSDP2)."""
    torch.manual_seed(0)
    model = GPT().to(device)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


@ddp_main
def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    job = setup_ddp()
    model = sharded_model(job.device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.learning_rate * job.world_size, weight_decay=0.01
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / 10)
    )  # warm-up
    tokens = RecordBatches(
        job, args.batch_size, record_bytes=2 * (CONTEXT + 1), shuffle=reader_shuffle(args), device=job.device
    )
    training = PipeTraining(
        job,
        model,
        optimizer,
        scheduler,
        epochs=args.epochs,
        checkpoint_every_steps=args.checkpoint_every,
        tensorboard_s3_uri=args.tensorboard_s3_uri,
        tensorboard_interval=args.tensorboard_interval,
    )
    if job.is_chief:  # a sharded parameter (a DTensor) counts its whole size
        print(f"a GPT of {sum(p.numel() for p in model.parameters()):,} parameters sharded over "
              f"{job.world_size} rank(s); guessing uniformly scores a loss of {math.log(VOCAB):.2f}",
              flush=True)  # fmt: skip
    for epoch in training.epochs():
        losses = []
        for raw in training.batches(tokens):
            batch = raw.view(torch.uint16).long()  # [n, context + 1] token ids
            optimizer.zero_grad()
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.item())
            step = training.step + 1
            if step % args.log_every == 0:  # this step's loss over every rank's batch
                mean = job.mean({"loss": losses[-1]})["loss"]
                if job.is_chief:
                    print(f"epoch {epoch + 1} step {step}: loss {mean:.4f}", flush=True)
        training.end_epoch(loss=sum(losses) / max(len(losses), 1))
    print(f"rank {job.rank}: trained {tokens.records} record(s)", flush=True)
    # the whole model gathered from the shards (a collective: every rank takes part), saved by rank 0
    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if job.is_chief:
        model_dir = args.model_dir or os.environ.get("SM_MODEL_DIR") or str(opt_ml_root() / "model")
        os.makedirs(model_dir, exist_ok=True)
        torch.save(whole, os.path.join(model_dir, "model.pt"))
        print(f"model saved to {model_dir}/model.pt", flush=True)
    job.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
