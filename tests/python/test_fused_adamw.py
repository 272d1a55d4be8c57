"""mantissa.optim.FusedAdamW and torch.ops.mantissa.fused_adamw_ against torch.optim.AdamW, against
the C++ mantissa::optim::FusedAdamW (through tests/python/fused_adamw_reference.cpp) and under
torch.amp.GradScaler. Run by CTest (python.fused_adamw) after python.install_package, from the
installed package:  python -m unittest -v test_fused_adamw
MANTISSA_FUSED_ADAMW_REFERENCE names the C++ helper; the tests that need it fail without it.
"""

import copy
import os
import subprocess
import tempfile
import unittest

import torch

import mantissa
from mantissa.optim import FusedAdamW, load_optimizer_pt, save_optimizer_pt

STEPS = 20


def reference_helper():
    path = os.environ.get("MANTISSA_FUSED_ADAMW_REFERENCE")
    if not path or not os.path.isfile(path):
        raise AssertionError(
            "MANTISSA_FUSED_ADAMW_REFERENCE must name the built fused_adamw_reference executable "
            f"(got {path!r}); CTest sets it"
        )
    return path


def run_helper(*args):
    done = subprocess.run([reference_helper(), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"fused_adamw_reference {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def max_relative_error(actual, expected):
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).abs() / expected.abs().clamp_min(1e-30)).max().item()


def normwise_relative_error(actual, expected):
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).abs().max() / expected.abs().max()).item()


def make_params(dtype, seed=0, shapes=((7, 5), (33,), (4, 4, 3))):
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.nn.Parameter(torch.randn(shape, generator=generator).to(dtype)) for shape in shapes
    ]


