//! The compact compiler: a profile as a binary search over system call numbers.
//!
//! Why not seccompiler's own program: it tests the system call number against
//! every listed call in turn, four instructions per call, so the default profile
//! compiles to about 1,500 instructions. The kernel pays for that length at
//! every install, that is at every run: it converts and JIT-compiles the
//! program, then emulates it once per system call number to fill its
//! per-number action cache. Measured on the benchmark host, installing that
//! program took 0.6-0.9 ms, a tenth of a warm run.
//!
//! This compiler splits the number space into intervals of equal outcome
//! (allowed, the default action, another action, or argument checks for one
//! call), then emits a binary search over the interval starts: 169
//! instructions for the default profile on x86_64, a dozen executed per call. seccompiler stays the reference:
//! a test runs both programs on every number and on argument values around
//! every condition, and requires the same answer.
//!
//! Semantics, the same as seccompiler's: the architecture is checked first (a
//! call of another one kills the process); `dword` conditions compare the low
//! 32 bits of the argument with the low 32 bits of `val`; `qword` compares all
//! 64 bits, unsigned; `masked_eq` compares `arg & mask` with `val & mask`; the
//! conditions of one group must all hold, and the groups of one call are
//! alternatives; a call whose alternatives all fail gets the default action.

use std::collections::BTreeMap;

use seccompiler::{SeccompAction, sock_filter};

use crate::{Action, Condition, Error, Op, Profile, Width};

const LD_W_ABS: u16 = 0x20;
const ALU_AND_K: u16 = 0x54;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JGT_K: u16 = 0x25;
const JMP_JGE_K: u16 = 0x35;
const RET_K: u16 = 0x06;

/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;
const DATA_ARGS: u32 = 16;

/// What a system call number leads to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    /// This action, whatever the arguments.
    Return(u32),
    /// The first alternative whose conditions all hold gets `action`; none: the
    /// default action.
    Check {
        alternatives: Vec<Vec<Condition>>,
        action: u32,
    },
}

/// The kernel's return value for `action`.
pub(crate) fn ret_value(action: Action) -> u32 {
    u32::from(match action {
        Action::Allow => SeccompAction::Allow,
        Action::Log => SeccompAction::Log,
        Action::Trap => SeccompAction::Trap,
        Action::KillThread => SeccompAction::KillThread,
        Action::KillProcess => SeccompAction::KillProcess,
        Action::Errno(e) => SeccompAction::Errno(e),
    })
}

/// `AUDIT_ARCH_*` of `arch`.
fn audit_arch(arch: &str) -> Result<u32, Error> {
    match arch {
        "x86_64" => Ok(0xC000_003E),
        "aarch64" => Ok(0xC000_00B7),
        "riscv64" => Ok(0xC000_00F3),
        other => Err(Error::UnsupportedArch(other.to_owned())),
    }
}

/// The number of system call `name` on `arch`, from seccompiler's table, so
/// that profiles name calls exactly as before (seccompiler does not export the
/// table). A one-call filter compiles to the architecture check (3
/// instructions), the load of the number, then a comparison with it.
/// `reference_agrees_on_every_number` (tests) checks the result against
/// seccompiler's own program on every number.
pub(crate) fn syscall_number(arch: &str, name: &str) -> Result<u32, Error> {
    let target = seccompiler::TargetArch::try_from(arch)
        .map_err(|_| Error::UnsupportedArch(arch.to_owned()))?;
    let json = serde_json::json!({ "f": {
        "mismatch_action": "allow",
        "match_action": { "errno": 1 },
        "filter": [{ "syscall": name }],
    }});
    let mut compiled = seccompiler::compile_from_json(json.to_string().as_bytes(), target)
        .map_err(|source| Error::Compile {
            arch: arch.to_owned(),
            source,
        })?;
    let program = compiled.remove("f").unwrap_or_default();
    match program.get(3..5) {
        Some([load, compare])
            if load.code == LD_W_ABS && load.k == DATA_NR && compare.code == JMP_JEQ_K =>
        {
            Ok(compare.k)
        }
        _ => Err(Error::UnknownSyscall {
            arch: arch.to_owned(),
            name: name.to_owned(),
        }),
    }
}

