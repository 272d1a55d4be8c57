"""The GPU pack rehearsed on this machine: a pack that depends on this machine fails here.

    python gpu_pack_rehearsal.py BUILD WORK_DIR

Makes a pack of BUILD with scripts/gpu-pack, moves it into a clean folder, and checks that
nothing in it points into BUILD, the source tree's build folders or the venv (RPATH/RUNPATH,
the libraries ldd resolves, tests.json), then runs a sample of its tests with
`scripts/gpu-check --prebuilt`: LD_LIBRARY_PATH is the only link to the venv's torch. The CUDA
tests must skip on a machine without a GPU (and pass on one). Prints "gpu pack rehearsal:
passed" at the end.
"""
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A sample with one test of each way the pack's tests find things: golden files (tests/golden
# through MANTISSA_TEST_DATA_DIR), the docs, the Python interpreter, a multi-process check with
# its reference script, an example driven by a CMake script, and the CUDA tests (skipped here).
SAMPLE = (r"^(ClipGradGoldenTest\.|TorchLoadTest\.|TrainingArgumentsTest\.TheDocsListEveryField"
          r"|SafetensorsInteropTest\.|ddp\.fp32$|examples\.char_gpt_hostile_inputs$"
          r"|.*Cuda.*|distributed\.nccl_collectives$)")


def fail(message):
    print(f"gpu pack rehearsal: FAILED: {message}")
    sys.exit(1)


def elf_files(folder):
    for directory, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    yield path


def main():
    build, work = (os.path.abspath(a) for a in sys.argv[1:3])
    python = sys.executable
    made, pack, out = (os.path.join(work, name) for name in ("made", "pack", "report"))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)

    result = subprocess.run([sys.executable, os.path.join(ROOT, "scripts/gpu-pack"), "--build",
                             build, "--out", made, "--python", python],
                            capture_output=True, text=True)
    print(result.stdout + result.stderr)
    if result.returncode != 0:
        fail("scripts/gpu-pack failed")
    shutil.move(made, pack)  # somewhere else than where it was made

    forbidden = [build, os.path.join(ROOT, "build"), os.path.dirname(os.path.dirname(python)),
                 os.path.realpath(os.path.dirname(os.path.dirname(python)))]
    site = subprocess.run([python, "-c", "import torch, os; print(os.path.dirname(os.path.dirname("
                                         "torch.__file__)))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    torch_lib = os.path.join(site, "torch", "lib")

    # 1. Each ELF's search path is relative to itself.
    for path in elf_files(pack):
        dynamic = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
        for kind, value in re.findall(r"\((RPATH|RUNPATH)\)\s+Library (?:rpath|runpath): \[(.*)\]",
                                      dynamic):
            for entry in value.split(":"):
                if entry and not entry.startswith("$ORIGIN"):
                    fail(f"{os.path.relpath(path, pack)} has {kind} entry '{entry}'")

    # 2. With only the pack's lib/ and torch's folders on LD_LIBRARY_PATH, every library
    # resolves, and none from the build or elsewhere in the venv than torch and its CUDA wheels.
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    env["LD_LIBRARY_PATH"] = ":".join([os.path.join(pack, "lib"), torch_lib])
    for path in elf_files(pack):
        listing = subprocess.run(["ldd", path], capture_output=True, text=True, env=env).stdout
        for soname, resolved in re.findall(r"^\s*(\S+) => (\S+)", listing, re.M):
            if resolved == "not":
                fail(f"{os.path.relpath(path, pack)}: {soname} not found")
            real = os.path.realpath(resolved)
            if real.startswith(os.path.realpath(pack) + os.sep):
                continue  # the pack may sit inside the build folder, as in CTest's run
            in_torch = real.startswith(os.path.realpath(site) + os.sep) and (
                "/torch/" in real or "/nvidia/" in real)
            if any(real.startswith(f + os.sep) for f in forbidden if f) and not in_torch:
                fail(f"{os.path.relpath(path, pack)}: {soname} resolves to {real}")
            if not (in_torch or real.startswith(("/lib", "/usr/lib", "/usr/local/cuda"))):
                fail(f"{os.path.relpath(path, pack)}: {soname} from {real}, outside the pack, "
                     "torch and the system")

    # 3. tests.json and manifest.json name no path of this machine's tree.
    for name in ("tests.json", "manifest.json"):
        with open(os.path.join(pack, name)) as f:
            text = f.read()
        for path in (build, ROOT + os.sep, python):
            if path in text:
                fail(f"{name} holds this machine's path {path}")

    # 4. A sample of the tests, run from the moved pack with a clean environment.
    run = subprocess.run([os.path.join(ROOT, "scripts/gpu-check"), "--prebuilt", pack, out,
                          "--parts", "machine,cuda_tests,python,cpu_tests", "--select", SAMPLE,
                          # The limits are the GPU machine's; this one runs beside other tests.
                          "--time-scale", "4"],
                         env=dict({k: v for k, v in os.environ.items()
                                   if k != "LD_LIBRARY_PATH"}, MANTISSA_PYTHON=python),
                         capture_output=True, text=True)
    print(run.stdout[-6000:] + run.stderr[-3000:])
    with open(os.path.join(out, "gpu-report.json")) as f:
        report = json.load(f)
    results = report["results"]
    bad = [r for r in results if r["status"] in ("failed", "timeout", "not_run")]
    for r in bad:
        print(f"--- {r['name']}: {r['status']}\n{r.get('output_tail', '')}")
    if bad:
        fail(f"{len(bad)} of the sample's tests did not pass")
    if sum(r["part"] == "python" and r["status"] == "passed" for r in results) != 2:
        fail("the python part (the package's tests and its benchmark) did not pass")
    cuda = [r for r in results if r["part"] == "cuda_tests"]
    cpu = [r for r in results if r["part"] == "cpu_tests"]
    if not cuda or not cpu:
        fail(f"the sample ran {len(cuda)} CUDA and {len(cpu)} CPU tests; it should run both")
    has_gpu = "True" in next((r.get("output_tail", "") for r in results if r["name"] == "torch"),
                             "")
    # Without a GPU the CUDA tests skip, except the few that check what a CPU-only machine does.
    skipped = sum(r["status"] == "skipped" for r in cuda)
    if not has_gpu and skipped < len(cuda) // 2:
        fail(f"without a GPU, only {skipped} of {len(cuda)} CUDA tests skipped")
    if run.returncode != 0:
        fail(f"scripts/gpu-check --prebuilt exited with {run.returncode}")
    passed = sum(r["status"] == "passed" for r in cpu)
    print(f"gpu pack rehearsal: {passed} CPU tests passed and {skipped} of {len(cuda)} CUDA tests "
          f"skipped from the moved pack")
    print("gpu pack rehearsal: passed")


if __name__ == "__main__":
    main()
