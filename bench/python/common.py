"""What the Python anchors share with build/bench/trainer_bench: the data, the models, the data
order, the command line, the training step, the step clock and the JSON line.

Each piece mirrors its C++ counterpart, named in its docstring, so that both sides train the
same model on the same batches in the same order."""

import argparse
import gzip
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
# Fashion-MNIST's train-set mean and standard deviation (examples/common/idx_dataset.cpp).
MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    """An IDX file of unsigned bytes (gzip-compressed) as a uint8 tensor (read_idx in C++)."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    assert raw[:3] == b"\0\0\x08", f"{path}: not an IDX file of unsigned bytes"
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * d : 8 + 4 * d], "big") for d in range(dims)]
    data = bytearray(raw[4 + 4 * dims :])
    return torch.frombuffer(data, dtype=torch.uint8).reshape(shape)


def load_train(data_dir=FASHION_MNIST_DIR):
    """The 60000 training images as float [N, 1, 28, 28], normalised with the same ops in the
    same order as mantissa::examples::FashionMnist, and the labels as int64 [N]."""
    images = read_idx(f"{data_dir}/train-images-idx3-ubyte.gz")
    labels = read_idx(f"{data_dir}/train-labels-idx1-ubyte.gz")
    images = images.unsqueeze(1).to(torch.float).div_(255.0).sub_(MEAN).div_(STD)
    return images, labels.to(torch.long)


def epoch_order(n, seed):
    """The Trainer's order of epoch 0: randperm(n) from a CPU generator seeded with data_seed
    (= seed), as src/trainer/trainer_loop.cpp draws it."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


class FashionCnn(nn.Module):
    """examples/common/fashion_models.h's FashionCnn, layer for layer."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)
        self.dropout = nn.Dropout(0.25)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = self.dropout(torch.relu(self.fc1(x.flatten(1))))
        return self.fc2(x)


class FashionMlp(nn.Module):
    """examples/common/fashion_models.h's FashionMlp: 784-hidden-hidden-10 (hidden 256 by default;
    FashionWideMlp is hidden 4096, ~20.0M parameters)."""

    def __init__(self, hidden=256):
        super().__init__()
        self.fc1 = nn.Linear(28 * 28, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = torch.relu(self.fc1(x.flatten(1)))
        x = torch.relu(self.fc2(x))
        return self.fc3(x)


def FashionWideMlp():
    return FashionMlp(hidden=4096)


MODELS = {"mlp": FashionMlp, "cnn": FashionCnn, "wide_mlp": FashionWideMlp}


def parser(description, precisions=("fp32", "bf16", "bf16_masters")):
    """trainer_bench's flags, with its defaults."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", choices=sorted(MODELS), default="mlp")
    p.add_argument("--precision", choices=precisions, default="bf16")
    p.add_argument("--optim", choices=["adamw_torch", "adamw_torch_fused"], default="adamw_torch_fused")
    p.add_argument("--steps", type=int, default=200, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps before them")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data_dir", default=FASHION_MNIST_DIR)
    return p


def setup(args):
    """Threads, data and the model, as trainer_bench sets them up. Returns (images, targets,
    model, default_threads)."""
    default_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    images, targets = load_train(args.data_dir)
    if (args.warmup + args.steps) * args.batch_size > images.shape[0]:
        raise SystemExit(f"warmup + steps must fit in one epoch ({images.shape[0] // args.batch_size} batches)")
    torch.manual_seed(args.seed)
    return images, targets, MODELS[args.model](), default_threads


def prepare_precision(model, args):
    """bf16_masters: casts the model to bf16 and returns fp32 master copies of its parameters
    (what the optimizer updates); other precisions: None, the model stays fp32."""
    if args.precision != "bf16_masters":
        return None
    model.to(torch.bfloat16)
    return [p.detach().float() for p in model.parameters()]


def adamw_options(args):
    """The anchors' AdamW options: weight decay 0, fused=True for adamw_torch_fused, else the
    single-tensor loop."""
    fused = args.optim == "adamw_torch_fused"
    return dict(lr=args.lr, weight_decay=0.0, fused=fused or None, foreach=None if fused else False)


