//! A role's BPF program with the system call number found by binary search
//! instead of seccompiler's linear chain, the same calls allowed for the
//! same arguments.
//!
//! Why: seccompiler compares the call number with every listed call in turn
//! (`jeq nr` then a jump, two instructions per call), so a call that is not
//! listed runs through the whole list. The kernel pays this at install:
//! `seccomp_cache_prepare` emulates the new filter for every system call
//! number (about 460) to find those it always allows, which for a linear
//! chain of N calls is some 460 × 2N instructions: the `start` role's 502
//! instructions took 0.42 ms to install, its own thread's first 0.46 ms
//! before it could create the VM (docs in /work/notes/perf.md). A search
//! tree reaches any number in about log2(N) comparisons, and every call
//! that is not in a cache costs that much less at run time too.
//!
//! How: the program is seccompiler's own arch check and number load, then
//! the tree, then seccompiler's own block for each call that has argument
//! rules (compiled alone, byte for byte what it emits in the linear
//! program), then the default action. A tree leaf for a call allowed with
//! any arguments returns the match action itself; a leaf for a call with
//! rules jumps to that call's block, whose first comparison then matches.
//! `tests.rs` runs both programs of every role on every call number and
//! the argument values the rules name, and requires the same action.

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BackendError, BpfProgram, SeccompAction, SeccompFilter, SeccompRule, TargetArch,
};

/// `BPF_LD | BPF_W | BPF_ABS`.
const LD_W_ABS: u16 = 0x20;
/// `BPF_JMP | BPF_JA`.
const JA: u16 = 0x05;
/// `BPF_JMP | BPF_JEQ | BPF_K`.
const JEQ_K: u16 = 0x15;
/// `BPF_JMP | BPF_JGE | BPF_K`.
const JGE_K: u16 = 0x35;
/// `BPF_RET | BPF_K`.
const RET_K: u16 = 0x06;
/// The longest conditional jump (`jt`, `jf` are 8 bits).
const MAX_JUMP: usize = u8::MAX as usize;

/// Where a pending `ja` goes, resolved once the layout is known.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// The block of the call at this index of the blocks.
    Block(usize),
}

/// One leaf's call: allowed whatever its arguments, or its block's index.
#[derive(Debug, Clone, Copy)]
enum Leaf {
    Any,
    Block(usize),
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The filter of `rules` (as [`SeccompFilter::new`] takes them), its call
/// number found by binary search.
pub(super) fn build(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    mismatch: SeccompAction,
    matched: SeccompAction,
    arch: TargetArch,
) -> Result<BpfProgram, BackendError> {
    let compile = |rules: BTreeMap<i64, Vec<SeccompRule>>| -> Result<BpfProgram, BackendError> {
        SeccompFilter::new(rules, mismatch.clone(), matched.clone(), arch)?.try_into()
    };
    // seccompiler's arch check: its program without rules, less the final
    // return of the default action.
    let mut prefix = compile(BTreeMap::new())?;
    prefix.pop();
    let ret_mismatch = stmt(RET_K, u32::from(mismatch.clone()));
    let ret_match = stmt(RET_K, u32::from(matched.clone()));
    let mut leaves: Vec<(u32, Leaf)> = Vec::with_capacity(rules.len());
    let mut blocks: Vec<BpfProgram> = Vec::new();
    for (nr, chain) in rules {
        // libc's call numbers are small and positive.
        let nr_k = nr as u32;
        if chain.is_empty() {
            leaves.push((nr_k, Leaf::Any));
            continue;
        }
        // The call's block as seccompiler lays it out: its program of
        // this call alone is prefix, number load, block, default return.
        let alone = compile(BTreeMap::from([(nr, chain)]))?;
        let block = &alone[prefix.len() + 1..alone.len() - 1];
        leaves.push((nr_k, Leaf::Block(blocks.len())));
        blocks.push(block.to_vec());
    }
    let mut tree: Vec<(sock_filter, Option<Target>)> = Vec::new();
    emit(&leaves, &ret_match, &ret_mismatch, &mut tree);
    let mut program = prefix;
    program.push(stmt(LD_W_ABS, 0));
    let tree_start = program.len();
    let mut block_start = Vec::with_capacity(blocks.len());
    let mut at = tree_start + tree.len();
    for b in &blocks {
        block_start.push(at);
        at += b.len();
    }
    for (i, (mut insn, target)) in tree.into_iter().enumerate() {
        if let Some(Target::Block(b)) = target {
            let from = tree_start + i + 1;
            insn.k = u32::try_from(block_start[b] - from)
                .map_err(|_| BackendError::FilterTooLarge(block_start[b]))?;
        }
        program.push(insn);
    }
    for b in blocks {
        program.extend(b);
    }
    program.push(ret_mismatch);
    // The kernel's limit (BPF_MAXINSNS).
    if program.len() > 4096 {
        return Err(BackendError::FilterTooLarge(program.len()));
    }
    Ok(program)
}

/// Appends the search over `leaves` (sorted by call number) to `out`; the
/// loaded number is in the accumulator. Every path ends in a return or a
/// jump to a block.
fn emit(
    leaves: &[(u32, Leaf)],
    ret_match: &sock_filter,
    ret_mismatch: &sock_filter,
    out: &mut Vec<(sock_filter, Option<Target>)>,
) {
    match leaves {
        [] => out.push((ret_mismatch.clone(), None)),
        [(nr, leaf)] => {
            // nr == K: the next instruction; else skip it to the default.
            out.push((jump(JEQ_K, *nr, 0, 1), None));
            match leaf {
                Leaf::Any => out.push((ret_match.clone(), None)),
                Leaf::Block(b) => out.push((stmt(JA, 0), Some(Target::Block(*b)))),
            }
            out.push((ret_mismatch.clone(), None));
        }
        _ => {
            let (low, high) = leaves.split_at(leaves.len() / 2);
            let mut left = Vec::new();
            emit(low, ret_match, ret_mismatch, &mut left);
            let pivot = high[0].0;
            if left.len() <= MAX_JUMP {
                // nr >= pivot: over the low half; else into it.
                out.push((jump(JGE_K, pivot, left.len() as u8, 0), None));
            } else {
                // Too far for a conditional jump: through a `ja`.
                out.push((jump(JGE_K, pivot, 0, 1), None));
                out.push((stmt(JA, left.len() as u32), None));
            }
            out.extend(left);
            emit(high, ret_match, ret_mismatch, out);
        }
    }
}
