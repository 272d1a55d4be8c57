"""What the ctest smoke runs of the benchmark drivers share (anchors_smoke_test.py,
sharded_memory_smoke_test.py): their command line, and running a driver to its final JSON line."""

import argparse
import json
import subprocess


def parse_args(description):
    """--build_dir (the CMake build folder) and --python (the project venv's python)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--build_dir", required=True)
    p.add_argument("--python", required=True)
    return p.parse_args()


def run_driver(cmd, name, timeout=600):
    """Runs `cmd`, echoes its output, asserts that it exited with 0 and returns its last line of
    stdout parsed as JSON (every driver ends with one)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    print(proc.stdout + proc.stderr)
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
