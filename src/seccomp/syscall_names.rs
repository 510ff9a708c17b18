//! The names of x86-64 Linux system calls, for the SIGSYS message and
//! docs/seccomp.md, from the `syscalls` crate (a `const` match per kernel
//! release, without allocation: safe in the SIGSYS handler).

use syscalls::Sysno;

/// The name of system call `nr`, or `?`.
pub(crate) fn name(nr: i64) -> &'static str {
    i32::try_from(nr)
        .ok()
        .and_then(|nr| Sysno::new(nr as usize))
        .map_or("?", |s| s.name())
}

#[cfg(test)]
mod tests {
    use super::name;

    #[test]
    fn names_match_libc_numbers() {
        assert_eq!(name(libc::SYS_read), "read");
        assert_eq!(name(libc::SYS_ioctl), "ioctl");
        assert_eq!(name(libc::SYS_socket), "socket");
        assert_eq!(name(libc::SYS_execve), "execve");
        assert_eq!(name(libc::SYS_rseq), "rseq");
        assert_eq!(name(libc::SYS_clone3), "clone3");
        assert_eq!(name(libc::SYS_pidfd_open), "pidfd_open");
        assert_eq!(name(400), "?");
        assert_eq!(name(-1), "?");
        assert_eq!(name(100_000), "?");
    }
}
