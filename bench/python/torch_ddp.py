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

Rank 0 times its own steady-state steps (all ranks move in lockstep once gradients are synced)
and prints one JSON line (every rank prints its own with --every_rank): torch_loop.py's keys,
where samples_per_second counts this rank's samples and mean_loss is averaged over the ranks,
plus world_size, rank, strategy, bucket_cap_mb (null: the default), grad_bytes (the bytes of
one gradient of the model, what DDP allreduces per step) and optimizer_state_bytes (what this
rank holds of the AdamW state, counted from the tensors: moments and step counters, and fp32
masters with their gradients where they are separate from the model)."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

import common


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
    if args.strategy == "fully_shard":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy()
        if args.precision == "bf16_masters":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fully_shard(model, reshard_after_forward=False, mp_policy=mp)
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
    p.add_argument("--strategy", choices=["ddp", "fully_shard", "zero"], default="ddp",
                   help="the wrapper over more than one rank (see the module's docstring)")
    p.add_argument("--every_rank", action="store_true", help="every rank prints its JSON line")
    args = p.parse_args()
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
    if not (world_size > 1 and args.strategy == "fully_shard"):
        masters = common.prepare_precision(model, args)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    net, optimizer, sharded_masters = wrap(model, masters, args, world_size)
    clock, loss_sum, optimizer = common.train_steps(net, model, masters, images, targets, order, args,
                                                    optimizer=optimizer)
    state_bytes = optimizer_state_bytes(optimizer, masters, sharded_masters)

    if world_size > 1:
        dist.all_reduce(loss_sum)
        dist.destroy_process_group()
    if rank == 0 or args.every_rank:
        common.print_result("torch_ddp", args, clock, loss_sum.item() / (world_size * total), setup_rss_mib,
                            default_threads, world_size=world_size, rank=rank,
                            strategy=args.strategy if world_size > 1 else "none",
                            bucket_cap_mb=args.bucket_cap_mb, grad_bytes=grad_bytes,
                            optimizer_state_bytes=state_bytes)


if __name__ == "__main__":
    main()
    # Everything is printed and the process group destroyed: skip the interpreter's shutdown,
    # which with PyTorch 2.11's Gloo group sometimes aborts ("terminate called without an active
    # exception"; tests/ddp/torch_ddp_reference.py does the same).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
