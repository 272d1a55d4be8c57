#!/usr/bin/env python3
"""The Hugging Face anchor: the same run through transformers.Trainer on the CPU.

    .venv/bin/python bench/python/hf_trainer.py --model cnn --precision bf16 --steps 150 --warmup 20

The model is common.py's, wrapped to take `pixel_values` and `labels` and return
{"loss", "logits"} (no hub access). The dataset yields one example at a time, as HF datasets
do, in the Trainer's epoch-0 order (train_sampling_strategy="sequential" over the permuted
indices), and HF's default collator stacks them. TrainingArguments: use_cpu, bf16 for the bf16
mode (accelerate's CPU autocast; HF has no bf16-model-with-fp32-masters mode, so bf16_masters
is not offered), optim adamw_torch_fused or adamw_torch, weight decay 0, linear decay,
max_grad_norm 1.0, no logging, no saving, no progress bar, no workers.

Timed: from on_step_end of step --warmup to on_step_end of step --warmup + --steps (a
TrainerCallback), so model setup, accelerate's preparation and the first steps are not.
Prints one JSON line (trainer_bench's keys)."""

import os
import tempfile
import warnings

import torch
import torch.nn.functional as F
from torch import nn

import common


class WithLoss(nn.Module):
    """HF's model contract: keyword inputs, a dict with the loss."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, pixel_values, labels=None):
        logits = self.net(pixel_values)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


class OrderedExamples(torch.utils.data.Dataset):
    """Example i is image order[i]: the Trainer's epoch-0 order, read sequentially."""

    def __init__(self, images, targets, order):
        self.images, self.targets, self.order = images, targets, order.tolist()

    def __len__(self):
        return len(self.order)

    def __getitem__(self, i):
        j = self.order[i]
        return {"pixel_values": self.images[j], "labels": self.targets[j]}


def main():
    args = common.parser(__doc__.splitlines()[0], precisions=("fp32", "bf16")).parse_args()
    images, targets, net, default_threads = common.setup(args)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore")
    import transformers  # after the thread setting; takes seconds

    model = WithLoss(net)
    dataset = OrderedExamples(images, targets, common.epoch_order(images.shape[0], args.seed))
    setup_rss_mib = common.status_mib("VmRSS")
    total = args.warmup + args.steps
    clock = common.StepClock(args.warmup, total)

    class StepClockCallback(transformers.TrainerCallback):
        def on_step_end(self, training_args, state, control, **kwargs):
            clock.step_ended(state.global_step)

    with tempfile.TemporaryDirectory(prefix="hf-trainer-bench-") as output_dir:
        training_args = transformers.TrainingArguments(
            output_dir=output_dir, use_cpu=True, bf16=args.precision == "bf16", max_steps=total,
            per_device_train_batch_size=args.batch_size, learning_rate=args.lr, optim=args.optim,
            weight_decay=0.0, lr_scheduler_type="linear", max_grad_norm=1.0, seed=args.seed,
            train_sampling_strategy="sequential", dataloader_num_workers=0, logging_strategy="no",
            save_strategy="no", report_to=[], disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=training_args, train_dataset=dataset,
                                       callbacks=[StepClockCallback()])
        result = trainer.train()
    # HF's TrainOutput.training_loss: the mean loss over every step, as the C++ Trainer's.
    common.print_result("hf", args, clock, result.training_loss, setup_rss_mib, default_threads)


if __name__ == "__main__":
    main()
