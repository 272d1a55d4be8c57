"""mantissa.optim.FusedAdamW and torch.ops.mantissa.fused_adamw_ against torch.optim.AdamW, against
the C++ mantissa::optim::FusedAdamW (through tests/python/fused_adamw_reference.cpp) and under
torch.amp.GradScaler. Run by CTest (python.fused_adamw) after python.install_package, from the
installed package:  python -m unittest -v test_fused_adamw
MANTISSA_FUSED_ADAMW_REFERENCE names the C++ helper; the tests that need it fail without it.
"""

import copy
import math
import os
import subprocess
import sys
import tempfile
import textwrap
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


def save_for_cpp_check(opt, params, folder, lrs, seed=1234):
    """Writes opt's state as py_optimizer.pt and what the C++ helper's `check` must read from it
    (each parameter, each state tensor, the two groups' rates, the seed) as py_expected.pt."""
    save_optimizer_pt(opt.state_dict(), os.path.join(folder, "py_optimizer.pt"))
    check = {f"param/{i}": p.detach() for i, p in enumerate(params)}
    for i, p in enumerate(params):
        for key, value in opt.state[p].items():
            check[f"state/{i}/{key}"] = value
    for group, lr in enumerate(lrs):
        check[f"lr/{group}"] = torch.tensor(lr, dtype=torch.float64)
    check["seed"] = torch.tensor(seed)
    torch.save(check, os.path.join(folder, "py_expected.pt"))


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

            save_for_cpp_check(opt, params, folder, lrs=(1e-2, 2e-3))
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


