#!/bin/sh
# Builds teravm as one static executable (glibc linked in, `crt-static` on
# the gnu target), the binary a jail runs: Firecracker's jailer copies the
# file it is given into an empty chroot, where there is no loader and no
# libc. Prints the binary's path on its last line (docs/fleet.md).
#
#   scripts/build-static.sh            # -> target/x86_64-unknown-linux-gnu/release/teravm
#
# The flag is given per target (CARGO_TARGET_<triple>_RUSTFLAGS) with an
# explicit --target, so that build scripts and proc macros, which run on
# the host and cannot be static, are built as usual. The result lives in
# its own folder under the target dir; the dynamic build in
# target/release is untouched. Checked: `file` must say "static".
set -eu
cd "$(dirname "$0")/.."

triple=x86_64-unknown-linux-gnu
flags_var=CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS
# A caller's own flags for this target are kept, with crt-static added.
eval "existing=\${$flags_var:-}"
export "$flags_var=${existing:+$existing }-C target-feature=+crt-static"

cargo build --release --locked --target "$triple" --bin teravm >&2

bin="${CARGO_TARGET_DIR:-target}/$triple/release/teravm"
case "$(file -b "$bin")" in
    *static*) ;;
    *)
        echo "build-static: $bin is not static: $(file -b "$bin")" >&2
        exit 1
        ;;
esac
echo "$(cd "$(dirname "$bin")" && pwd)/teravm"
