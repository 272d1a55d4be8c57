#!/usr/bin/env python3
"""The PyTorch data-parallel anchors: torch_loop.py's training loop over Gloo, under DDP, FSDP2's
fully_shard or ZeroRedundancyOptimizer.

    OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 2 --master_addr 127.0.0.1 \\
        --master_port PORT bench/python/torch_ddp.py --model cnn --precision fp32 --threads 1

Each rank trains the model of torch_loop.py with the same step (autocast, masters, clipping,
AdamW, linear decay) on its shard of the Fashion-MNIST epoch: the indices
torch.utils.data.DistributedSampler(shuffle=True, seed=--seed) gives it for epoch 0, i.e. every
world_size-th entry of the Trainer's epoch order, in batches of --batch_size per rank. With one
rank there is no process group and no wrapper, as in the Trainer and HF's Trainer, so the 1-rank
run is torch_loop.py on the same order. With more than one rank, --strategy picks the wrapper:

  ddp          DistributedDataParallel, whose buckets allreduce the gradients while backward
               runs; --bucket_cap_mb sets their size (unset: PyTorch's default, 25 MiB with a
               first bucket of 1 MiB; a given value applies to the first bucket too, as in DDP).
  fully_shard  FSDP2's fully_shard(model, reshard_after_forward=False): HF's
               `--fsdp shard_grad_op`. Parameters, gradients and AdamW state are sharded; the
               whole parameters stay gathered from forward to the step. With bf16_masters the
               sharded fp32 parameters are the masters and MixedPrecisionPolicy(param_dtype=
               bf16, reduce_dtype=fp32) computes in bf16, which is FSDP's form of it.
  zero         DistributedDataParallel plus ZeroRedundancyOptimizer over AdamW (ZeRO stage 1):
               only the optimizer's moments are sharded; with bf16_masters every rank still
               holds every fp32 master.
  fully_shard_blocks
               ZeRO-3, HF's `--fsdp full_shard` as FSDP2 does it per block: fully_shard(block,
               reshard_after_forward=True) on each of model.blocks, then on the root (fc_in,
               fc_out). A rank gathers one block's whole weights at a time, in forward and again
               in backward, and frees them after; the rest is as fully_shard. Only with
               --model wide_blocks, the one model built of blocks.

--model wide_blocks is defined here rather than in common.py, since only the sharding benchmark
(bench/sharded_memory) trains it: fc_in = Linear(784, --width), --num_blocks residual blocks,
each a module whose child fc = Linear(width, width) gives h + relu(fc(h)), and fc_out =
Linear(width, 10); trainer_bench's --model wide_blocks --width --num_blocks is its C++ twin
(~52.0M parameters at the defaults, 2048 and 12). Its initial weights come from --seed, as the
other models', but need not match trainer_bench's: the benchmark compares memory and speed.

Rank 0 times its own steady-state steps (all ranks move in lockstep once gradients are synced)
and prints one JSON line (every rank prints its own with --every_rank): torch_loop.py's keys,
where samples_per_second counts this rank's samples and mean_loss is averaged over the ranks,
plus world_size, rank, strategy, bucket_cap_mb (null: the default), grad_bytes (the bytes of
one gradient of the model, what DDP allreduces per step) and optimizer_state_bytes (what this
rank holds of the AdamW state, counted from the tensors: moments and step counters, and fp32
masters with their gradients where they are separate from the model), and with wide_blocks its
width and num_blocks."""

import functools
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

import common


class Block(nn.Module):
    """A residual block's branch, relu(fc(h)); WideBlocks adds h. A module of its own so that
    fully_shard_blocks can make it one FSDP2 unit."""

    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, h):
        return torch.relu(self.fc(h))


class WideBlocks(nn.Module):
    """784 -> width, `num_blocks` residual blocks of width -> width, width -> 10 (see the module's
    docstring)."""

    def __init__(self, width=2048, num_blocks=12):
        super().__init__()
        self.fc_in = nn.Linear(28 * 28, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(num_blocks))
        self.fc_out = nn.Linear(width, 10)

    def forward(self, x):
        h = torch.relu(self.fc_in(x.flatten(1)))
        for block in self.blocks:
            h = h + block(h)
        return self.fc_out(h)


# Offered by common.parser's --model; main() rebinds it to --width and --num_blocks.
common.MODELS["wide_blocks"] = WideBlocks
SHARDED = ("fully_shard", "fully_shard_blocks")


