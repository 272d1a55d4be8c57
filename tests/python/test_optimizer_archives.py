"""The C++ Trainer's optimizer.pt of adafactor, muon and adamw_torch_8bit (written by
tests/python/optimizer_archive_writer.cpp after 4 steps on fixed parameters and gradients) read
by mantissa.optim's loaders into the Python optimizers they follow: HF's Adafactor,
torch.optim.Muon + AdamW and torchao's AdamW8bit. The same 4 steps run in Python; the loaded
state must be the Python optimizer's own (within the parity tolerances of docs/optimizers.md),
load into that optimizer, and continue as it does. Run by CTest (python.optimizer_archives)
after python.install_package:  python -m unittest -v test_optimizer_archives
MANTISSA_OPTIMIZER_ARCHIVE_WRITER names the C++ helper.
"""

import os
import subprocess
import tempfile
import unittest
import warnings

import torch

from mantissa.optim import (load_adafactor_pt, load_adamw_8bit_pt, load_muon_pt,
                            load_optimizer_pt)

STEPS = 4
NAMES = ("embed.weight", "w", "b")
SHAPES = ((32, 16), (64, 64), (64,))


def wave(shape, rate, offset, scale):
    n = 1
    for d in shape:
        n *= d
    return (torch.arange(n, dtype=torch.float32).mul(rate).add(offset).sin() * scale).view(shape)


def initial_params():
    return [wave(shape, 0.1, float(k), 0.5).requires_grad_() for k, shape in enumerate(SHAPES)]


def set_grads(params, step):
    for k, p in enumerate(params):
        p.grad = wave(SHAPES[k], 0.05, step + float(k), 0.1)


def write_cpp(optim, folder, optim_args=None):
    helper = os.environ.get("MANTISSA_OPTIMIZER_ARCHIVE_WRITER")
    if not helper or not os.path.isfile(helper):
        raise AssertionError("MANTISSA_OPTIMIZER_ARCHIVE_WRITER must name the built "
                             f"optimizer_archive_writer (got {helper!r}); CTest sets it")
    command = [helper, optim, folder] + (["--optim_args", optim_args] if optim_args else [])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(command)} failed:\n{done.stderr}")
    return os.path.join(folder, "optimizer.pt")


def run_python(make, params, steps):
    optimizers = make(params)
    for step in steps:
        set_grads(params, step)
        for optimizer in optimizers:
            optimizer.step()
    return optimizers