/// Compiles `profile` for `arch`.
pub(crate) fn compile(profile: &Profile, arch: &str) -> Result<Vec<sock_filter>, Error> {
    let default = ret_value(profile.default_action);
    let mut outcomes: BTreeMap<u32, Outcome> = BTreeMap::new();
    for group in profile.syscalls.iter().filter(|g| g.applies_to(arch)) {
        let action = ret_value(group.action);
        for name in &group.names {
            let nr = syscall_number(arch, name)?;
            if action == default {
                continue; // The same as not listing it.
            }
            let entry = outcomes.entry(nr).or_insert_with(|| Outcome::Check {
                alternatives: Vec::new(),
                action,
            });
            match entry {
                // Already unconditional: more alternatives change nothing.
                Outcome::Return(_) => {}
                Outcome::Check { .. } if group.args.is_empty() => {
                    *entry = Outcome::Return(action);
                }
                Outcome::Check { alternatives, .. } => alternatives.push(group.args.clone()),
            }
        }
    }

    // Intervals [start, next start) of one outcome, covering every number.
    let mut intervals: Vec<(u32, Outcome)> = Vec::new();
    let mut push = |start: u32, outcome: Outcome| match intervals.last() {
        Some((_, last)) if *last == outcome && matches!(outcome, Outcome::Return(_)) => {}
        _ => intervals.push((start, outcome)),
    };
    let mut next = 0u32;
    for (nr, outcome) in outcomes {
        if nr > next {
            push(next, Outcome::Return(default));
        }
        push(nr, outcome);
        next = nr + 1;
    }
    push(next, Outcome::Return(default));

    let mut program = vec![
        stmt(LD_W_ABS, DATA_ARCH),
        jump(JMP_JEQ_K, audit_arch(arch)?, 1, 0),
        stmt(RET_K, ret_value(Action::KillProcess)),
        stmt(LD_W_ABS, DATA_NR),
    ];
    program.extend(search(&intervals, default)?);
    Ok(program)
}

/// A binary search over `intervals` (the number is in the accumulator): at each
/// node, numbers at or above the middle interval's start go right.
fn search(intervals: &[(u32, Outcome)], default: u32) -> Result<Vec<sock_filter>, Error> {
    if let [(_, outcome)] = intervals {
        return leaf(outcome, default);
    }
    let middle = intervals.len() / 2;
    let left = search(&intervals[..middle], default)?;
    let right = search(&intervals[middle..], default)?;
    let start = intervals[middle].0;
    let mut out = Vec::with_capacity(left.len() + right.len() + 2);
    match u8::try_from(left.len()) {
        Ok(skip) => out.push(jump(JMP_JGE_K, start, skip, 0)),
        Err(_) => {
            // Conditional jumps reach 255 instructions; an unconditional one, any.
            out.push(jump(JMP_JGE_K, start, 0, 1));
            let skip = u32::try_from(left.len()).map_err(|_| Error::TooLarge(left.len()))?;
            out.push(stmt(JMP_JA, skip));
        }
    }
    out.extend(left);
    out.extend(right);
    Ok(out)
}

/// A jump target inside one alternative, resolved once its length is known.
#[derive(Clone, Copy)]
enum Target {
    /// This many instructions ahead of the next one.
    Skip(u8),
    /// The alternative's conditions failed: the start of the next alternative.
    Fail,
}

/// An instruction of an alternative, before its jumps are resolved.
struct Ins {
    code: u16,
    k: u32,
    jt: Target,
    jf: Target,
}

fn leaf(outcome: &Outcome, default: u32) -> Result<Vec<sock_filter>, Error> {
    let (alternatives, action) = match outcome {
        Outcome::Return(value) => return Ok(vec![stmt(RET_K, *value)]),
        Outcome::Check {
            alternatives,
            action,
        } => (alternatives, *action),
    };
    let mut out = Vec::new();
    for conditions in alternatives {
        let mut alt: Vec<Ins> = Vec::new();
        for c in conditions {
            condition(c, &mut alt);
        }
        alt.push(Ins {
            code: RET_K,
            k: action,
            jt: Target::Skip(0),
            jf: Target::Skip(0),
        });
        let len = alt.len();
        let resolve = |t: Target, at: usize| -> Result<u8, Error> {
            match t {
                Target::Skip(n) => Ok(n),
                // After the return: the next alternative, or the default action.
                Target::Fail => u8::try_from(len - at - 1).map_err(|_| Error::TooLarge(len)),
            }
        };
        for (at, ins) in alt.iter().enumerate() {
            out.push(sock_filter {
                code: ins.code,
                jt: resolve(ins.jt, at)?,
                jf: resolve(ins.jf, at)?,
                k: ins.k,
            });
        }
    }
    out.push(stmt(RET_K, default));
    Ok(out)
}

