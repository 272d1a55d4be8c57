"""ctest driver for scripts/plot_metrics: plots a real training log and checks the PNG.

    python plot_metrics_test.py SCRIPT LOG_OR_RUN_DIR WORK_DIR

Checks that the script writes a non-trivial PNG for the given log, and that an empty or a
missing log fails with exit status 1 and a message naming the path.
"""
import os
import subprocess
import sys

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(script, *args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True)


def check_plot(script, log, work):
    out = os.path.join(work, "metrics.png")
    if os.path.exists(out):
        os.remove(out)
    result = run(script, log, "-o", out)
    if result.returncode != 0:
        return f"plotting {log} exited {result.returncode}: {result.stderr.strip()}"
    if not os.path.isfile(out):
        return f"plotting {log} wrote no {out}"
    with open(out, "rb") as f:
        data = f.read()
    if not data.startswith(PNG_MAGIC):
        return f"{out} does not start with the PNG signature"
    if len(data) < 10_000:  # four labelled panels with curves take tens of KB
        return f"{out} is only {len(data)} bytes"
    return None


def check_rejected(script, bad, work):
    result = run(script, bad, "-o", os.path.join(work, "bad.png"))
    if result.returncode != 1 or bad not in result.stderr:
        return f"plotting {bad} should fail naming it; got exit {result.returncode}, stderr {result.stderr.strip()!r}"
    return None


def main():
    script, log, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    empty = os.path.join(work, "empty.jsonl")
    open(empty, "w").close()
    problems = [
        check_plot(script, log, work),
        check_rejected(script, empty, work),
        check_rejected(script, os.path.join(work, "no-such-run"), work),
    ]
    failed = [p for p in problems if p]
    for problem in failed:
        print("FAIL:", problem)
    print(f"{len(problems) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
