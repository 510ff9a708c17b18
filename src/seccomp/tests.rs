//! Unit tests of the filters: they build, they hold what each role needs,
//! and installed on a real thread they allow its calls and trap others.

use super::filters::kvm;
use super::*;

#[test]
fn kvm_request_numbers_are_the_kernels() {
    // As strace shows them for teravm (and as linux/kvm.h defines them).
    assert_eq!(kvm::CREATE_VM, 0xae01);
    assert_eq!(kvm::CHECK_EXTENSION, 0xae03);
    assert_eq!(kvm::GET_VCPU_MMAP_SIZE, 0xae04);
    assert_eq!(kvm::GET_SUPPORTED_CPUID, 0xc008_ae05);
    assert_eq!(kvm::CREATE_VCPU, 0xae41);
    assert_eq!(kvm::SET_USER_MEMORY_REGION, 0x4020_ae46);
    assert_eq!(kvm::RUN, 0xae80);
    assert_eq!(kvm::SET_REGS, 0x4090_ae82);
    assert_eq!(kvm::GET_SREGS, 0x8138_ae83);
    assert_eq!(kvm::SET_SREGS, 0x4138_ae84);
    assert_eq!(kvm::SET_FPU, 0x41a0_ae8d);
    assert_eq!(kvm::SET_CPUID2, 0x4008_ae90);
}

#[test]
fn every_role_builds() {
    for role in Role::ALL {
        let built = build(role).unwrap();
        assert!(!built.is_empty(), "{role:?}");
        // The cached program (what `install` applies) is the same one.
        assert_eq!(program(role).unwrap(), &built, "{role:?}");
    }
}

#[test]
fn spawners_cover_their_children() {
    for role in Role::ALL {
        let mine = role.syscalls();
        for child in role.children() {
            for nr in child.syscalls() {
                assert!(mine.contains(&nr), "{role:?} lacks {nr} of {child:?}");
            }
        }
    }
}

#[test]
fn confined_roles_lack_dangerous_calls() {
    let forbidden = [
        libc::SYS_execve,
        libc::SYS_execveat,
        libc::SYS_fork,
        libc::SYS_vfork,
        libc::SYS_socket,
        libc::SYS_connect,
        libc::SYS_ptrace,
        libc::SYS_process_vm_writev,
        libc::SYS_mount,
        libc::SYS_setuid,
        libc::SYS_kill,
    ];
    for role in Role::ALL {
        for nr in forbidden {
            // The files thread checks that a tap exists with a datagram
            // socket (AF_INET only: checked below), which it cannot send on.
            if matches!(role, Role::Files | Role::Vsock | Role::Start) && nr == libc::SYS_socket {
                continue;
            }
            // The vsock thread connects guest connections to
            // `<uds_path>_<port>`; the start job, which starts it, allows
            // what it does (filters stack).
            if matches!(role, Role::Vsock | Role::Start) && nr == libc::SYS_connect {
                continue;
            }
            assert!(!role.syscalls().contains(&nr), "{role:?} allows {nr}");
        }
    }
    let files_socket = Role::Files
        .allowed()
        .into_iter()
        .find(|a| a.nr == libc::SYS_socket)
        .expect("the files thread's socket");
    let super::filters::Only::OneOf { arg: 0, values } = files_socket.only else {
        panic!("the files thread's socket has no domain check");
    };
    assert_eq!(
        values.iter().map(|v| v.0).collect::<Vec<_>>(),
        [libc::AF_INET as u64, libc::AF_UNIX as u64]
    );
    for nr in [libc::SYS_sendto, libc::SYS_sendmsg, libc::SYS_connect] {
        assert!(!Role::Files.syscalls().contains(&nr), "files allows {nr}");
    }
    // Guest-facing and client-facing threads open nothing, spawn nothing.
    for role in [Role::Vcpu, Role::ApiConnection, Role::Console] {
        for nr in [
            libc::SYS_openat,
            libc::SYS_open,
            libc::SYS_clone3,
            libc::SYS_accept4,
        ] {
            assert!(!role.syscalls().contains(&nr), "{role:?} allows {nr}");
        }
    }
    assert!(!Role::Vcpu.syscalls().contains(&libc::SYS_read));
    // Only roles that start threads may clone, and only threads (checked
    // on a real thread below).
    for role in Role::ALL {
        let clones = role.syscalls().contains(&libc::SYS_clone);
        assert_eq!(clones, role.spawns(), "{role:?}");
    }
    // Only the files thread opens for writing; the main thread opens nothing.
    for role in Role::ALL {
        for a in role.allowed() {
            if a.nr != libc::SYS_openat {
                continue;
            }
            let super::filters::Only::OneOf { values, .. } = a.only else {
                panic!("{role:?}: openat without a flag check");
            };
            for (flags, name) in values {
                let writes = (*flags as i32) & libc::O_ACCMODE != libc::O_RDONLY;
                assert!(!writes || role == Role::Files, "{role:?} opens {name}");
            }
        }
    }
    assert!(!Role::Vmm.syscalls().contains(&libc::SYS_openat));
    assert!(!Role::Vmm.syscalls().contains(&libc::SYS_clone));
}

