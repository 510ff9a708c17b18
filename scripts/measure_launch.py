#!/usr/bin/env python3
"""Launch timings of teravm: process start to the firmware's first line, and
the firmware's time to dirty 4 GiB with 1 and 2 vCPUs, 4 KiB pages and THP.

    cargo build --release && python3 scripts/measure_launch.py [RUNS]

Prints medians over RUNS runs (default 3; 10 for the first-line timing).
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TERAVM = os.path.join(ROOT, "target", "release", "teravm")


def run(vcpus, mib, huge_pages, boot_args):
    """Runs one microVM to its end; returns (s to first line, touch ms)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"machine-config": {"vcpu_count": vcpus, "mem_size_mib": mib,
                                      "huge_pages": huge_pages},
                   "boot-source": {"boot_args": boot_args}}, f)
    start = time.monotonic()
    proc = subprocess.Popen([TERAVM, "--config-file", f.name, "--no-api"],
                            stdout=subprocess.PIPE, text=True)
    first = touched = None
    for line in proc.stdout:
        if first is None:
            first = time.monotonic() - start
        m = re.search(r"touched (\d+) MiB in (\d+) ms", line)
        if m:
            touched = int(m.group(2))
    if proc.wait() != 0:
        sys.exit(f"teravm exited {proc.returncode}")
    os.unlink(f.name)
    return first, touched


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for vcpus, mib, label in [(1, 256, "1 vCPU, 256 MiB"), (2, 1 << 20, "2 vCPUs, 1 TiB sparse")]:
        n = 10 if mib < 4096 else runs
        t = [run(vcpus, mib, "Transparent", "touch=0 then=reset")[0] * 1000 for _ in range(n)]
        print(f"start -> first firmware line, {label}: median {statistics.median(t):.1f} ms "
              f"(min {min(t):.1f}, max {max(t):.1f}, {n} runs)")
    for huge_pages in ["Transparent", "None"]:
        for vcpus in [1, 2]:
            t = [run(vcpus, 4096, huge_pages, "touch=all then=reset")[1] for _ in range(runs)]
            print(f"touch 4 GiB, huge_pages {huge_pages}, {vcpus} vCPU(s): "
                  f"median {statistics.median(t)} ms {t}")


if __name__ == "__main__":
    main()