def local(t):
    """A tensor's local part: its shard for a DTensor, the tensor itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def tensor_bytes(t):
    t = local(t)
    return t.numel() * t.element_size()


def optimizer_state_bytes(optimizer, masters, sharded_masters):
    """The bytes of AdamW state this rank holds (see the module's docstring)."""
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local optimizer
    total = sum(tensor_bytes(v) for state in inner.state.values() for v in state.values()
                if isinstance(v, torch.Tensor))
    for p in masters or []:
        total += 2 * tensor_bytes(p)  # the master and its gradient
    for p in sharded_masters or []:
        total += 2 * tensor_bytes(p)
    return total


def wrap(model, masters, args, world_size):
    """(net, optimizer or None, sharded masters): the model under --strategy, and the
    optimizer a strategy needs instead of common.make_adamw."""
    if world_size == 1:
        return model, None, None
    if args.strategy in SHARDED:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy()
        if args.precision == "bf16_masters":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        per_block = args.strategy == "fully_shard_blocks"
        if per_block:
            for block in model.blocks:
                fully_shard(block, reshard_after_forward=True, mp_policy=mp)
        fully_shard(model, reshard_after_forward=per_block, mp_policy=mp)
        sharded = list(model.parameters()) if args.precision == "bf16_masters" else None
        return model, None, sharded
    kwargs = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
    net = DistributedDataParallel(model, find_unused_parameters=False, broadcast_buffers=True, **kwargs)
    if args.strategy == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        params = masters if masters is not None else list(model.parameters())
        optimizer = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                            **common.adamw_options(args))
        return net, optimizer, None
    return net, None, None


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--bucket_cap_mb", type=int,
                   help="DDP's bucket_cap_mb (default: PyTorch's, 25 MiB with a first bucket of 1 MiB)")
    p.add_argument("--strategy", choices=["ddp", "fully_shard", "zero", "fully_shard_blocks"], default="ddp",
                   help="the wrapper over more than one rank (see the module's docstring)")
    p.add_argument("--every_rank", action="store_true", help="every rank prints its JSON line")
    p.add_argument("--width", type=int, default=2048, help="wide_blocks: the blocks' width")
    p.add_argument("--num_blocks", type=int, default=12, help="wide_blocks: how many blocks")
    args = p.parse_args()
    if args.strategy == "fully_shard_blocks" and args.model != "wide_blocks":
        p.error(f"--strategy fully_shard_blocks shards model.blocks one by one; --model {args.model} has "
                "none (use --model wide_blocks)")
    for name in ("width", "num_blocks"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    common.MODELS["wide_blocks"] = functools.partial(WideBlocks, args.width, args.num_blocks)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world_size > 1:
        # A benchmark on one machine: keep Gloo's connections on the loopback interface.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo")

    images, targets, model, default_threads = common.setup(args)
    setup_rss_mib = common.status_mib("VmRSS")
    total = args.warmup + args.steps
    sampler = DistributedSampler(range(images.shape[0]), num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed)
    sampler.set_epoch(0)
    order = torch.tensor(list(sampler))
    if total * args.batch_size > order.shape[0]:
        raise SystemExit(f"warmup + steps must fit in one epoch ({order.shape[0] // args.batch_size} batches "
                         f"of {args.batch_size} per rank)")
    masters = None
    if not (world_size > 1 and args.strategy in SHARDED):
        masters = common.prepare_precision(model, args)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    net, optimizer, sharded_masters = wrap(model, masters, args, world_size)
    clock, loss_sum, optimizer = common.train_steps(net, model, masters, images, targets, order, args,
                                                    optimizer=optimizer)
    state_bytes = optimizer_state_bytes(optimizer, masters, sharded_masters)
    shape = {"width": args.width, "num_blocks": args.num_blocks} if args.model == "wide_blocks" else {}

    if world_size > 1:
        dist.all_reduce(loss_sum)
        dist.destroy_process_group()
    if rank == 0 or args.every_rank:
        common.print_result("torch_ddp", args, clock, loss_sum.item() / (world_size * total), setup_rss_mib,
                            default_threads, world_size=world_size, rank=rank,
                            strategy=args.strategy if world_size > 1 else "none",
                            bucket_cap_mb=args.bucket_cap_mb, grad_bytes=grad_bytes,
                            optimizer_state_bytes=state_bytes, **shape)


if __name__ == "__main__":
    main()
    # Everything is printed and the process group destroyed: skip the interpreter's shutdown,
    # which with PyTorch 2.11's Gloo group sometimes aborts ("terminate called without an active
    # exception"; tests/ddp/torch_ddp_reference.py does the same).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