#[test]
fn spawners_start_threads_but_never_processes() {
    let t = std::thread::spawn(|| {
        install(Role::Reclaim, Policy::Enforce).unwrap();
        // A thread starts (clone3 says ENOSYS, glibc falls back to clone).
        let child = std::thread::spawn(|| 7).join().unwrap();
        // SAFETY: clone3 with a null argument: the filter answers before
        // the kernel reads it.
        let r = unsafe { libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0usize) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        (child, r, errno)
    });
    let (child, r, errno) = t.join().unwrap();
    assert_eq!(child, 7);
    assert_eq!((r, errno), (-1, Some(libc::ENOSYS)));
    // A fork (clone without CLONE_THREAD) is trapped: checked in a child
    // process, which the SIGSYS ends.
    // Built here: the child of a multithreaded process must not allocate.
    for role in Role::ALL {
        program(role).unwrap();
    }
    no_clone3().unwrap();
    sigsys::install_handler().unwrap();
    // SAFETY: fork in a test; the child only installs a filter and forks.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let _ = install(Role::Reclaim, Policy::Enforce);
        // SAFETY: a raw fork, which the filter refuses before it happens.
        unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as u64, 0u64) };
        // SAFETY: reached only if the fork was allowed.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == EXIT_BAD_SYSCALL,
        "status {status:#x}"
    );
}