def make_grads(params, steps, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [
        [torch.randn(p.shape, generator=generator).to(p.dtype) for p in params]
        for _ in range(steps)
    ]


class OpTest(unittest.TestCase):
    def sample_args(self, dtype, master, kahan, scaled):
        generator = torch.Generator().manual_seed(3)
        shapes = [(6, 4), (9,)]
        params = [torch.randn(s, generator=generator).to(dtype) for s in shapes]
        target = torch.float32 if master else dtype
        args = [
            params,
            [torch.randn(s, generator=generator).to(dtype) for s in shapes],
            [torch.zeros(s, dtype=target) for s in shapes],
            [torch.zeros(s, dtype=target) for s in shapes],
            [torch.zeros((), dtype=torch.float32) for _ in shapes],
            [p.float() for p in params] if master else [],
            [torch.zeros(s, dtype=dtype) for s in shapes] if kahan else [],
            [3, 8],
        ]
        kwargs = dict(lr=1e-2, beta1=0.9, beta2=0.99, weight_decay=0.1, eps=1e-8)
        if kahan:
            kwargs["low_precision_update"] = "kahan"
        if scaled:
            kwargs.update(
                low_precision_update="stochastic_rounding",
                seed=7,
                grad_scale=torch.tensor(4.0),
                found_inf=torch.tensor(0.0),
            )
        return args, kwargs

    def test_schema_marks_every_written_list(self):
        schema = str(torch.ops.mantissa.fused_adamw_.default._schema)
        for written in ("Tensor(a!)[] params", "Tensor(b!)[] exp_avgs", "Tensor(c!)[] exp_avg_sqs",
                        "Tensor(d!)[] state_steps", "Tensor(e!)[] master_params",
                        "Tensor(f!)[] kahan_comps"):
            self.assertIn(written, schema)
        self.assertIn("Tensor[] grads", schema)  # read only: unscaled in registers
        self.assertTrue(schema.endswith("-> ()"))

    def test_opcheck(self):
        cases = [
            (torch.float32, False, False, False),
            (torch.bfloat16, True, False, False),
            (torch.bfloat16, False, True, False),
            (torch.float16, False, False, True),
        ]
        for dtype, master, kahan, scaled in cases:
            with self.subTest(dtype=dtype, master=master, kahan=kahan, scaled=scaled):
                args, kwargs = self.sample_args(dtype, master, kahan, scaled)
                torch.library.opcheck(torch.ops.mantissa.fused_adamw_.default, args, kwargs)

    def test_compile_traces_through_the_op(self):
        args, kwargs = self.sample_args(torch.bfloat16, True, False, False)
        eager = copy.deepcopy(args)

        def step(*lists):
            torch.ops.mantissa.fused_adamw_(*lists, **kwargs)

        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        compiled(*args)
        step(*eager)
        for got, want in zip(args[:7], eager[:7]):
            for g, w in zip(got, want):
                self.assertTrue(torch.equal(g, w))
        self.assertEqual(args[4][0].item(), 1.0)

    def test_op_names_what_is_wrong(self):
        args, kwargs = self.sample_args(torch.float32, False, False, False)
        args[3] = args[3][:1]
        with self.assertRaisesRegex(ValueError, "exp_avg_sqs has 1 tensors but params has 2"):
            torch.ops.mantissa.fused_adamw_(*args, **kwargs)
        args, kwargs = self.sample_args(torch.bfloat16, False, False, False)
        with self.assertRaisesRegex(ValueError, "needs kahan_comps"):
            torch.ops.mantissa.fused_adamw_(*args, **kwargs, low_precision_update="kahan")
        with self.assertRaisesRegex(ValueError, "got 'round_up'"):
            torch.ops.mantissa.fused_adamw_(*args, **kwargs, low_precision_update="round_up")


class FusedAdamWTest(unittest.TestCase):
    def test_fp32_matches_torch_adamw_with_groups_and_a_scheduler(self):
        params = make_params(torch.float32)
        reference = [torch.nn.Parameter(p.detach().clone()) for p in params]
        hyper = dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.05)
        ours = FusedAdamW([{"params": params[:2]}, {"params": params[2:], "lr": 1e-3}], **hyper)
        theirs = torch.optim.AdamW(
            [{"params": reference[:2]}, {"params": reference[2:], "lr": 1e-3}],
            foreach=False, **hyper)
        schedules = [torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s))
                     for o in (ours, theirs)]
        for grads in make_grads(params, STEPS):
            for p, q, g in zip(params, reference, grads):
                p.grad, q.grad = g.clone(), g.clone()
            ours.step()
            theirs.step()
            for schedule in schedules:
                schedule.step()
        self.assertEqual(ours.param_groups[1]["lr"], theirs.param_groups[1]["lr"])
        for p, q in zip(params, reference):
            self.assertLessEqual(max_relative_error(p.detach(), q.detach()), 1e-6)
            state, reference_state = ours.state[p], theirs.state[q]
            self.assertEqual(state["step"].item(), STEPS)
            # Elementwise, a moment near zero differs relatively more (ATen fuses a multiply and
            # an add here and there, our kernel as ATen's vectorized builds do); normwise 1e-6.
            for key in ("exp_avg", "exp_avg_sq"):
                self.assertLessEqual(
                    normwise_relative_error(state[key], reference_state[key]), 1e-6)
        # Tight enough to catch a wrong step: the parameters moved by far more than 1e-6.
        self.assertGreater(max_relative_error(params[0].detach(), make_params(torch.float32)[0]),
                           1e-3)

    def test_master_weights_follow_fp32_adamw_and_round_into_bf16_params(self):
        params = make_params(torch.bfloat16)
        masters = [torch.nn.Parameter(p.detach().float()) for p in params]
        ours = FusedAdamW(params, lr=1e-2, weight_decay=0.1, master_weights=True)
        theirs = torch.optim.AdamW(masters, lr=1e-2, weight_decay=0.1, foreach=False)
        for grads in make_grads(params, STEPS):
            for p, m, g in zip(params, masters, grads):
                p.grad, m.grad = g, g.float()
            ours.step()
            theirs.step()
        for p, m in zip(params, masters):
            state = ours.state[p]
            self.assertEqual(state["master_param"].dtype, torch.float32)
            self.assertEqual(state["exp_avg"].dtype, torch.float32)
            self.assertLessEqual(max_relative_error(state["master_param"], m.detach()), 1e-6)
            self.assertTrue(torch.equal(p.detach(), state["master_param"].to(torch.bfloat16)))
            self.assertEqual(p.dtype, torch.bfloat16)

    def test_kahan_and_stochastic_rounding_match_the_cpp_optimizer_bit_for_bit(self):
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "golden.pt")
            run_helper("golden", path)
            golden = torch.load(path, weights_only=True)
        num_params = 4
        for rule in ("kahan", "stochastic_rounding"):
            with self.subTest(rule=rule):
                params = [torch.nn.Parameter(golden[f"init/{i}"].clone())
                          for i in range(num_params)]
                # Options and groups as in fused_adamw_reference.cpp.
                opt = FusedAdamW(
                    [{"params": params[:2]}, {"params": params[2:], "lr": 3e-3}],
                    lr=1e-2, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.1,
                    low_precision_update=rule, stochastic_rounding_seed=1234)
                for step in range(STEPS):
                    for i, p in enumerate(params):
                        p.grad = golden[f"grad/{step}/{i}"]
                    # What GradScaler.step() hands a _step_supports_amp_scaling optimizer.
                    opt.grad_scale = torch.tensor(1024.0)
                    opt.found_inf = torch.tensor(1.0 if step + 1 == 7 else 0.0)
                    opt.step()
                    del opt.grad_scale, opt.found_inf
                for i, p in enumerate(params):
                    key = f"{rule}/{i}"
                    state = opt.state[p]
                    self.assertTrue(torch.equal(p.detach(), golden[f"param/{key}"]), key)
                    for name in ("exp_avg", "exp_avg_sq", "step"):
                        self.assertTrue(torch.equal(state[name], golden[f"{name}/{key}"]),
                                        f"{name} of {key}")
                    if f"kahan_comp/{key}" in golden:
                        self.assertTrue(torch.equal(state["kahan_comp"],
                                                    golden[f"kahan_comp/{key}"]), key)
                    self.assertEqual(state["step"].item(), STEPS - 1)  # one step was skipped
                self.assertEqual(f"kahan_comp/{rule}/1" in golden, rule == "kahan")

    def test_grad_scaler_skips_a_step_with_inf_under_fp16(self):
        for master_weights in (True, False):
            with self.subTest(master_weights=master_weights):
                params = make_params(torch.float16)
                opt = FusedAdamW(params, lr=1e-2, master_weights=master_weights,
                                 low_precision_update="kahan")
                scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
                grads = make_grads(params, 3)

                def backward(grads):
                    scaler.scale(torch.ones(()))  # what scaler.scale(loss) does first
                    for p, g in zip(params, grads):
                        p.grad = (g.float() * scaler.get_scale()).half()

                backward(grads[0])
                scaler.step(opt)
                scaler.update()
                before = ([p.detach().clone() for p in params],
                          {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in params})
                grads[1][0][0, 0] = float("inf")
                backward(grads[1])
                scaler.step(opt)
                scaler.update()
                self.assertEqual(scaler.get_scale(), 128.0)
                for p, old in zip(params, before[0]):
                    self.assertTrue(torch.equal(p.detach(), old))
                    for key, value in before[1][id(p)].items():
                        self.assertTrue(torch.equal(opt.state[p][key], value), key)
                self.assertEqual(opt.state[params[0]]["step"].item(), 1.0)
                self.assertFalse(hasattr(opt, "found_inf"))
                backward(grads[2])
                scaler.step(opt)
                self.assertEqual(opt.state[params[0]]["step"].item(), 2.0)
                self.assertFalse(torch.equal(params[0].detach(), before[0][0]))

    def test_grad_scaler_unscales_like_the_unscaled_step(self):
        params = make_params(torch.bfloat16)
        plain = [torch.nn.Parameter(p.detach().clone()) for p in params]
        scaled_opt = FusedAdamW(params, master_weights=True)
        plain_opt = FusedAdamW(plain, master_weights=True)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        for grads in make_grads(params, 5):
            scaler.scale(torch.ones(()))
            for p, q, g in zip(params, plain, grads):
                p.grad = g * 1024  # exact in bf16
                q.grad = g.clone()
            scaler.step(scaled_opt)
            scaler.update()
            plain_opt.step()
        for p, q in zip(params, plain):
            self.assertTrue(torch.equal(scaled_opt.state[p]["master_param"],
                                        plain_opt.state[q]["master_param"]))

    def test_state_dict_round_trip_continues_bit_for_bit(self):
        for options in (dict(master_weights=True),
                        dict(low_precision_update="kahan"),
                        dict(low_precision_update="stochastic_rounding", fp32_moments=True)):
            with self.subTest(**options):
                params = make_params(torch.bfloat16)
                opt = FusedAdamW(params, lr=1e-2, **options)
                grads = make_grads(params, 6)
                for step_grads in grads[:3]:
                    for p, g in zip(params, step_grads):
                        p.grad = g
                    opt.step()
                saved_params = [p.detach().clone() for p in params]
                saved = copy.deepcopy(opt.state_dict())
                resumed_params = [torch.nn.Parameter(p.clone()) for p in saved_params]
                resumed = FusedAdamW(resumed_params, lr=5.0, **options)
                resumed.load_state_dict(saved)
                self.assertEqual(resumed.param_groups[0]["lr"], 1e-2)
                for step_grads in grads[3:]:
                    for p, q, g in zip(params, resumed_params, step_grads):
                        p.grad, q.grad = g, g.clone()
                    opt.step()
                    resumed.step()
                for p, q in zip(params, resumed_params):
                    self.assertTrue(torch.equal(p.detach(), q.detach()))
                    for key, value in opt.state[p].items():
                        self.assertEqual(resumed.state[q][key].dtype, value.dtype, key)
                        self.assertTrue(torch.equal(resumed.state[q][key], value), key)

    def test_cpp_optimizer_pt_loads_in_python_and_back(self):
        with tempfile.TemporaryDirectory() as folder:
            run_helper("save", folder)
            expected = torch.load(os.path.join(folder, "expected.pt"), weights_only=True)
            state_dict = load_optimizer_pt(os.path.join(folder, "optimizer.pt"))
            self.assertEqual([g["params"] for g in state_dict["param_groups"]], [[0, 1], [2, 3]])
            self.assertEqual(state_dict["param_groups"][1]["lr"], 3e-3)
            self.assertEqual(state_dict["param_groups"][0]["low_precision_update"], "kahan")
            self.assertEqual(state_dict["param_groups"][0]["stochastic_rounding_seed"], 1234)
            for i in range(4):
                for key, value in state_dict["state"][i].items():
                    want = expected[f"state/{i}/{key}"]
                    self.assertEqual(value.dtype, want.dtype, f"{key} of {i}")
                    self.assertTrue(torch.equal(value.reshape(want.shape), want), f"{key} of {i}")
            self.assertIn("kahan_comp", state_dict["state"][1])
            self.assertNotIn("kahan_comp", state_dict["state"][0])  # fp32: no compensation

            params = [torch.nn.Parameter(expected[f"param/{i}"].clone()) for i in range(4)]
            opt = FusedAdamW([{"params": params[:2]}, {"params": params[2:]}])
            opt.load_state_dict(state_dict)
            self.assertEqual(opt.param_groups[0]["low_precision_update"], "kahan")
            self.assertFalse(opt.param_groups[0]["master_weights"])  # Python's own default
            for p in params:
                p.grad = torch.ones_like(p)
            opt.param_groups[1]["lr"] = 2e-3
            opt.step()
            self.assertEqual(opt.state[params[3]]["step"].item(), 4.0)

            save_optimizer_pt(opt.state_dict(), os.path.join(folder, "py_optimizer.pt"))
            check = {f"param/{i}": params[i].detach() for i in range(4)}
            for i, p in enumerate(params):
                for key, value in opt.state[p].items():
                    check[f"state/{i}/{key}"] = value
            check["lr/0"] = torch.tensor(1e-2, dtype=torch.float64)
            check["lr/1"] = torch.tensor(2e-3, dtype=torch.float64)
            check["seed"] = torch.tensor(1234)
            torch.save(check, os.path.join(folder, "py_expected.pt"))
            self.assertIn("check: PASSED", run_helper("check", folder))
            # And the Python writer round-trips through the Python reader.
            again = load_optimizer_pt(os.path.join(folder, "py_optimizer.pt"))
            self.assertTrue(torch.equal(again["state"][1]["kahan_comp"],
                                        opt.state[params[1]]["kahan_comp"]))

    def test_bad_options_name_the_value(self):
        params = make_params(torch.float32)
        with self.assertRaisesRegex(ValueError, "got 'round_up'"):
            FusedAdamW(params, low_precision_update="round_up")
        with self.assertRaisesRegex(ValueError, "Invalid beta parameter at index 1: 1.0"):
            FusedAdamW(params, betas=(0.9, 1.0))
        with self.assertRaisesRegex(ValueError, "int64"):
            FusedAdamW([torch.zeros(3, dtype=torch.int64)])

    @unittest.skipUnless(os.environ.get("MANTISSA_TEST_INSTALLED_PACKAGE") == "1",
                         "only under CTest, after python.install_package")
    def test_the_installed_package_is_tested(self):
        # CTest runs this from tests/python, so the import must come from the installed copy.
        checkout = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", "..", "python"))
        self.assertFalse(os.path.realpath(mantissa.__file__).startswith(checkout + os.sep),
                         mantissa.__file__)
        self.assertTrue(os.path.isfile(mantissa.library_path))


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA device (the GPU check runs these)")
class CudaTest(unittest.TestCase):
    """The CUDA kernel through the op: Kahan and stochastic rounding promise the CPU kernel's bits;
    nearest rounding with masters agrees with the CPU to rounding."""

    def run_both(self, dtype, **options):
        cpu = make_params(dtype)
        gpu = [torch.nn.Parameter(p.detach().cuda()) for p in cpu]
        optimizers = [FusedAdamW(ps, lr=1e-2, weight_decay=0.1, **options) for ps in (cpu, gpu)]
        for grads in make_grads(cpu, 10):
            for p, q, g in zip(cpu, gpu, grads):
                p.grad, q.grad = g, g.cuda()
            for o in optimizers:
                o.grad_scale = torch.tensor(1.0, device=o.param_groups[0]["params"][0].device)
                o.found_inf = torch.zeros((), device=o.grad_scale.device)
                o.step()
                del o.grad_scale, o.found_inf
        return cpu, gpu, optimizers

    def test_kahan_and_stochastic_rounding_equal_the_cpu_bit_for_bit(self):
        for rule in ("kahan", "stochastic_rounding"):
            with self.subTest(rule=rule):
                cpu, gpu, (o_cpu, o_gpu) = self.run_both(
                    torch.bfloat16, low_precision_update=rule, stochastic_rounding_seed=99)
                for p, q in zip(cpu, gpu):
                    self.assertTrue(torch.equal(p.detach(), q.detach().cpu()))
                    for key, value in o_cpu.state[p].items():
                        self.assertTrue(torch.equal(value, o_gpu.state[q][key].cpu()), key)

    def test_master_weights_agree_with_the_cpu(self):
        cpu, gpu, (o_cpu, o_gpu) = self.run_both(torch.bfloat16, master_weights=True)
        for p, q in zip(cpu, gpu):
            master = o_gpu.state[q]["master_param"]
            self.assertLessEqual(max_relative_error(master.cpu(), o_cpu.state[p]["master_param"]),
                                 1e-6)
            self.assertTrue(torch.equal(q.detach(), master.to(torch.bfloat16)))

    def test_opcheck_on_cuda(self):
        args, kwargs = OpTest().sample_args(torch.bfloat16, True, False, True)
        args = [[t.cuda() for t in a] if isinstance(a[0] if a else None, torch.Tensor) else a
                for a in args]
        kwargs = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        torch.library.opcheck(torch.ops.mantissa.fused_adamw_.default, args, kwargs)


if __name__ == "__main__":
    unittest.main()