def make_adamw(params, args):
    """The anchors' AdamW over `params` (adamw_options)."""
    return torch.optim.AdamW(params, **adamw_options(args))


def train_steps(net, model, masters, images, targets, order, args, optimizer=None):
    """The step trainer_bench times, --warmup + --steps times over `order` in batches of
    --batch_size: forward and cross-entropy under bf16 autocast (bf16, bf16_masters) or in fp32,
    backward, master gradients, clip_grad_norm_(1.0), AdamW (make_adamw, unless `optimizer` is
    given over the same parameters), the masters copied back, HF's linear decay as a LambdaLR,
    zero_grad. `net` runs the forward (the model, or its DDP wrapper). Returns the StepClock, the
    sum of the step losses (a 0-d tensor) and the optimizer."""
    bf16 = args.precision != "fp32"
    params = masters if masters is not None else list(model.parameters())
    if optimizer is None:
        optimizer = make_adamw(params, args)
    total = args.warmup + args.steps
    # transformers.get_linear_schedule_with_warmup with no warmup.
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, (total - step) / max(1, total)))

    torch.manual_seed(args.seed)  # dropout, as the Trainer seeds at train()
    net.train()
    loss_sum = torch.zeros((), dtype=torch.float)
    clock = StepClock(args.warmup, total)
    for step in range(total):
        index = order[step * args.batch_size:(step + 1) * args.batch_size]
        x, y = images.index_select(0, index), targets.index_select(0, index)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        loss_sum += loss.detach().float()
        if masters is not None:
            for master, param in zip(masters, model.parameters()):
                master.grad = param.grad.float()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if masters is not None:
            with torch.no_grad():
                for master, param in zip(masters, model.parameters()):
                    param.copy_(master)
        scheduler.step()
        optimizer.zero_grad()
        if masters is not None:
            model.zero_grad()
        clock.step_ended(step + 1)
    return clock, loss_sum, optimizer


def status_mib(key):
    """A line of /proc/self/status in MiB ("VmRSS", "VmHWM")."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024.0
    return -1.0


class StepClock:
    """Wall time and the process's CPU time (all threads) from the end of step `warmup` to the
    end of step `warmup + steps`, and the wall time of each timed step (trainer_bench's
    StepClock)."""

    def __init__(self, warmup, total):
        self.warmup, self.total = warmup, total
        self.start = self.end = self.cpu_start = self.cpu_end = self.last = None
        self.step_seconds = []

    def step_ended(self, completed):
        now = time.perf_counter()
        if self.warmup < completed <= self.total:
            self.step_seconds.append(now - self.last)
        self.last = now
        if completed == self.warmup:
            self.start, self.cpu_start = now, time.process_time()
        if completed == self.total:
            self.end, self.cpu_end = now, time.process_time()

    def seconds(self):
        return self.end - self.start

    def cpu_seconds(self):
        return self.cpu_end - self.cpu_start

    def median_step_seconds(self):
        return statistics.median(self.step_seconds)


def print_result(impl, args, clock, mean_loss, setup_rss_mib, default_threads, **extra):
    """trainer_bench's JSON line, with the same keys, then the `extra` ones. Written with one
    write() so that the lines of ranks sharing a pipe do not interleave."""
    sys.stdout.write(json.dumps({
        "bench": "trainer_anchor", "impl": impl, "model": args.model, "precision": args.precision,
        "optim": args.optim, "batch_size": args.batch_size, "warmup": args.warmup, "steps": args.steps,
        "threads": torch.get_num_threads(), "default_threads": default_threads,
        "seconds": round(clock.seconds(), 6), "cpu_seconds": round(clock.cpu_seconds(), 6),
        "median_step_ms": round(1e3 * clock.median_step_seconds(), 4),
        "steps_per_second": round(args.steps / clock.seconds(), 3),
        "samples_per_second": round(args.steps * args.batch_size / clock.seconds(), 1),
        "mean_loss": round(mean_loss, 5), "setup_rss_mib": round(setup_rss_mib, 1),
        "peak_rss_mib": round(status_mib("VmHWM"), 1), "torch": torch.__version__, **extra,
    }) + "\n")
    sys.stdout.flush()
