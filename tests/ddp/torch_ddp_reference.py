#!/usr/bin/env python3
"""PyTorch DDP reference run for the parity test of mantissa's data-parallel Trainer (issue 14).

    .venv/bin/torchrun --nproc_per_node 2 --master_addr 127.0.0.1 --master_port PORT \\
        tests/ddp/torch_ddp_reference.py --out ref.safetensors [--precision bf16 ...]

With --strategy fully_shard the model is wrapped by FSDP2's fully_shard(model,
reshard_after_forward=False) instead of DDP: SHARD_GRAD_OP, the reference of mantissa's
--fsdp shard_grad_op (issue 23). Every rank builds the same initial weights (seed 1), FSDP2
keeps its shard of them, gradients are reduce-scattered, AdamW updates each rank's shard of
the DTensor parameters, and micro-batches that do not end a group run with
set_requires_gradient_sync(False) instead of no_sync().

--blocks N (N > 0) puts N residual blocks of width 32 between fc1 and fc2, the twin of the
C++ checks' block model: each block is a module holding one Linear(32, 32) named `fc`, and
adds relu(fc(h)) to its input. --strategy fully_shard_blocks is then ZeRO-3 as FSDP2 spells it,
the reference of mantissa's --fsdp full_shard: fully_shard(block, reshard_after_forward=True)
on every block, one communication unit each, then fully_shard(model,
reshard_after_forward=True) on the root for fc1 and fc2. A block's whole weights exist only
while its forward or backward runs; accumulation micro-batches skip the gradient
reduce-scatter the same way as fully_shard. --gradient_checkpointing recomputes each block's
relu(fc(h)) in the backward instead of keeping its activations (torch.utils.checkpoint,
use_reentrant=False, training only; the residual sum stays outside the recomputed part).

Every rank trains the same small classifier with torch.nn.parallel.DistributedDataParallel on
Gloo, following the steps a Hugging Face Trainer (transformers 5) takes for the same arguments,
written out in plain PyTorch so that nothing is hidden behind accelerate:

  data       torch.manual_seed(0); x = randn(N, 20), y = randint(0, 4, (N,)), the same on
             every rank.
  model      torch.manual_seed(1); fc1 = Linear(20, 32), ReLU, fc2 = Linear(32, 4), wrapped in
             DDP (bucket_cap_mb=25, broadcast_buffers, no unused-parameter search), which copies
             rank 0's weights to the others before the first step. With --blocks N the layers
             are created in the order fc1, blocks.0.fc, ..., blocks.{N-1}.fc, fc2 under that
             seed, and the forward is h = relu(fc1(x)), h = h + relu(blocks[i].fc(h)) for each
             block in turn, fc2(h). There is no dropout in either model.
  order      DistributedSampler(shuffle=True, seed=--seed, drop_last=False) with set_epoch(e)
             at the start of epoch e, batches of --per_device_train_batch_size in that order
             (the last batch of an epoch may be shorter). Epochs repeat until --max_steps
             optimizer steps are done.
  grouping   an epoch's batches are cut into groups of --gradient_accumulation_steps from its
             start; each group ends with an optimizer step. When the epoch's batch count is not a
             multiple, its last group is shorter, and (as HF 5's Trainer does, through
             current_gradient_accumulation_steps) each loss of that group is divided by the
             group's real length instead of gradient_accumulation_steps, so the update is still
             the mean over the group's batches.
  micro-step forward and mean cross-entropy (under torch.autocast("cpu", bfloat16) with
             --precision bf16; the weights stay fp32), loss / group length, backward. Every
             micro-batch but the group's last runs under ddp.no_sync(), so gradients are
             averaged over the ranks once per optimizer step.
  update     clip_grad_norm_(max_grad_norm) when it is > 0, AdamW (betas 0.9/0.999, eps 1e-8,
             no weight decay, the single-tensor loop: foreach and fused off) at a constant
             learning rate, zero_grad(set_to_none=True).

One CPU thread per rank. Rank 0 prints a line per optimizer step and writes --out with the
safetensors package (to OUT.tmp first, then renamed over OUT, so a reader never sees half a
file):

  data.x [N, 20] float32, data.y [N] int64   the data set
  init.<name>                                the weights every rank starts step 1 with
  final.<name>                               the weights after --max_steps steps
  step_loss [max_steps] float32              per optimizer step, the sum of its micro-batches'
                                             divided losses, averaged over the ranks: the loss
                                             HF logs for that step with logging_steps=1

with <name> in fc1.weight, fc1.bias, fc2.weight, fc2.bias (with --blocks N also
blocks.<i>.fc.weight and blocks.<i>.fc.bias for i < N), and every option used (among them
blocks, strategy and gradient_checkpointing; plus the world size and the torch version) as
string metadata.

With N a multiple of world_size x batch size, one process with batch B x world_size follows the
same trajectory as world_size processes with batch B, up to float rounding: the union of the
ranks' k-th batches is the single process's k-th batch, and DDP's gradient average equals the
gradient of the mean loss over that union."""

