//! CPU time of teravm's threads by role, from `/proc/<pid>/task/*/stat`
//! (utime + stime, in clock ticks): what a `--live` run spends where while
//! the guest reports: the vCPU threads (`vcpu<n>`), the balloon's discard
//! workers (`discard-n<node>-<i>`) and the balloon device thread
//! (`balloon`). Read once before and once after the timed part; the
//! difference is the row's.

/// CPU seconds by role.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuSplit {
    /// The vCPU threads.
    pub vcpu_s: f64,
    /// The discard workers.
    pub discard_s: f64,
    /// The device thread: the balloon's, or virtio-mem's (`virtio-mem{n}`).
    pub device_s: f64,
}

/// The ticks of each role at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ticks {
    vcpu: u64,
    discard: u64,
    device: u64,
}

/// Which role a thread named `comm` has.
fn role(comm: &str) -> Option<usize> {
    if comm.starts_with("vcpu") {
        Some(0)
    } else if comm.starts_with("discard-n") {
        Some(1)
    } else if comm == "balloon" || comm.starts_with("virtio-mem") {
        Some(2)
    } else {
        None
    }
}

/// A thread's `stat` line: its name and utime + stime. None if it does
/// not parse.
pub fn parse_stat(line: &str) -> Option<(&str, u64)> {
    let open = line.find('(')?;
    let close = line.rfind(')')?;
    let comm = line.get(open + 1..close)?;
    // After "(comm) ": state is field 3; utime and stime are 14 and 15.
    let mut f = line.get(close + 2..)?.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some((comm, utime + stime))
}

impl Ticks {
    /// The ticks of `pid`'s threads now (threads that end in between are
    /// lost from the later reading: none of these end during a run).
    pub fn of(pid: u32) -> Ticks {
        let mut t = Ticks::default();
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return t;
        };
        for task in tasks.flatten() {
            let Ok(line) = std::fs::read_to_string(task.path().join("stat")) else {
                continue;
            };
            if let Some((comm, ticks)) = parse_stat(&line) {
                t.add(comm, ticks);
            }
        }
        t
    }

    fn add(&mut self, comm: &str, ticks: u64) {
        match role(comm) {
            Some(0) => self.vcpu += ticks,
            Some(1) => self.discard += ticks,
            Some(2) => self.device += ticks,
            _ => {}
        }
    }

    /// The CPU seconds from `earlier` to `self`.
    pub fn since(&self, earlier: &Ticks) -> CpuSplit {
        let hz = ticks_per_sec() as f64;
        let s = |now: u64, then: u64| now.saturating_sub(then) as f64 / hz;
        CpuSplit {
            vcpu_s: s(self.vcpu, earlier.vcpu),
            discard_s: s(self.discard, earlier.discard),
            device_s: s(self.device, earlier.device),
        }
    }
}

/// Clock ticks a second (`sysconf(_SC_CLK_TCK)`, 100 where it fails).
pub fn ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|&t| t > 0).unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_by_role() {
        let line = "4242 (discard-n0-1) S 1 2 3 4 5 6 7 8 9 10 250 30 0 0 20 0 1 0";
        assert_eq!(parse_stat(line), Some(("discard-n0-1", 280)));
        // A name with a space and a parenthesis.
        let odd = "7 (a (b) c) R 1 2 3 4 5 6 7 8 9 10 1 2 0";
        assert_eq!(parse_stat(odd), Some(("a (b) c", 3)));
        assert_eq!(parse_stat("7 (x) R 1"), None);
        let mut t = Ticks::default();
        t.add("vcpu0", 100);
        t.add("vcpu1", 5);
        t.add("discard-n1-0", 7);
        t.add("balloon", 3);
        t.add("api", 1000);
        assert_eq!(
            t,
            Ticks {
                vcpu: 105,
                discard: 7,
                device: 3
            }
        );
        let later = Ticks {
            vcpu: 105 + ticks_per_sec(),
            discard: 7,
            device: 3 + ticks_per_sec() / 2,
        };
        let d = later.since(&t);
        assert_eq!((d.vcpu_s, d.discard_s, d.device_s), (1.0, 0.0, 0.5));
    }

    #[test]
    fn this_process_has_no_vcpu_time() {
        let t = Ticks::of(std::process::id());
        assert_eq!(t.vcpu, 0);
    }
}