fn status_field(tid: i32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[test]
fn an_installed_filter_confines_only_its_thread() {
    for role in [Role::Vcpu, Role::ApiConnection, Role::Reclaim] {
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name(format!("test-{}", role.name()))
            .spawn(move || {
                install(role, Policy::Enforce).unwrap();
                assert!(FILTERED.with(Cell::get));
                // Allowed under every role: gettid, futex (the channels),
                // write, and a growing allocation (mmap, mremap, munmap).
                // SAFETY: gettid takes no arguments.
                let tid = unsafe { libc::gettid() };
                let big = vec![7u8; 8 << 20];
                let mut v = big.clone();
                v.resize(32 << 20, 1);
                tid_tx.send((tid, v[8 << 20])).unwrap();
                go_rx.recv().unwrap();
            })
            .unwrap();
        let (tid, byte) = tid_rx.recv().unwrap();
        assert_eq!(byte, 1);
        assert_eq!(status_field(tid, "Seccomp:"), "2", "{role:?}");
        assert_eq!(status_field(tid, "NoNewPrivs:"), "1", "{role:?}");
        // SAFETY: gettid takes no arguments.
        let me = unsafe { libc::gettid() };
        assert_eq!(
            status_field(me, "Seccomp:"),
            "0",
            "the test thread stays free"
        );
        go_tx.send(()).unwrap();
        t.join().unwrap();
    }
}

#[test]
fn off_installs_nothing() {
    std::thread::spawn(|| {
        install(Role::Vcpu, Policy::Off).unwrap();
        assert!(!FILTERED.with(Cell::get));
        // SAFETY: gettid takes no arguments.
        let tid = unsafe { libc::gettid() };
        assert_eq!(status_field(tid, "Seccomp:"), "0");
    })
    .join()
    .unwrap();
}

#[test]
fn names_of_the_lists() {
    let vcpu = Role::Vcpu.syscall_names();
    assert!(
        vcpu.contains(&"ioctl") && vcpu.contains(&"futex"),
        "{vcpu:?}"
    );
    assert!(Role::Vmm.syscalls().len() > Role::Vcpu.syscalls().len());
}

/// Prints every role's list and size (docs/seccomp.md points here).
#[test]
fn print_lists() {
    for role in Role::ALL {
        let names = role.syscall_names();
        assert!(!names.contains(&"?"), "{role:?}: {names:?}");
        println!("{} ({}): {}", role.name(), names.len(), names.join(" "));
    }
}

/// The values a role allows for argument `arg` of `nr`, if the call is
/// allowed only for listed values.
fn allowed_values(role: Role, nr: i64, arg: u8) -> Vec<u64> {
    role.allowed()
        .into_iter()
        .filter(|a| a.nr == nr)
        .flat_map(|a| match a.only {
            super::filters::Only::OneOf { arg: a2, values } if a2 == arg => {
                values.iter().map(|v| v.0).collect::<Vec<u64>>()
            }
            other => panic!("{role:?}: {nr} is allowed as {other:?}"),
        })
        .collect()
}

#[test]
fn guest_memfd_calls_are_the_start_jobs_virtio_mems_and_the_reclaims_only() {
    // The kernel's numbers (linux/kvm.h).
    assert_eq!(kvm::CREATE_GUEST_MEMFD, 0xc040_aed4);
    assert_eq!(kvm::SET_USER_MEMORY_REGION2, 0x40a0_ae49);
    let start = allowed_values(Role::Start, libc::SYS_ioctl, 1);
    assert!(start.contains(&kvm::CREATE_GUEST_MEMFD));
    assert!(start.contains(&kvm::SET_USER_MEMORY_REGION2));
    for role in Role::ALL {
        if role == Role::Start {
            continue;
        }
        if role.syscalls().contains(&libc::SYS_ioctl) {
            let values = allowed_values(role, libc::SYS_ioctl, 1);
            assert!(!values.contains(&kvm::CREATE_GUEST_MEMFD), "{role:?}");
            // virtio-mem's thread maps a plugged guest_memfd slot, and it
            // or a discard worker takes an emptied one out (neither makes
            // a file).
            assert_eq!(
                values.contains(&kvm::SET_USER_MEMORY_REGION2),
                role == Role::Mem || role == Role::Discard,
                "{role:?}"
            );
        }
    }
    // fallocate: allocate (populate) only on the start job; everywhere else
    // only the hole punch; never a mode that resizes the file.
    let punch = (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE) as u64;
    let keep = libc::FALLOC_FL_KEEP_SIZE as u64;
    for role in Role::ALL {
        if !role.syscalls().contains(&libc::SYS_fallocate) {
            continue;
        }
        let mut modes = allowed_values(role, libc::SYS_fallocate, 1);
        modes.sort_unstable();
        modes.dedup();
        let want = if role == Role::Start {
            let mut m = vec![keep, punch];
            m.sort_unstable();
            m
        } else {
            vec![punch]
        };
        assert_eq!(modes, want, "{role:?}");
        assert!(!modes.contains(&0), "{role:?} may grow a file");
    }
    assert!(Role::Start.syscalls().contains(&libc::SYS_move_pages));
    assert!(Role::Reclaim.syscalls().contains(&451), "cachestat");
    for role in [Role::Vcpu, Role::Api, Role::ApiConnection, Role::Vmm] {
        assert!(!role.syscalls().contains(&libc::SYS_move_pages), "{role:?}");
        assert!(!role.syscalls().contains(&libc::SYS_fallocate), "{role:?}");
    }
}

/// A classic-BPF interpreter for the instructions seccompiler and
/// [`tree`] emit, over a `struct seccomp_data` (little endian).
fn run_bpf(program: &[seccompiler::sock_filter], data: &[u8; 64]) -> u32 {
    let mut a: u32 = 0;
    let mut pc = 0;
    loop {
        let insn = &program[pc];
        pc += 1;
        let (jt, jf) = (usize::from(insn.jt), usize::from(insn.jf));
        let k = insn.k;
        match insn.code {
            // ld [k]
            0x20 => {
                let at = k as usize;
                a = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
            }
            // and #k
            0x54 => a &= k,
            // ja
            0x05 => pc += k as usize,
            // jeq, jgt, jge, jset #k
            0x15 => pc += if a == k { jt } else { jf },
            0x25 => pc += if a > k { jt } else { jf },
            0x35 => pc += if a >= k { jt } else { jf },
            0x45 => pc += if a & k != 0 { jt } else { jf },
            // ret #k
            0x06 => return k,
            code => panic!("instruction {code:#x} at {} not interpreted", pc - 1),
        }
    }
}

/// `struct seccomp_data` for call `nr` of `arch` with `args`.
fn seccomp_data(nr: u32, arch: u32, args: [u64; 6]) -> [u8; 64] {
    let mut d = [0u8; 64];
    d[0..4].copy_from_slice(&nr.to_le_bytes());
    d[4..8].copy_from_slice(&arch.to_le_bytes());
    for (i, v) in args.iter().enumerate() {
        d[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    d
}

/// The argument values `role`'s rules name, with their neighbours, their
/// upper words set, and a few others.
fn interesting_values(role: Role) -> Vec<u64> {
    let mut named = vec![0, 1, u64::from(u32::MAX), u64::MAX];
    named.push(vmm_sys_util::signal::SIGRTMIN() as u64);
    for allow in role.allowed() {
        match allow.only {
            Only::Any => {}
            Only::OneOf { values, .. } => named.extend(values.iter().map(|&(v, _)| v)),
            Only::KickSignal { .. } => {}
            Only::Masked(checks, _) => {
                for &(_, mask, value) in checks {
                    named.extend([value, mask, value | !mask, value & !1]);
                }
            }
        }
    }
    let mut all = Vec::new();
    for v in named {
        all.extend([
            v,
            v.wrapping_add(1),
            v.wrapping_sub(1),
            v | (1 << 32),
            v ^ (1 << 63),
        ]);
    }
    all.sort_unstable();
    all.dedup();
    all
}

#[test]
fn the_search_tree_allows_exactly_what_the_linear_filter_allows() {
    for role in Role::ALL {
        let linear: seccompiler::BpfProgram = SeccompFilter::new(
            rules_of(role).unwrap(),
            SeccompAction::Trap,
            SeccompAction::Allow,
            std::env::consts::ARCH.try_into().unwrap(),
        )
        .unwrap()
        .try_into()
        .unwrap();
        let tree = build(role).unwrap();
        // The arch check's constant is seccompiler's audit value.
        let arch = linear[1].k;
        let values = interesting_values(role);
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            seed
        };
        let mut compared = 0u64;
        let mut allowed = 0u64;
        for nr in 0..600u32 {
            let mut inputs: Vec<[u64; 6]> = vec![[0; 6]];
            for arg in 0..6 {
                for &v in &values {
                    let mut args = [0; 6];
                    args[arg] = v;
                    inputs.push(args);
                }
            }
            inputs.extend(values.iter().map(|&v| [v; 6]));
            for _ in 0..64 {
                let mut args = [0; 6];
                for a in &mut args {
                    *a = values[(next() % values.len() as u64) as usize];
                }
                inputs.push(args);
            }
            for args in inputs {
                for a in [arch, arch ^ 1] {
                    let data = seccomp_data(nr, a, args);
                    let (want, got) = (run_bpf(&linear, &data), run_bpf(&tree, &data));
                    assert_eq!(
                        want, got,
                        "{role:?}: call {nr}, arch {a:#x}, args {args:x?}: linear {want:#x}, tree {got:#x}"
                    );
                    compared += 1;
                    allowed += u64::from(want == libc::SECCOMP_RET_ALLOW);
                }
            }
        }
        // Both ways were seen: the comparison is not of two programs that
        // trap everything.
        assert!(allowed > 0 && allowed < compared, "{role:?}");
        assert!(
            tree.len() <= linear.len() + linear.len() / 2,
            "{role:?}: {} instructions against {}",
            tree.len(),
            linear.len()
        );
    }
}

#[test]
fn snapshot_state_calls_are_the_vcpus_and_the_start_jobs() {
    // The kernel's numbers (linux/kvm.h).
    let vcpu_saves = [
        (kvm::GET_MP_STATE, 0x8004_ae98),
        (kvm::GET_XSAVE, 0x9000_aea4),
        (kvm::GET_XCRS, 0x8188_aea6),
        (kvm::GET_FPU, 0x81a0_ae8c),
        (kvm::GET_DEBUGREGS, 0x8080_aea1),
        (kvm::GET_TSC_KHZ, 0xaea3),
        (kvm::GET_CPUID2, 0xc008_ae91),
        (kvm::GET_MSRS, 0xc008_ae88),
        (kvm::GET_VCPU_EVENTS, 0x8040_ae9f),
    ];
    let start_restores = [
        (kvm::GET_MSR_INDEX_LIST, 0xc004_ae02),
        (kvm::SET_MP_STATE, 0x4004_ae99),
        (kvm::SET_XSAVE, 0x5000_aea5),
        (kvm::SET_XCRS, 0x4188_aea7),
        (kvm::SET_DEBUGREGS, 0x4080_aea2),
        (kvm::SET_VCPU_EVENTS, 0x4040_aea0),
        (kvm::SET_TSC_KHZ, 0xaea2),
        (kvm::KVMCLOCK_CTRL, 0xaead),
        (kvm::GET_IRQCHIP, 0xc208_ae62),
        (kvm::SET_IRQCHIP, 0x8208_ae63),
        (kvm::GET_PIT2, 0x8070_ae9f),
        (kvm::SET_PIT2, 0x4070_aea0),
        (kvm::GET_CLOCK, 0x8030_ae7c),
        (kvm::SET_CLOCK, 0x4030_ae7b),
    ];
    for (ours, kernels) in vcpu_saves.iter().chain(&start_restores) {
        assert_eq!(ours, kernels, "{ours:#x}");
    }
    let vcpu = allowed_values(Role::Vcpu, libc::SYS_ioctl, 1);
    let start = allowed_values(Role::Start, libc::SYS_ioctl, 1);
    for (nr, _) in vcpu_saves {
        assert!(vcpu.contains(&nr), "{nr:#x}");
    }
    for (nr, _) in start_restores {
        assert!(start.contains(&nr), "{nr:#x}");
        assert!(!vcpu.contains(&nr), "{nr:#x}");
    }
}