/// The high and low 32 bits of `v`: a 64-bit argument is compared as two
/// words, as BPF loads them.
fn halves(v: u64) -> (u32, u32) {
    let high = u32::try_from(v >> 32).expect("32 bits");
    let low = u32::try_from(v & u64::from(u32::MAX)).expect("32 bits");
    (high, low)
}

/// Appends the test of `c` to `alt`: falls through when it holds, jumps to
/// [`Target::Fail`] when it does not.
fn condition(c: &Condition, alt: &mut Vec<Ins>) {
    use Target::{Fail, Skip};
    let low = DATA_ARGS + 8 * u32::from(c.index);
    // All supported architectures are little-endian: the high half follows.
    let high = low + 4;
    let (vh, vl) = halves(c.val);
    let load = |at: u32| (LD_W_ABS, at, Skip(0), Skip(0));
    let mut put = |(code, k, jt, jf): (u16, u32, Target, Target)| alt.push(Ins { code, k, jt, jf });
    match (c.width, c.op) {
        (Width::Dword, op) => {
            put(load(low));
            match op {
                Op::Eq => put((JMP_JEQ_K, vl, Skip(0), Fail)),
                Op::Ne => put((JMP_JEQ_K, vl, Fail, Skip(0))),
                Op::Gt => put((JMP_JGT_K, vl, Skip(0), Fail)),
                Op::Ge => put((JMP_JGE_K, vl, Skip(0), Fail)),
                Op::Lt => put((JMP_JGE_K, vl, Fail, Skip(0))),
                Op::Le => put((JMP_JGT_K, vl, Fail, Skip(0))),
                Op::MaskedEq(mask) => {
                    let (_, ml) = halves(mask);
                    put((ALU_AND_K, ml, Skip(0), Skip(0)));
                    put((JMP_JEQ_K, vl & ml, Skip(0), Fail));
                }
            }
        }
        (Width::Qword, Op::Eq) => {
            put(load(high));
            put((JMP_JEQ_K, vh, Skip(0), Fail));
            put(load(low));
            put((JMP_JEQ_K, vl, Skip(0), Fail));
        }
        (Width::Qword, Op::Ne) => {
            put(load(high));
            // High halves differ: it holds (skip the low test).
            put((JMP_JEQ_K, vh, Skip(0), Skip(2)));
            put(load(low));
            put((JMP_JEQ_K, vl, Fail, Skip(0)));
        }
        (Width::Qword, Op::MaskedEq(mask)) => {
            let (mh, ml) = halves(mask);
            put(load(high));
            put((ALU_AND_K, mh, Skip(0), Skip(0)));
            put((JMP_JEQ_K, vh & mh, Skip(0), Fail));
            put(load(low));
            put((ALU_AND_K, ml, Skip(0), Skip(0)));
            put((JMP_JEQ_K, vl & ml, Skip(0), Fail));
        }
        (Width::Qword, op) => {
            // Ordered comparisons: the high halves decide unless they are equal.
            let greater_holds = matches!(op, Op::Gt | Op::Ge);
            put(load(high));
            if greater_holds {
                // high > vh: holds (skip the equality test and the low test).
                put((JMP_JGT_K, vh, Skip(3), Skip(0)));
                put((JMP_JEQ_K, vh, Skip(0), Fail));
            } else {
                put((JMP_JGT_K, vh, Fail, Skip(0)));
                // high < vh: holds.
                put((JMP_JEQ_K, vh, Skip(0), Skip(2)));
            }
            put(load(low));
            match op {
                Op::Gt => put((JMP_JGT_K, vl, Skip(0), Fail)),
                Op::Ge => put((JMP_JGE_K, vl, Skip(0), Fail)),
                Op::Lt => put((JMP_JGE_K, vl, Fail, Skip(0))),
                _ => put((JMP_JGT_K, vl, Fail, Skip(0))), // Le
            }
        }
    }
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
