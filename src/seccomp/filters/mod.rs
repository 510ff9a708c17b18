//! The system calls each thread role may make, as data: one list per role,
//! each entry a call, an optional condition on its arguments, and the reason
//! the role's code makes it. docs/seccomp.md is generated from these lists
//! ([`super::describe`]) and a test keeps the two in step.
//!
//! Designed from the code each role runs, not traced from a test run. A
//! role's filter is [`BASE`] plus its own list; a role that starts threads
//! after installing its filter also allows [`SPAWN`] and its children's
//! lists (filters stack: a child runs under its spawner's filter too, so it
//! can only narrow it). Only three roles spawn after their filter (`api`,
//! `start`, `reclaim`); the main thread spawns nothing once filtered: every
//! long-lived thread (`api`, `files`, `output`, the `start` and `reclaim`
//! job runners) is started before it installs its own.
//!
//! The lists are kept by concern: the data types here, [`BASE`] and
//! [`SPAWN`] and the conditions the lists are written with in `shared`, the own
//! lists of teravm's threads in `roles` and of the device threads in
//! `devices`, the KVM ioctl numbers in [`kvm`]. Which role gets which list
//! is [`Role::own`], below.

use super::Role;

/// What an allowed call may be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Only {
    /// Any arguments.
    Any,
    /// Argument `arg` is one of `values` (compared as 64-bit), each with the
    /// name the docs show.
    OneOf {
        /// Argument index, from 0.
        arg: u8,
        /// The values allowed, with their names.
        values: &'static [(u64, &'static str)],
    },
    /// Argument `arg` is the vCPU kick signal (`SIGRTMIN`, known at run time).
    KickSignal {
        /// Argument index, from 0.
        arg: u8,
    },
    /// `arg & mask == value` for each of the (arg, mask, value) triples; the
    /// text says it in words.
    Masked(&'static [(u8, u64, u64)], &'static str),
}

/// One allowed system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Allow {
    /// The call's number (`libc::SYS_*`).
    pub nr: i64,
    /// What its arguments may be.
    pub only: Only,
    /// Why the role makes it.
    pub why: &'static str,
}

const fn any(nr: i64, why: &'static str) -> Allow {
    Allow {
        nr,
        only: Only::Any,
        why,
    }
}

const fn one_of(
    nr: i64,
    arg: u8,
    values: &'static [(u64, &'static str)],
    why: &'static str,
) -> Allow {
    Allow {
        nr,
        only: Only::OneOf { arg, values },
        why,
    }
}

/// A `(value, "NAME")` pair for [`Only::OneOf`].
macro_rules! named {
    ($($path:ident)::+) => {
        ($($path)::+ as u64, stringify!($($path)::+))
    };
}

// Declared after `named!`, which the lists use: a `macro_rules!` is seen
// by the modules declared after it.
mod devices;
pub(crate) mod kvm;
mod roles;
mod shared;

pub(crate) use shared::{BASE, SPAWN};
/// For `memory::pagemap`'s test that its number and the filters' agree.
#[cfg(test)]
pub(crate) use shared::{
    PAGEMAP_SCAN, UFFDIO_API, UFFDIO_REGISTER, UFFDIO_UNREGISTER, USERFAULTFD_IOC_NEW,
};

use devices::{BALLOON, BLOCK, DISCARD, ENTROPY, MEM, NET, VSOCK};
use roles::{API, API_CONNECTION, CONSOLE, FILES, OUTPUT, PROGRESS, RECLAIM, START, VCPU, VMM};

impl Role {
    /// The role's own calls, beyond [`BASE`].
    pub(crate) fn own(self) -> &'static [Allow] {
        match self {
            Role::Vmm => VMM,
            Role::Api => API,
            Role::ApiConnection => API_CONNECTION,
            Role::Vcpu => VCPU,
            Role::Console => CONSOLE,
            Role::Start => START,
            Role::Reclaim => RECLAIM,
            Role::Progress => PROGRESS,
            Role::Output => OUTPUT,
            Role::Files => FILES,
            Role::Balloon => BALLOON,
            Role::Discard => DISCARD,
            Role::Block => BLOCK,
            Role::Net => NET,
            Role::Vsock => VSOCK,
            Role::Entropy => ENTROPY,
            Role::Mem => MEM,
        }
    }

    /// The roles of the threads this role spawns after installing its
    /// filter: they run under it, so it must allow what they call. A role
    /// with children also allows [`SPAWN`].
    pub(crate) fn children(self) -> &'static [Role] {
        match self {
            Role::Api => &[Role::ApiConnection],
            Role::Start => &[
                Role::Vcpu,
                Role::Progress,
                Role::Console,
                Role::Balloon,
                Role::Discard,
                Role::Block,
                Role::Net,
                Role::Vsock,
                Role::Entropy,
                Role::Mem,
            ],
            Role::Reclaim => &[Role::Progress],
            _ => &[],
        }
    }

    /// Whether threads of this role start other threads (after their filter).
    pub(crate) fn spawns(self) -> bool {
        !self.children().is_empty()
    }

    /// Every call this role's filter allows: [`BASE`], its own list, and if
    /// it spawns, [`SPAWN`] and its children's lists.
    pub(crate) fn allowed(self) -> Vec<Allow> {
        let mut all: Vec<Allow> = BASE.to_vec();
        all.extend_from_slice(self.own());
        if self.spawns() {
            all.extend_from_slice(SPAWN);
        }
        for child in self.children() {
            all.extend(child.allowed());
        }
        all
    }
}
