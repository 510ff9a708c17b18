//! What the benchmark's integration tests share: the skip rule of teravm's
//! own tests (`tests/common` at the root: a test that cannot run fails under
//! `CI=true`) and temp dirs.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether this run is CI's (`CI=true`): a test that cannot run fails there.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Says why `test` cannot run here; in CI, fails it instead.
pub fn skip(test: &str, reason: impl std::fmt::Display) {
    if in_ci() {
        panic!("{test} cannot run in CI (CI=true): {reason}");
    }
    eprintln!("SKIPPED {test}: {reason}");
}

/// Whether /dev/kvm can be used (see [`skip`] when not).
pub fn kvm_or_skip(test: &str) -> bool {
    match teravm::vstate::vm::Vm::available() {
        Ok(()) => true,
        Err(e) => {
            skip(test, e);
            false
        }
    }
}

/// A fresh temp dir for one test.
pub fn temp_dir(name: &str) -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "teravm-bench-test-{}-{}-{}",
        std::process::id(),
        name,
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
