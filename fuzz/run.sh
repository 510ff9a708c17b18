#!/usr/bin/env bash
# Fuzz what a stranger or a guest reaches (the input parsers, the port I/O
# bus, the virtio-mmio transport, the balloon's queues) with cargo-fuzz
# (libFuzzer) for SECONDS each (default 60), on the stable toolchain, and
# exit non-zero on any finding.
#
#   fuzz/run.sh [SECONDS]
#
# cargo-fuzz passes -Zsanitizer and other -Z flags to rustc, which stable
# refuses unless RUSTC_BOOTSTRAP=1; that is set here, for these builds only.
# Each target starts from a temporary copy of its committed seeds in
# fuzz/corpus/<target>/ (the committed corpus is never grown); a crash, panic,
# hang (-timeout), large allocation (-malloc_limit_mb) or RSS blow-up
# (-rss_limit_mb) is a finding, saved under fuzz/artifacts/<target>/.
# Reproduce one with:
#   RUSTC_BOOTSTRAP=1 cargo fuzz run -a <target> fuzz/artifacts/<target>/<file>
# Targets run FUZZ_JOBS at a time (default: the number of CPUs).
set -euo pipefail
cd "$(dirname "$0")"

secs=${1:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
CARGO_FUZZ_VERSION=0.13.2
targets=(http_request api_route api_body config_file port_io virtio_mmio balloon_queues block_queues net_queues vsock_queues virtio_mem)
declare -A dicts=([http_request]=http [api_route]=json [api_body]=json [config_file]=json [port_io]= [virtio_mmio]= [balloon_queues]= [block_queues]= [net_queues]= [vsock_queues]= [virtio_mem]=)
# Longest input: past MAX_LINE_BYTES (8 KiB) for the HTTP parser, the default
# (4 KiB, or the longest seed) for the JSON bodies and files, and 4 KiB (1024
# accesses) for the port I/O bus, which has no dictionary; 8 KiB for the
# virtio transport (1024 register accesses: a whole driver set-up and then
# some) and the balloon's queues (hundreds of descriptors and ring entries).
# Their seeds replay as the fuzz crate's tests (fuzz/src/seeds.rs), run here
# first: `cargo test --release --lib` in fuzz/.
declare -A max_len=([http_request]=20000 [api_route]=4096 [api_body]=4096 [config_file]=4096 [port_io]=4096 [virtio_mmio]=8192 [balloon_queues]=8192 [block_queues]=8192 [net_queues]=8192 [vsock_queues]=8192 [virtio_mem]=8192)

export RUSTC_BOOTSTRAP=1
# -a: debug assertions and overflow checks on, so an arithmetic overflow panics.
fuzz_flags=(--release -a --sanitizer address)

start=$(date +%s)
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION"
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi
installed=$(date +%s)

echo "== replaying the committed seeds (cargo test in fuzz/)"
cargo test --release --lib
seeds=$(date +%s)

echo "== building ${targets[*]}"
cargo fuzz build "${fuzz_flags[@]}"
bin_dir=target/$(rustc -vV | sed -n 's/^host: //p')/release
built=$(date +%s)

work=$(mktemp -d "${TMPDIR:-/tmp}/teravm-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

run_one() {
    local t=$1 rc=0
    mkdir -p "$work/corpus/$t" "$work/tmp/$t"
    cp corpus/"$t"/* "$work/corpus/$t/"
    mkdir -p "artifacts/$t"
    # The binary cargo fuzz built, run as `cargo fuzz run` would run it.
    # TMPDIR: where config_file writes its scratch file.
    TMPDIR="$work/tmp/$t" "$bin_dir/$t" -artifact_prefix="artifacts/$t/" \
        -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512 \
        -max_len="${max_len[$t]}" ${dicts[$t]:+-dict="dict/${dicts[$t]}.dict"} -print_final_stats=1 "$work/corpus/$t" \
        >"$work/$t.log" 2>&1 || rc=$?
    echo "$rc" >"$work/$t.rc"
}

echo "== fuzzing each target for ${secs}s, $jobs at a time"
for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    run_one "$t" &
done
wait

failed=0
printf '%-14s %12s %10s  %s\n' target executions corpus result
for t in "${targets[@]}"; do
    rc=$(cat "$work/$t.rc")
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -1)
    cov=$(grep -o 'corp: [0-9]*/[0-9a-zA-Z]*' "$work/$t.log" | tail -1 | cut -d' ' -f2)
    if [ "$rc" = 0 ]; then
        result=ok
    else
        failed=1
        why=$(grep -m1 -A1 -E 'panicked at' "$work/$t.log" | tr '\n' ' ' || true)
        [ -n "$why" ] || why=$(grep -m1 -E 'ERROR: |SUMMARY: ' "$work/$t.log" || echo 'see the log')
        result="FINDING (exit $rc): $why"
    fi
    printf '%-14s %12s %10s  %s\n' "$t" "${execs:-?}" "${cov:-?}" "$result"
    if [ "$rc" != 0 ]; then
        echo "---- last lines of the $t log:"
        tail -40 "$work/$t.log"
        for a in $(grep -o "artifacts/$t/[a-z]*-[0-9a-f]*" "$work/$t.log" | sort -u); do
            echo "---- artifact fuzz/$a; reproduce: RUSTC_BOOTSTRAP=1 cargo fuzz run ${fuzz_flags[*]} $t fuzz/$a"
        done
    fi
done
end=$(date +%s)
echo "== install $((installed - start))s, seeds $((seeds - installed))s, build $((built - seeds))s, fuzz $((end - built))s, total $((end - start))s"
exit "$failed"
