//! Assembles the built-in firmware (`firmware/firmware.S`) with binutils and
//! leaves a flat binary in `OUT_DIR/firmware.bin` for `include_bytes!`; and
//! builds the test guest (`guest/`, a `#![no_std]` PVH ELF in a workspace of
//! its own, because it needs `panic = "abort"` and teravm needs unwinding)
//! with a nested `cargo build --release`, leaving it beside teravm's
//! binaries as `target/<profile>/teravm-guest`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (is binutils installed?): {e}"));
    assert!(status.success(), "{cmd:?} failed: {status}");
}

fn firmware(out: &Path) {
    let obj = out.join("firmware.o");
    let elf = out.join("firmware.elf");
    let bin = out.join("firmware.bin");
    // The directory: firmware.S .includes the other .S files in it.
    println!("cargo:rerun-if-changed=firmware");
    println!("cargo:rerun-if-changed=firmware/firmware.ld");
    run(Command::new("as")
        .args(["--64", "-o"])
        .arg(&obj)
        .arg("firmware/firmware.S"));
    run(Command::new("ld")
        .args(["-nostdlib", "-static", "-T", "firmware/firmware.ld", "-o"])
        .arg(&elf)
        .arg(&obj));
    run(Command::new("objcopy")
        .args(["-O", "binary"])
        .arg(&elf)
        .arg(&bin));
}

/// Builds guest/ into `<target>/guest` and copies the ELF to
/// `<target>/<profile>/teravm-guest`. OUT_DIR is
/// `<target>/<profile>/build/<package>-<hash>/out`.
fn guest(out: &Path) {
    for p in [
        "guest/src",
        "guest/Cargo.toml",
        "guest/Cargo.lock",
        "guest/build.rs",
        "guest/guest.ld",
    ] {
        println!("cargo:rerun-if-changed={p}");
    }
    let profile_dir = out.ancestors().nth(3).expect("OUT_DIR has a profile dir");
    let target_dir = profile_dir.parent().expect("a target dir").join("guest");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--quiet", "--manifest-path"])
        .arg("guest/Cargo.toml")
        .arg("--target-dir")
        .arg(&target_dir);
    // What the outer build was given is not the guest's: its flags, a
    // wrapper (clippy's driver), the outer target.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_RUSTFLAGS",
    ] {
        cmd.env_remove(var);
    }
    // Per-target flags too (scripts/build-static.sh's crt-static, which
    // the guest's host-side proc macros cannot take).
    for (var, _) in std::env::vars_os() {
        let name = var.to_string_lossy();
        if name.starts_with("CARGO_TARGET_") && name.ends_with("_RUSTFLAGS") {
            cmd.env_remove(&var);
        }
    }
    run(&mut cmd);
    let built = target_dir.join("release/teravm-guest");
    let dest = profile_dir.join("teravm-guest");
    std::fs::copy(&built, &dest)
        .unwrap_or_else(|e| panic!("cannot copy {} to {}: {e}", built.display(), dest.display()));
}

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    firmware(&out);
    // A static build (scripts/build-static.sh) is the binary a jail runs;
    // the tests take the guest from the dynamic build, so it is not built
    // again for it.
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    if !features.split(',').any(|f| f == "crt-static") {
        guest(&out);
    }
}