class OptimizerArchiveTest(unittest.TestCase):
    def assert_close(self, cpp, python, rtol, atol, what):
        self.assertEqual(tuple(cpp.shape), tuple(python.shape), what)
        difference = (cpp.float() - python.float()).abs().max().item() if cpp.numel() else 0.0
        self.assertTrue(torch.allclose(cpp.float(), python.float(), rtol=rtol, atol=atol),
                        f"{what}: max |difference| {difference}")

    def continue_both(self, make, python_optimizers, loaded_state_dicts, params):
        """The Python run's optimizers and fresh ones loaded from the C++ file take step 5 from
        the same weights: their states must then agree as they did before."""
        fresh_params = [p.detach().clone().requires_grad_() for p in params]
        fresh = make(fresh_params)
        for optimizer, state_dict in zip(fresh, loaded_state_dicts):
            optimizer.load_state_dict(state_dict)
        for optimizers, weights in ((python_optimizers, params), (fresh, fresh_params)):
            set_grads(weights, STEPS + 1)
            for optimizer in optimizers:
                optimizer.step()
        return fresh, fresh_params

    def test_adafactor_loads_into_hf_adafactor(self):
        from transformers.optimization import Adafactor

        for optim_args, beta1 in ((None, None), ("beta1=0.9", 0.9)):
            def make(params, beta1=beta1):
                groups = [{"params": [params[0], params[1]], "weight_decay": 0.1},
                          {"params": [params[2]], "weight_decay": 0.0}]
                return [Adafactor(groups, lr=1e-2, scale_parameter=False, relative_step=False,
                                  beta1=beta1)]

            with self.subTest(optim_args=optim_args), tempfile.TemporaryDirectory() as folder:
                loaded = load_adafactor_pt(write_cpp("adafactor", folder, optim_args))
                params = initial_params()
                (python,) = run_python(make, params, range(1, STEPS + 1))
                own = python.state_dict()
                self.assertEqual([g["params"] for g in loaded["param_groups"]],
                                 [g["params"] for g in own["param_groups"]])
                for key in ("lr", "eps", "clip_threshold", "decay_rate", "beta1",
                            "weight_decay", "scale_parameter", "relative_step", "warmup_init"):
                    self.assertEqual([g[key] for g in loaded["param_groups"]],
                                     [g[key] for g in own["param_groups"]], key)
                self.assertEqual(sorted(loaded["state"]), sorted(own["state"]))
                for index, values in loaded["state"].items():
                    expected = own["state"][index]
                    self.assertEqual(values["step"], expected["step"])
                    tensors = sorted(k for k in values if k not in ("step", "RMS"))
                    self.assertEqual(tensors, sorted(k for k in expected
                                                     if k not in ("step", "RMS")))
                    for key in tensors:
                        self.assert_close(values[key], expected[key], 1e-6, 1e-12,
                                          f"parameter {index} {key}")
                fresh, _ = self.continue_both(make, [python], [loaded], params)
                after, again = python.state_dict(), fresh[0].state_dict()
                for index, values in again["state"].items():
                    self.assertEqual(values["step"], STEPS + 1)
                    for key in values:
                        if isinstance(values[key], torch.Tensor) and key != "RMS":
                            self.assert_close(values[key], after["state"][index][key], 1e-5,
                                              1e-12, f"step 5: parameter {index} {key}")

    def test_muon_loads_into_torch_muon_and_adamw(self):
        def make(params):
            muon = torch.optim.Muon([params[1]], lr=1e-2, weight_decay=0.1)
            adamw = torch.optim.AdamW([{"params": [params[0]], "weight_decay": 0.1},
                                       {"params": [params[2]], "weight_decay": 0.0}], lr=1e-2)
            return [muon, adamw]

        with tempfile.TemporaryDirectory() as folder:
            muon_state, adamw_state = load_muon_pt(write_cpp("muon", folder))
            params = initial_params()
            python = run_python(make, params, range(1, STEPS + 1))
            for loaded, optimizer in zip((muon_state, adamw_state), python):
                own = optimizer.state_dict()
                self.assertEqual([g["params"] for g in loaded["param_groups"]],
                                 [g["params"] for g in own["param_groups"]])
                for group, expected in zip(loaded["param_groups"], own["param_groups"]):
                    for key, value in group.items():
                        if key != "params":
                            self.assertEqual(value, expected[key], key)
                for index, values in loaded["state"].items():
                    for key, value in values.items():
                        # The momentum and the moments follow the gradients alone: fp32 rounding.
                        self.assert_close(value, own["state"][index][key], 1e-5, 1e-8,
                                          f"{type(optimizer).__name__} parameter {index} {key}")
            fresh, _ = self.continue_both(make, python, [muon_state, adamw_state], params)
            for mine, theirs in zip(fresh, python):
                for index, values in mine.state_dict()["state"].items():
                    for key, value in values.items():
                        self.assert_close(value, theirs.state_dict()["state"][index][key], 1e-5,
                                          1e-8, f"step 5: parameter {index} {key}")

    def test_adamw_8bit_loads_into_torchao(self):
        from torchao.optim import AdamW8bit

        def make(params):
            groups = [{"params": [params[0], params[1]], "weight_decay": 0.1},
                      {"params": [params[2]], "weight_decay": 0.0}]
            return [AdamW8bit(groups, lr=1e-2)]

        with tempfile.TemporaryDirectory() as folder:
            loaded = load_adamw_8bit_pt(write_cpp("adamw_torch_8bit", folder))
            params = initial_params()
            (python,) = run_python(make, params, range(1, STEPS + 1))
            own = python.state_dict()
            for index, values in loaded["state"].items():
                expected = own["state"][index]
                self.assertEqual(values["step"].item(), expected["step"].item())
                for key in ("exp_avg", "exp_avg_sq"):
                    mine, theirs = values[key], expected[key]
                    self.assertEqual(type(mine).__name__, type(theirs).__name__, key)
                    if hasattr(theirs, "codes"):
                        # "w" (4096 elements) is quantised: the codes equal, or one level apart
                        # where the CPU rounds the scaled value to the other side of a boundary.
                        levels = (mine.codes.int() - theirs.codes.int()).abs()
                        self.assertLessEqual(levels.max().item(), 1, f"{index} {key} codes")
                        self.assert_close(mine.scale, theirs.scale, 1e-6, 0, f"{index} {key}")
                        self.assertEqual(mine.signed, theirs.signed)
                        self.assert_close(mine.dequantize(), theirs.dequantize(), 0.05, 1e-7,
                                          f"{index} {key} dequantised")
                    else:
                        self.assert_close(mine, theirs, 1e-5, 1e-9, f"{index} {key}")
            fresh, _ = self.continue_both(make, [python], [loaded], params)
            for index, values in fresh[0].state_dict()["state"].items():
                self.assertEqual(values["step"].item(), STEPS + 1)
                theirs = python.state_dict()["state"][index]
                for key in ("exp_avg", "exp_avg_sq"):
                    mine = values[key]
                    self.assert_close(mine.dequantize() if hasattr(mine, "codes") else mine,
                                      theirs[key].dequantize() if hasattr(theirs[key], "codes")
                                      else theirs[key], 0.05, 1e-7, f"step 5: {index} {key}")

    def test_a_file_of_another_optimizer_is_named(self):
        with tempfile.TemporaryDirectory() as folder:
            path = write_cpp("muon", folder)
            with self.assertRaisesRegex(ValueError, "options of --optim muon.*load_muon_pt"):
                load_optimizer_pt(path)
            with self.assertRaisesRegex(ValueError, "options of muon, not of adafactor; use "
                                        "load_muon_pt"):
                load_adafactor_pt(path)


if __name__ == "__main__":
    unittest.main()
