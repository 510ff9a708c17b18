#!/usr/bin/env python3
"""Start-up and async-reply timings of teravm (issue 24, item 8):

- process start (just before the fork) to the firmware's first line on
  stdout, 1 vCPU, 256 MiB, THP, `touch=0 then=reset`, `--no-api`, with the
  default flags (seccomp on) and with `--no-seccomp`;
- the async `Shutdown` reply of a 4 GiB guest of 4 KiB pages (2 vCPUs, all
  RAM populated, then dirtied by the firmware, as `teravm-bench --vm`'s
  `vm-async` rows): a connection is opened, then the request is sent and
  timed until the whole 202 reply has been read.

    cargo build --release && python3 scripts/measure_startup.py [options]

Options:
    --runs N          first-line runs per binary and mode (default 15)
    --async-runs N    async-reply runs per binary (default 5; 0 skips them)
    --binary PATH     a teravm binary to time (repeatable; default
                      target/release/teravm). With several, the runs are
                      interleaved (A, B, A, B...), so that a loaded host
                      weighs on each alike: compare binaries this way.

Prints the median (min, max) of each series, per binary.
"""
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_TERAVM = os.path.join(ROOT, "target", "release", "teravm")
SMALL = {"machine-config": {"vcpu_count": 1, "mem_size_mib": 256, "huge_pages": "Transparent"},
         "boot-source": {"boot_args": "touch=0 then=reset"}}
BIG_4K = {"machine-config": {"vcpu_count": 2, "mem_size_mib": 4096, "huge_pages": "None"},
          "boot-source": {"boot_args": "touch=all then=idle"},
          "memory": {"populate": True},
          "reclaim": {"workers_per_node": 1, "parallel_threshold_mib": 0}}
DEADLINE_S = 120


def write_config(config):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(config, f)
    return f.name


def first_line_ms(teravm, seccomp):
    """One run to the end; returns ms from just before the fork to the
    firmware's first line."""
    cfg = write_config(SMALL)
    args = [teravm, "--config-file", cfg, "--no-api"] + ([] if seccomp else ["--no-seccomp"])
    try:
        start = time.monotonic()
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        line = proc.stdout.readline()
        first = time.monotonic() - start
        proc.stdout.read()
        if proc.wait(DEADLINE_S) != 0 or not line:
            sys.exit(f"{teravm} exited {proc.returncode}, first line {line!r}")
        return first * 1000
    finally:
        os.unlink(cfg)


def read_reply(conn):
    """Reads one HTTP reply (headers and Content-Length body); returns
    (status, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise RuntimeError(f"connection closed mid-reply: {data!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for h in lines[1:]:
        k, _, v = h.partition(":")
        if k.strip().lower() == "content-length":
            length = int(v)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            raise RuntimeError("connection closed mid-body")
        body += chunk
    return status, body.decode()


def async_reply_ms(teravm):
    """Boots the 4 GiB 4 KiB guest, waits for the firmware's idle line, then
    times the async Shutdown reply; waits for the process to end."""
    tmp = tempfile.mkdtemp(prefix="teravm-measure-")
    cfg = os.path.join(tmp, "vm.json")
    sock_path = os.path.join(tmp, "api.sock")
    with open(cfg, "w") as f:
        json.dump(BIG_4K, f)
    proc = subprocess.Popen([teravm, "--config-file", cfg, "--api-sock", sock_path,
                             "--linger-ms", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:
            if "teravm firmware: idle" in line:
                break
        else:
            sys.exit(f"{teravm}: no idle line (exit {proc.wait()})")
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(sock_path)
        body = b'{"action_type": "Shutdown", "reclaim": "async"}'
        request = (b"PUT /actions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                   b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        start = time.monotonic()
        conn.sendall(request)
        status, reply = read_reply(conn)
        ms = (time.monotonic() - start) * 1000
        if status != 202:
            sys.exit(f"{teravm}: async Shutdown answered {status} {reply}")
        conn.close()
        proc.stdout.read()
        proc.wait(DEADLINE_S)
        return ms
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for name in ("vm.json", "api.sock"):
            try:
                os.unlink(os.path.join(tmp, name))
            except FileNotFoundError:
                pass
        os.rmdir(tmp)


def summary(label, values):
    print(f"{label}: median {statistics.median(values):.2f} ms "
          f"(min {min(values):.2f}, max {max(values):.2f}, {len(values)} runs)", flush=True)


def main():
    argv = sys.argv[1:]
    runs, async_runs, binaries = 15, 5, []
    while argv:
        flag = argv.pop(0)
        if flag == "--runs":
            runs = int(argv.pop(0))
        elif flag == "--async-runs":
            async_runs = int(argv.pop(0))
        elif flag == "--binary":
            binaries.append(argv.pop(0))
        else:
            sys.exit(__doc__)
    binaries = binaries or [DEFAULT_TERAVM]
    first = {(b, s): [] for b in binaries for s in (True, False)}
    for _ in range(runs):
        for b in binaries:
            for seccomp in (True, False):
                first[(b, seccomp)].append(first_line_ms(b, seccomp))
    replies = {b: [] for b in binaries}
    for _ in range(async_runs):
        for b in binaries:
            replies[b].append(async_reply_ms(b))
    for b in binaries:
        print(b)
        if runs:
            summary("  start -> first firmware line, 1 vCPU 256 MiB", first[(b, True)])
            summary("  the same with --no-seccomp", first[(b, False)])
        if async_runs:
            summary("  async Shutdown reply, 4 GiB 4 KiB", replies[b])
            print(f"    replies: {' '.join(f'{v:.2f}' for v in replies[b])}")


if __name__ == "__main__":
    main()