import argparse
import collections
import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="safetensors file rank 0 writes")
    p.add_argument("--num_examples", type=int, default=256)
    p.add_argument("--per_device_train_batch_size", type=int, default=16)
    p.add_argument("--gradient_accumulation_steps", type=int, default=2)
    p.add_argument("--max_steps", type=int, default=6, help="optimizer steps to take")
    p.add_argument("--learning_rate", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=42, help="the sampler's seed (HF: data_seed or seed)")
    p.add_argument("--max_grad_norm", type=float, default=1.0, help="0 turns clipping off")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: forward and loss under CPU bf16 autocast, fp32 weights")
    p.add_argument("--strategy", choices=["ddp", "fully_shard", "fully_shard_blocks"], default="ddp",
                   help="fully_shard: FSDP2 on the whole model with reshard_after_forward=False "
                        "(SHARD_GRAD_OP); fully_shard_blocks: FSDP2 on every block, then on the root, "
                        "with reshard_after_forward=True (FULL_SHARD; needs --blocks)")
    p.add_argument("--blocks", type=int, default=0,
                   help="residual blocks of width 32 between fc1 and fc2 (0: the plain two-layer model)")
    p.add_argument("--gradient_checkpointing", action="store_true",
                   help="recompute every block's relu(fc(h)) in the backward (needs --blocks)")
    args = p.parse_args()
    for name in ("num_examples", "per_device_train_batch_size", "gradient_accumulation_steps", "max_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.blocks < 0:
        p.error(f"--blocks must not be negative, got {args.blocks}")
    if args.strategy == "fully_shard_blocks" and args.blocks == 0:
        p.error("--strategy fully_shard_blocks shards block by block, so it needs --blocks 1 or more")
    if args.gradient_checkpointing and args.blocks == 0:
        p.error("--gradient_checkpointing recomputes the blocks, so it needs --blocks 1 or more")
    if args.max_grad_norm < 0:
        p.error(f"--max_grad_norm must not be negative, got {args.max_grad_norm}")
    return args


def make_data(num_examples):
    torch.manual_seed(0)
    x = torch.randn(num_examples, 20)
    y = torch.randint(0, 4, (num_examples,))
    return x, y


class Block(nn.Module):
    """One residual block's branch: relu(fc(h)). The caller adds h, so that gradient
    checkpointing recomputes the branch alone, and FSDP2's hooks on the block wrap exactly the
    part that uses its weights."""

    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, h):
        return torch.relu(self.fc(h))


class BlockMlp(nn.Module):
    """fc1, `num_blocks` residual blocks, fc2 (see the module's docstring)."""

    def __init__(self, num_blocks, gradient_checkpointing):
        super().__init__()
        self.fc1 = nn.Linear(20, 32)
        self.blocks = nn.ModuleList(Block(32) for _ in range(num_blocks))
        self.fc2 = nn.Linear(32, 4)
        self.gradient_checkpointing = gradient_checkpointing

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        for block in self.blocks:
            # The block itself is the function checkpointed, not block.fc: under
            # fully_shard_blocks its FSDP2 hooks gather the weights before fc runs.
            if self.gradient_checkpointing and self.training:
                h = h + checkpoint(block, h, use_reentrant=False)
            else:
                h = h + block(h)
        return self.fc2(h)


def make_model(num_blocks=0, gradient_checkpointing=False):
    torch.manual_seed(1)
    if num_blocks > 0:
        return BlockMlp(num_blocks, gradient_checkpointing)
    return nn.Sequential(collections.OrderedDict(
        fc1=nn.Linear(20, 32), relu=nn.ReLU(), fc2=nn.Linear(32, 4)))


