#!/bin/sh
# Fetches the stock Debian cloud kernel (linux-image-cloud-amd64's real
# package) with `apt-get download`, extracts its bzImage (`vmlinuz`) and the
# ELF `vmlinux` inside it, and caches both outside the repository:
#
#   $TERAVM_KERNEL_DIR (default: $XDG_CACHE_HOME/teravm-kernel, or
#   ~/.cache/teravm-kernel)/{vmlinuz,vmlinux,VERSION}
#
# Idempotent: a cache that already holds both files is left alone. Needs
# apt-get, dpkg-deb, python3 and the decompressor the bzImage names (this
# kernel's payload is LZ4: Debian's `lz4` package). Prints the directory.
set -eu

dir="${TERAVM_KERNEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/teravm-kernel}"
if [ -s "$dir/vmlinuz" ] && [ -s "$dir/vmlinux" ]; then
    echo "$dir"
    exit 0
fi
mkdir -p "$dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The meta package depends on the versioned one, which holds the kernel.
pkg="$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n1)"
[ -n "$pkg" ] || { echo "fetch-kernel: linux-image-cloud-amd64 has no kernel dependency (apt-get update?)" >&2; exit 1; }
(cd "$work" && apt-get download "$pkg" >&2)
dpkg-deb -x "$work"/"$pkg"_*.deb "$work/root"
vmlinuz="$(ls "$work"/root/boot/vmlinuz-* | head -n1)"

# The payload: setup_sects at 0x1f1, payload_offset/length at 0x248/0x24c
# (relative to the protected-mode code at (setup_sects + 1) * 512).
python3 - "$vmlinuz" "$work/payload" <<'PY'
import struct, sys
img = open(sys.argv[1], "rb").read()
assert img[0x202:0x206] == b"HdrS", "not a bzImage"
setup_sects = img[0x1f1] or 4
off, length = struct.unpack_from("<II", img, 0x248)
start = (setup_sects + 1) * 512 + off
open(sys.argv[2], "wb").write(img[start:start + length])
PY
magic="$(od -An -tx1 -N4 "$work/payload" | tr -d ' ')"
case "$magic" in
    02214c18) lz4 -dc "$work/payload" > "$work/vmlinux" 2>/dev/null || true ;;
    1f8b*) gzip -dc "$work/payload" > "$work/vmlinux" 2>/dev/null || true ;;
    fd377a58) xz -dc "$work/payload" > "$work/vmlinux" 2>/dev/null || true ;;
    28b52ffd) zstd -dc "$work/payload" > "$work/vmlinux" 2>/dev/null || true ;;
    *) echo "fetch-kernel: unknown payload compression (magic $magic)" >&2; exit 1 ;;
esac
# The decompressors may complain about the size the kernel appends after the
# stream; what counts is an ELF file.
[ "$(head -c4 "$work/vmlinux" | od -An -c | tr -d ' ')" = '177ELF' ] \
    || { echo "fetch-kernel: the payload did not decompress to an ELF vmlinux" >&2; exit 1; }
cp "$vmlinuz" "$dir/vmlinuz.tmp" && mv "$dir/vmlinuz.tmp" "$dir/vmlinuz"
cp "$work/vmlinux" "$dir/vmlinux.tmp" && mv "$dir/vmlinux.tmp" "$dir/vmlinux"
basename "$vmlinuz" | sed 's/^vmlinuz-//' > "$dir/VERSION"
echo "$dir"
