//! The entry point of `teravm-bench`: parses the command line, checks the
//! size against the host's MemAvailable, and runs the benchmark (or, with the
//! hidden `--exit-child`, the baselines' child); errors are one line on
//! stderr.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser;

use crate::args::{check_size, Args};
use teravm_client::host::read_mem_available;

/// clap's error text on one line: its first line, plus the possible values
/// when it lists them, or the arguments it names when the first line ends
/// in a colon (`the following required arguments were not provided:`).
fn one_line(text: &str) -> String {
    let mut lines = text.lines();
    let mut line = lines
        .next()
        .unwrap_or("invalid arguments")
        .trim_start_matches("error: ")
        .to_string();
    if line.ends_with(':') {
        let named: Vec<&str> = lines.map(str::trim).take_while(|l| !l.is_empty()).collect();
        if !named.is_empty() {
            line.push(' ');
            line.push_str(&named.join(", "));
        }
    }
    if let Some(values) = text
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("[possible values:"))
    {
        line.push(' ');
        line.push_str(values);
    }
    line
}

/// Parses the command line and runs the benchmark (or the `exit` child);
/// errors are printed as one line on stderr.
pub fn main_with<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut args = match Args::try_parse_from(args) {
        Ok(a) => a,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            eprintln!("teravm-bench: {}", one_line(&e.to_string()));
            return ExitCode::from(1);
        }
    };
    let result = args.validate().and_then(|()| {
        if args.exit_child {
            crate::child::child_main(&args)
        } else {
            let available = read_mem_available(Path::new("/proc/meminfo"))?;
            check_size(args.size_gib, available)?;
            if args.snapshot {
                crate::snapshot::run(&args)
            } else {
                crate::runner::run(&args)
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = std::io::stdout().flush();
            eprintln!("teravm-bench: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_errors_fit_on_one_line() {
        let e = Args::try_parse_from(["b", "--pages", "x"]).unwrap_err();
        let line = one_line(&e.to_string());
        assert!(!line.contains('\n'));
        assert!(line.starts_with("invalid value 'x' for '--pages"), "{line}");
        assert!(line.ends_with("[possible values: 4k, thp]"), "{line}");
    }

    #[test]
    fn a_missing_required_argument_is_named() {
        let e = Args::try_parse_from(["b", "--qemu", "/bin/sh"]).unwrap_err();
        let line = one_line(&e.to_string());
        assert_eq!(
            line,
            "the following required arguments were not provided: --peers <PEERS>"
        );
    }
}