def weights(module, prefix):
    """The module's parameters as fresh contiguous tensors, named `prefix.<parameter name>`;
    a sharded (DTensor) parameter is gathered whole first."""
    def whole(p):
        return p.full_tensor() if hasattr(p, "full_tensor") else p
    return {f"{prefix}.{name}": whole(p.detach()).clone().contiguous() for name, p in module.named_parameters()}


class ShardedModel:
    """FSDP2 behind the two things train() asks of a DDP object: `.module` and a `no_sync()`
    context. `per_block` False: fully_shard(model, reshard_after_forward=False), one unit
    (SHARD_GRAD_OP). True: fully_shard(block, reshard_after_forward=True) on each of
    model.blocks, then the same on the root, which keeps fc1 and fc2 (FULL_SHARD)."""

    def __init__(self, model, per_block=False):
        from torch.distributed.fsdp import fully_shard
        if per_block:
            for block in model.blocks:
                fully_shard(block, reshard_after_forward=True)
        fully_shard(model, reshard_after_forward=per_block)
        self.module = model

    def __call__(self, x):
        return self.module(x)

    def parameters(self):
        return self.module.parameters()

    def train(self):
        self.module.train()

    @contextlib.contextmanager
    def no_sync(self):
        # On the root this reaches every fully_shard module under it (recurse=True).
        self.module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)


def accumulation_groups(loader, group_size):
    """The epoch's batches in groups of `group_size`; the last group holds what is left."""
    group = []
    for batch in loader:
        group.append(batch)
        if len(group) == group_size:
            yield group
            group = []
    if group:
        yield group


def train(args, rank, world_size):
    """Runs the training; returns (initial weights, final weights, loss of each step)."""
    x, y = make_data(args.num_examples)
    dataset = TensorDataset(x, y)
    model = make_model(args.blocks, args.gradient_checkpointing)
    if args.strategy in ("fully_shard", "fully_shard_blocks"):
        ddp = ShardedModel(model, per_block=args.strategy == "fully_shard_blocks")
    else:
        ddp = DistributedDataParallel(model, find_unused_parameters=False,
                                      broadcast_buffers=True, bucket_cap_mb=25)
    init = weights(ddp.module, "init")
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=args.learning_rate, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=0.0, foreach=False, fused=False)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed,
                                 drop_last=False)
    loader = DataLoader(dataset, batch_size=args.per_device_train_batch_size, sampler=sampler, shuffle=False,
                        drop_last=False)
    bf16 = args.precision == "bf16"
    ddp.train()
    step_loss = []
    epoch = 0
    while len(step_loss) < args.max_steps:
        sampler.set_epoch(epoch)
        for group in accumulation_groups(loader, args.gradient_accumulation_steps):
            loss_sum = torch.zeros(())
            for i, (xb, yb) in enumerate(group):
                last = i == len(group) - 1
                with contextlib.nullcontext() if last else ddp.no_sync():
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                        loss = F.cross_entropy(ddp(xb), yb)
                    loss = loss / len(group)
                    loss.backward()
                loss_sum += loss.detach().float()
            if args.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(ddp.parameters(), args.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            dist.all_reduce(loss_sum)
            step_loss.append(loss_sum.item() / world_size)
            if rank == 0:
                print(f"step {len(step_loss)} epoch {epoch} micro-batches {len(group)} loss {step_loss[-1]:.6f}",
                      flush=True)
            if len(step_loss) == args.max_steps:
                break
        epoch += 1
    return init, weights(ddp.module, "final"), torch.tensor(step_loss, dtype=torch.float32)


def write(path, tensors, metadata):
    tmp = path + ".tmp"
    save_file(tensors, tmp, metadata=metadata)
    os.replace(tmp, path)


def main():
    args = parse_args()
    torch.set_num_threads(1)
    # A test on one machine: keep Gloo's connections on the loopback interface.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    try:
        init, final, step_loss = train(args, rank, world_size)
        if rank == 0:
            x, y = make_data(args.num_examples)
            metadata = {k: str(v) for k, v in vars(args).items() if k != "out"}
            metadata.update(world_size=str(world_size), torch=torch.__version__)
            write(args.out, {"data.x": x, "data.y": y, **init, **final, "step_loss": step_loss}, metadata)
            print(f"wrote {args.out}", flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # The results are written and the process group destroyed. Skip the interpreter's own
    # shutdown: with PyTorch 2.11 it sometimes aborts there ("terminate called without an
    # active exception", no Python frame left; about 1 run in 15 on a 2-core machine), and
    # torchrun then fails the whole run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
