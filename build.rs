//! Assembles the built-in firmware (`firmware/firmware.S`) with binutils and
//! leaves a flat binary in `OUT_DIR/firmware.bin` for `include_bytes!`.

use std::path::PathBuf;
use std::process::Command;

fn run(cmd: &mut Command) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (is binutils installed?): {e}"));
    assert!(status.success(), "{cmd:?} failed: {status}");
}

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let obj = out.join("firmware.o");
    let elf = out.join("firmware.elf");
    let bin = out.join("firmware.bin");
    println!("cargo:rerun-if-changed=firmware/firmware.S");
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
