#!/usr/bin/env python3
"""The PyTorch DDP anchor: torch_loop.py's training loop, data parallel over Gloo.

    OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 2 --master_addr 127.0.0.1 \\
        --master_port PORT bench/python/torch_ddp.py --model cnn --precision fp32 --threads 1

Each rank trains the model of torch_loop.py with the same step (autocast, masters, clipping,
AdamW, linear decay) on its shard of the Fashion-MNIST epoch: the indices
torch.utils.data.DistributedSampler(shuffle=True, seed=--seed) gives it for epoch 0, i.e. every
world_size-th entry of the Trainer's epoch order, in batches of --batch_size per rank. With
more than one rank the model is wrapped in DistributedDataParallel (Gloo), whose buckets
allreduce the gradients while backward runs; --bucket_cap_mb sets their size (unset: PyTorch's
default, 25 MiB with a first bucket of 1 MiB; a given value applies to the first bucket too, as
in DDP itself). With one rank there is no process group and no DDP wrapper, as in the Trainer
and HF's Trainer, so the 1-rank run is torch_loop.py on the same order.

Rank 0 times its own steady-state steps (all ranks move in lockstep once gradients are synced)
and prints one JSON line: torch_loop.py's keys, where samples_per_second counts this rank's
samples and mean_loss is averaged over the ranks, plus world_size, bucket_cap_mb (null: the
default) and grad_bytes (the bytes of one gradient of the model, what DDP allreduces per step)."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

import common


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--bucket_cap_mb", type=int,
                   help="DDP's bucket_cap_mb (default: PyTorch's, 25 MiB with a first bucket of 1 MiB)")
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
    masters = common.prepare_precision(model, args)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    net = model
    if world_size > 1:
        kwargs = {} if args.bucket_cap_mb is None else {"bucket_cap_mb": args.bucket_cap_mb}
        net = DistributedDataParallel(model, find_unused_parameters=False, broadcast_buffers=True, **kwargs)
    clock, loss_sum = common.train_steps(net, model, masters, images, targets, order, args)

    if world_size > 1:
        dist.all_reduce(loss_sum)
        dist.destroy_process_group()
    if rank == 0:
        common.print_result("torch_ddp", args, clock, loss_sum.item() / (world_size * total), setup_rss_mib,
                            default_threads, world_size=world_size, bucket_cap_mb=args.bucket_cap_mb,
                            grad_bytes=grad_bytes)


if __name__ == "__main__":
    main()
