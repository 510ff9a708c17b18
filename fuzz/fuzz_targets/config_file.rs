//! `VmConfig::from_json` over arbitrary text: never panics; a config it
//! accepts validates and round-trips through JSON; an error is one line.
//! Non-UTF-8 input goes, lossily converted, through `from_json`, and one
//! such input in 16 also through `from_file` (which must refuse it as
//! unreadable text).
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use teravm::config::{ConfigError, VmConfig};

fn check(text: &str) {
    let path = Path::new("fuzz.json");
    match VmConfig::from_json(text, path) {
        Ok(config) => {
            config.validate().expect("an accepted config validates");
            let again = serde_json::to_string(&config).unwrap();
            assert_eq!(
                VmConfig::from_json(&again, path).as_ref(),
                Ok(&config),
                "{again}"
            );
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains(['\r', '\n']), "not one line: {msg:?}");
        }
    }
}

/// One scratch file per fuzzing process, for the non-UTF-8 inputs.
fn scratch() -> &'static PathBuf {
    static SCRATCH: OnceLock<PathBuf> = OnceLock::new();
    SCRATCH.get_or_init(|| {
        std::env::temp_dir().join(format!("teravm-fuzz-config-{}.json", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    match std::str::from_utf8(data) {
        Ok(text) => check(text),
        Err(_) => {
            // Writing the file costs 7x the parse: do it for one input in 16
            // (chosen by length, so a finding reproduces).
            if data.len().is_multiple_of(16) {
                std::fs::write(scratch(), data).unwrap();
                let e = VmConfig::from_file(scratch()).unwrap_err();
                assert!(matches!(e, ConfigError::Read { .. }), "{e:?}");
                assert!(!e.to_string().contains(['\r', '\n']), "{e}");
            }
            check(&String::from_utf8_lossy(data));
        }
    }
});