def snapshot(opt):
    """Everything an optimizer holds: its groups' options and parameters and each state tensor,
    copied, to compare before and after a call that must change nothing."""
    groups = [{k: (list(v) if k == "params" else copy.deepcopy(v)) for k, v in g.items()}
              for g in opt.param_groups]
    state = {id(p): {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
             for p, s in opt.state.items()}
    return groups, state


def raw_archive(values):
    """One level of a LibTorch archive built by hand, without the checks of save_optimizer_pt:
    what a hostile or corrupt optimizer.pt can hold."""
    module = torch._C.ScriptModule("__torch__.test.Level", torch._C.CompilationUnit(), True)
    for key, value in values.items():
        if isinstance(value, torch.Tensor):
            kind = torch._C.TensorType.get()
        elif isinstance(value, torch._C.ScriptModule):
            kind = value._type()
        elif isinstance(value, bool):
            kind = torch._C.BoolType.get()
        elif isinstance(value, int):
            kind = torch._C.IntType.get()
        elif isinstance(value, float):
            kind = torch._C.FloatType.get()
        elif isinstance(value, str):
            kind = torch._C.StringType.get()
        else:
            kind = torch._C.TupleType([torch._C.FloatType.get()] * len(value))
        module._register_attribute(key, kind, value)
    return module


def write_optimizer_pt(path, groups_size=1, options=None, state=None):
    """An optimizer.pt of one group with one parameter ('p0', 3 elements)."""
    options = options if options is not None else {
        "lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False}
    state = state if state is not None else {
        "step": 3, "exp_avg": torch.zeros(3), "exp_avg_sq": torch.ones(3)}
    group = raw_archive({"params/size": torch.tensor(1), "params/0": "p0",
                         "options": raw_archive(options)})
    raw_archive({
        "pytorch_version": "1.5.0",
        "state": raw_archive({"p0": raw_archive(state)}),
        "param_groups": raw_archive({"param_groups/size": torch.tensor(groups_size),
                                     "param_groups/0": group}),
    }).save(path)


def run_python(code, timeout=60):
    """Runs `code` in a fresh interpreter with a time limit: a call that blocks (a FIFO) fails
    the test instead of hanging the suite."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running after {timeout} s (blocked?):\n{code}") from None


class HostileInputTest(unittest.TestCase):
    """What a hostile-input trial (issue 40) found: states no finite run writes, options of the
    wrong type or out of range, FIFOs and devices as files, and save_optimizer_pt twice in a
    process. Each bad input is refused with an error that names it, and changes nothing."""

    def trained(self, **options):
        params = make_params(torch.bfloat16)
        opt = FusedAdamW([{"params": params[:2]}, {"params": params[2:], "lr": 2e-3}], lr=1e-2,
                         **options)
        for grads in make_grads(params, 2):
            for p, g in zip(params, grads):
                p.grad = g
            opt.step()
        return params, opt

    def assert_refused(self, opt, call, error, pattern):
        before = snapshot(opt)
        with self.assertRaisesRegex(error, pattern):
            call()
        after = snapshot(opt)
        self.assertEqual(len(after[0]), len(before[0]))
        for old, new in zip(before[0], after[0]):
            self.assertEqual(old.keys(), new.keys())
            for key in old:
                if key == "params":
                    self.assertTrue(all(a is b for a, b in zip(old[key], new[key])))
                    self.assertEqual(len(old[key]), len(new[key]))
                else:
                    self.assertEqual(old[key], new[key], key)
        self.assertEqual(before[1].keys(), after[1].keys())
        for pid, values in before[1].items():
            self.assertEqual(values.keys(), after[1][pid].keys())
            for key, value in values.items():
                self.assertEqual(after[1][pid][key].dtype, value.dtype, key)
                self.assertTrue(torch.equal(after[1][pid][key], value), key)

    def test_load_state_dict_refuses_states_no_finite_run_writes(self):
        nan, inf = float("nan"), float("inf")
        cases = [
            # (options, param index, key, new value, error, pattern)
            ({}, 1, "exp_avg", lambda v: v.index_fill(0, torch.tensor([0]), nan), ValueError,
             r"parameter 1: exp_avg is not finite in \d+ of its \d+ values \(the first, nan"),
            ({}, 2, "exp_avg", lambda v: v.index_fill(0, torch.tensor([1]), inf), ValueError,
             r"parameter 2: exp_avg is not finite .*the first, inf, at flat index"),
            ({}, 0, "exp_avg_sq", lambda v: v.index_fill(0, torch.tensor([2]), nan), ValueError,
             r"parameter 0: exp_avg_sq is not finite"),
            ({}, 0, "exp_avg_sq", lambda v: -v - 1, ValueError,
             r"parameter 0: exp_avg_sq is negative in \d+ of its \d+ values \(the first, -"),
            ({}, 1, "step", lambda v: torch.tensor(-1.0), ValueError,
             r"parameter 1: step must be a whole number >= 0; got -1"),
            ({}, 1, "step", lambda v: torch.tensor(nan), ValueError,
             r"parameter 1: step must be a whole number >= 0; got nan"),
            ({}, 1, "step", lambda v: 2.5, ValueError, r"step must be a whole number >= 0; got 2.5"),
            ({}, 1, "exp_avg", lambda v: torch.zeros(2), ValueError,
             r"parameter 1: exp_avg has shape \[2\] but the parameter has \[33\]"),
            ({}, 1, "exp_avg", lambda v: v.to(torch.int32), TypeError,
             r"parameter 1: exp_avg must be a dense floating-point tensor; got torch.int32"),
            # 1e39 is finite in the file's fp64 but not in the fp32 moment it becomes.
            (dict(master_weights=True), 0, "exp_avg_sq", lambda v: v.double().fill_(1e39),
             ValueError, r"parameter 0: exp_avg_sq is not finite .*the first, inf"),
            (dict(master_weights=True), 2, "master_param",
             lambda v: v.index_fill(0, torch.tensor([0]), inf), ValueError,
             r"parameter 2: master_param is not finite"),
            (dict(low_precision_update="kahan"), 1, "kahan_comp",
             lambda v: v.index_fill(0, torch.tensor([3]), nan), ValueError,
             r"parameter 1: kahan_comp is not finite .*at flat index 3"),
        ]
        for options, index, key, change, error, pattern in cases:
            with self.subTest(options=options, index=index, key=key, pattern=pattern):
                params, opt = self.trained(**options)
                state_dict = copy.deepcopy(opt.state_dict())
                state_dict["state"][index][key] = change(state_dict["state"][index][key])
                self.assert_refused(opt, lambda: opt.load_state_dict(state_dict), error, pattern)
                # The optimizer goes on from the state it had, to finite parameters.
                for p in params:
                    p.grad = torch.ones_like(p)
                opt.step()
                for p in params:
                    self.assertTrue(bool(torch.isfinite(p.detach().float()).all()))

    def test_load_state_dict_refuses_bad_groups_and_layouts_without_a_change(self):
        params, opt = self.trained()
        good = opt.state_dict()
        cases = [
            (lambda sd: sd["param_groups"][1].__setitem__("lr", float("nan")), ValueError,
             r"\['param_groups'\]\[1\]: Invalid learning rate: nan"),
            (lambda sd: sd["param_groups"][0].__setitem__("lr", "x"), TypeError,
             r"\['param_groups'\]\[0\]: lr must be a number; got 'x'"),
            (lambda sd: sd["param_groups"][0].__setitem__("betas", (0.9,)), TypeError,
             r"betas must be a pair \(beta1, beta2\); got \(0.9,\)"),
            (lambda sd: sd["param_groups"][0].__setitem__("betas", (0.9, 0.99, 0.5)), TypeError,
             r"betas must be a pair"),
            (lambda sd: sd["param_groups"][1].__setitem__("eps", -1.0), ValueError,
             r"Invalid epsilon value: -1.0"),
            (lambda sd: sd["param_groups"][0].__setitem__("low_precision_update", "up"),
             ValueError, r"got 'up'"),
            (lambda sd: sd.pop("state"), ValueError, r"state_dict has no 'state'"),
            (lambda sd: sd.pop("param_groups"), ValueError, r"state_dict has no 'param_groups'"),
            (lambda sd: sd["param_groups"].pop(), ValueError,
             r"state_dict has 1 parameter groups, this optimizer 2"),
            (lambda sd: sd["param_groups"][0]["params"].append(7), ValueError,
             r"\['param_groups'\]\[0\] has 3 parameters, this optimizer's group 2"),
            (lambda sd: sd["param_groups"][1].__setitem__("params", [0]), ValueError,
             r"\['param_groups'\]\[1\]\['params'\]\[0\] lists parameter 0 again"),
            (lambda sd: sd["state"].__setitem__(9, {"step": torch.tensor(1.0)}), ValueError,
             r"an entry for parameter 9, which no group lists"),
        ]
        for change, error, pattern in cases:
            with self.subTest(pattern=pattern):
                state_dict = copy.deepcopy(good)
                change(state_dict)
                self.assert_refused(opt, lambda: opt.load_state_dict(state_dict), error, pattern)
        with self.assertRaisesRegex(TypeError, "state_dict must be a dict"):
            opt.load_state_dict([1, 2])
        opt.load_state_dict(copy.deepcopy(good))  # and the good one still loads

    def test_add_param_group_refuses_before_adding(self):
        params, opt = self.trained()
        extra = torch.nn.Parameter(torch.randn(4))
        cases = [
            ({"params": [extra], "lr": float("nan")}, ValueError,
             r"param group 2: Invalid learning rate: nan"),
            ({"params": [extra], "lr": "x"}, TypeError, r"param group 2: lr must be a number"),
            ({"params": [extra], "betas": (0.9,)}, TypeError, r"param group 2: betas must be a pair"),
            ({"params": [extra], "weight_decay": float("inf")}, ValueError,
             r"Invalid weight_decay value: inf"),
            ({"params": [extra], "maximize": "yes"}, TypeError,
             r"param group 2: maximize must be True or False; got 'yes'"),
            ({"params": [extra], "stochastic_rounding_seed": -1}, ValueError,
             r"stochastic_rounding_seed must be an integer in \[0, 2\*\*64\); got -1"),
            ({"params": [extra, torch.zeros(2, dtype=torch.int64)]}, ValueError,
             r"parameter 1 of param group 2 is torch.int64"),
            ({"params": [extra, "w"]}, TypeError, r"param group 2: parameter 1 is not a tensor"),
            ({"lr": 0.1}, ValueError, r"param group 2 has no 'params'"),
            ({"params": [params[0]]}, ValueError, r"more than one parameter group"),
        ]
        for group, error, pattern in cases:
            with self.subTest(pattern=pattern):
                self.assert_refused(opt, lambda: opt.add_param_group(group), error, pattern)
        opt.add_param_group({"params": (p for p in [extra]), "lr": 0.5})  # a generator
        self.assertEqual(len(opt.param_groups[2]["params"]), 1)
        self.assertIs(opt.param_groups[2]["params"][0], extra)
        self.assertEqual(opt.param_groups[2]["lr"], 0.5)

    def test_constructor_names_the_argument(self):
        params = make_params(torch.float32)
        with self.assertRaisesRegex(TypeError, r"FusedAdamW: lr must be a number; got 'x'"):
            FusedAdamW(params, lr="x")
        for betas in ((0.9,), (0.9, 0.99, 0.5), 0.9):
            with self.assertRaisesRegex(TypeError, r"FusedAdamW: betas must be a pair"):
                FusedAdamW(params, betas=betas)
        with self.assertRaisesRegex(TypeError, r"betas\[1\] must be a number; got 'x'"):
            FusedAdamW(params, betas=(0.9, "x"))
        with self.assertRaisesRegex(ValueError, r"Invalid learning rate: inf"):
            FusedAdamW(params, lr=math.inf)
        with self.assertRaisesRegex(TypeError, r"master_weights must be True or False"):
            FusedAdamW(params, master_weights="no")

    def test_step_refuses_an_option_set_by_hand(self):
        params, opt = self.trained()
        for p in params:
            p.grad = torch.ones_like(p)
        before = [p.detach().clone() for p in params]
        opt.param_groups[1]["lr"] = float("nan")
        with self.assertRaisesRegex(ValueError, r"param group 1: Invalid learning rate: nan"):
            opt.step()
        for p, old in zip(params, before):
            self.assertTrue(torch.equal(p.detach(), old))

    def test_save_optimizer_pt_twice_in_a_process_and_both_load(self):
        # A training loop that saves every N steps: save, step, save again; load both, in
        # Python and in the C++ optimizer.
        params, opt = self.trained(low_precision_update="kahan", stochastic_rounding_seed=1234)
        with tempfile.TemporaryDirectory() as folder:
            saved = []
            for round_ in range(2):
                if round_:
                    for p in params:
                        p.grad = torch.ones_like(p)
                    opt.step()
                path = os.path.join(folder, f"optimizer-{round_}.pt")
                save_optimizer_pt(opt.state_dict(), path)
                saved.append((path, copy.deepcopy(opt.state_dict())))
            for path, state_dict in saved:
                loaded = load_optimizer_pt(path)
                for i, values in state_dict["state"].items():
                    for key in ("step", "exp_avg", "exp_avg_sq", "kahan_comp"):
                        if key in values:
                            self.assertTrue(torch.equal(loaded["state"][i][key], values[key]),
                                            f"{key} of {i} in {path}")
            self.assertEqual(load_optimizer_pt(saved[0][0])["state"][0]["step"].item(), 2.0)
            self.assertEqual(load_optimizer_pt(saved[1][0])["state"][0]["step"].item(), 3.0)
        # The C++ side reads a file saved after another (the helper's own four parameters).
        with tempfile.TemporaryDirectory() as folder:
            run_helper("save", folder)
            state_dict = load_optimizer_pt(os.path.join(folder, "optimizer.pt"))
            params = [torch.nn.Parameter(torch.load(os.path.join(folder, "expected.pt"),
                                                    weights_only=True)[f"param/{i}"].clone())
                      for i in range(4)]
            opt = FusedAdamW([{"params": params[:2]}, {"params": params[2:]}])
            opt.load_state_dict(state_dict)
            for round_ in range(2):
                for p in params:
                    p.grad = torch.ones_like(p)
                opt.step()
                save_for_cpp_check(opt, params, folder, lrs=(1e-2, 3e-3))
                self.assertIn("check: PASSED", run_helper("check", folder), f"save {round_}")

    def test_save_optimizer_pt_refuses_what_it_could_not_load(self):
        params, opt = self.trained()
        cases = [
            (lambda sd: sd["param_groups"][0].__setitem__("lr", float("nan")), ValueError,
             r"\['param_groups'\]\[0\]: Invalid learning rate: nan"),
            (lambda sd: sd["state"][1].__setitem__("exp_avg_sq", -sd["state"][1]["exp_avg_sq"] - 1),
             ValueError, r"\['state'\]\[1\]: exp_avg_sq is negative"),
            (lambda sd: sd["state"][2].__setitem__("step", torch.tensor(-3.0)), ValueError,
             r"\['state'\]\[2\]: step must be a whole number >= 0; got -3"),
            (lambda sd: sd["state"][0]["exp_avg"].view(-1).__setitem__(0, float("inf")),
             ValueError, r"\['state'\]\[0\]: exp_avg is not finite"),
            (lambda sd: sd.pop("state"), ValueError, r"state_dict has no 'state'"),
        ]
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "optimizer.pt")
            for change, error, pattern in cases:
                with self.subTest(pattern=pattern):
                    state_dict = copy.deepcopy(opt.state_dict())
                    change(state_dict)
                    with self.assertRaisesRegex(error, pattern):
                        save_optimizer_pt(state_dict, path)
                    self.assertFalse(os.path.exists(path))

    def test_load_optimizer_pt_refuses_what_no_finite_run_writes(self):
        options = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
                   "amsgrad": False}
        cases = [
            (dict(groups_size=-1), r"param_groups/size is -1; a count is >= 0"),
            (dict(options={**options, "lr": float("nan")}),
             r"param_groups/0: Invalid learning rate: nan"),
            (dict(options={**options, "betas": (0.9, 0.99, 0.5)}),
             r"param_groups/0: option 'betas' must be a pair of numbers"),
            (dict(options={**options, "lr": "x"}), r"option 'lr' must be a number; got 'x'"),
            (dict(state={"step": -2, "exp_avg": torch.zeros(3), "exp_avg_sq": torch.ones(3)}),
             r"the state of parameter 0: step must be a whole number >= 0; got -2"),
            (dict(state={"step": 1, "exp_avg": torch.tensor([0.0, math.nan, 1.0]),
                         "exp_avg_sq": torch.ones(3)}),
             r"parameter 0: exp_avg is not finite in 1 of its 3 values \(the first, nan, at "
             r"flat index 1\)"),
            (dict(state={"step": 1, "exp_avg": torch.zeros(3),
                         "exp_avg_sq": torch.tensor([1.0, -1.0, 1.0])}),
             r"parameter 0: exp_avg_sq is negative"),
            (dict(state={"step": 1, "exp_avg": torch.zeros(3), "exp_avg_sq": torch.ones(3),
                         "kahan_comp": torch.full((3,), math.nan)}),
             r"parameter 0: kahan_comp is not finite"),
        ]
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "optimizer.pt")
            write_optimizer_pt(path)
            self.assertEqual(load_optimizer_pt(path)["state"][0]["step"].item(), 3.0)
            for kwargs, pattern in cases:
                with self.subTest(pattern=pattern):
                    write_optimizer_pt(path, **kwargs)
                    with self.assertRaisesRegex(ValueError, pattern):
                        load_optimizer_pt(path)

    def test_files_that_are_not_regular_are_refused_at_once(self):
        params, opt = self.trained()
        for device in ("/dev/zero", "/dev/null"):
            with self.subTest(device=device):
                with self.assertRaisesRegex(ValueError, f"cannot read '{device}': it is a "
                                            "character device, not a regular file"):
                    load_optimizer_pt(device)
                with self.assertRaisesRegex(ValueError, f"cannot write '{device}': it is a "
                                            "character device, not a regular file"):
                    save_optimizer_pt(opt.state_dict(), device)
        with tempfile.TemporaryDirectory() as folder:
            with self.assertRaisesRegex(ValueError, "it is a directory"):
                load_optimizer_pt(folder)
            long_path = os.path.join(folder, "a" * 5000)
            with self.assertRaises(OSError) as caught:
                load_optimizer_pt(long_path)
            self.assertLess(len(str(caught.exception)), 300)
            # A FIFO without a writer (or a reader) blocks an open: in a child process with a
            # time limit, so that a regression fails instead of hanging the suite.
            fifo = os.path.join(folder, "optimizer.pt")
            os.mkfifo(fifo)
            done = run_python(f"""
                import torch
                from mantissa.optim import FusedAdamW, load_optimizer_pt, save_optimizer_pt
                p = torch.nn.Parameter(torch.ones(3))
                opt = FusedAdamW([p])
                p.grad = torch.ones(3)
                opt.step()
                for call in (lambda: load_optimizer_pt({fifo!r}),
                             lambda: save_optimizer_pt(opt.state_dict(), {fifo!r})):
                    try:
                        call()
                        print("accepted")
                    except ValueError as e:
                        print("refused:", e)
                """)
            self.assertEqual(done.returncode, 0, done.stderr)
            self.assertEqual(done.stdout.count("it is a FIFO, not a regular file"), 2, done.stdout)


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
