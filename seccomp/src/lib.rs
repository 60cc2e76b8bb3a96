//! fnrun's seccomp profile: data, compiled to a compact BPF program (a binary
//! search over system call numbers, see `compact.rs`), with `seccompiler`'s
//! program as the reference it is tested against.
//!
//! The default profile, `profiles/default.json`, is an allow-list in the spirit of
//! the Docker/containerd default profile: every system call an ordinary
//! unprivileged program needs is allowed, with a comment saying why, and every
//! other call fails with `EPERM`. `clone` is allowed only without namespace flags
//! and `clone3` fails with `ENOSYS` (its flags cannot be inspected, and `ENOSYS`
//! makes libc fall back to `clone`). The calls of [`ALWAYS_DENIED`] are never in
//! the default allow-list; a test keeps it so.
//!
//! Operators can compile another profile file with [`program_from_file`]. It has
//! the same format as the default profile (JSON):
//!
//! ```json
//! {
//!   "comment": "optional, free text",
//!   "default_action": { "errno": "EPERM" },
//!   "syscalls": [
//!     { "comment": "why", "action": "allow", "names": ["read", "write", "execve", "exit_group"] },
//!     { "action": "allow", "names": ["open"], "arches": ["x86_64"] },
//!     { "action": "allow", "names": ["socket"],
//!       "args": [{ "index": 0, "type": "dword", "op": "ne", "val": 40 }] },
//!     { "action": { "errno": "ENOSYS" }, "names": ["clone3"] }
//!   ],
//!   "denied": [{ "comment": "why", "names": ["mount", "ptrace"] }]
//! }
//! ```
//!
//! - `default_action` applies to every call no group matches.
//! - Actions: `"allow"`, `"log"` (allow and log), `"trap"`, `"kill_thread"`,
//!   `"kill_process"`, or `{"errno": E}` with `E` a number or one of `EPERM`,
//!   `ENOENT`, `EACCES`, `EINVAL`, `ENOSYS`, `EOPNOTSUPP`.
//! - `names` are system call names as in the kernel's table for the
//!   architecture; an unknown name is an error (a typo must not silently allow
//!   or deny). `arches` (`x86_64`, `aarch64`, `riscv64`) limits a group to those
//!   architectures; without it the group applies to all.
//! - `args` are conditions that must all hold (`index` 0-5, `type` `dword` or
//!   `qword`, `op` one of `eq`, `ne`, `lt`, `le`, `gt`, `ge` or
//!   `{"masked_eq": MASK}`, `val`); a call whose conditions fail gets the default
//!   action. Several groups for one name are alternatives.
//! - A name may have one action only, across all groups.
//! - `denied` is documentation that is enforced: a name listed there may not
//!   appear in an `allow` or `log` group.
//! - The calls of [`NEEDED`] must be allowed without conditions: the sandbox
//!   makes them itself under the filter, before the function's exec.
//!
//! The program checks the architecture first and kills a process that makes a
//! system call of another one (e.g. 32-bit `int 0x80` on x86_64).

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Value, json};

pub use seccompiler::{BpfProgram, sock_filter};

pub use crate::profile::{
    Action, Condition, DEFAULT_PROFILE, Denied, Error, Group, NEEDED, Op, Profile, Width,
};

#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64"
)))]
compile_error!(
    "fnrun-seccomp supports x86_64, aarch64 and riscv64 (the architectures of seccompiler)"
);

/// System calls the default profile must never allow: mounts, namespaces, BPF,
/// keyrings, tracing, kernel modules, kexec, reboot, clocks, swap, accounting,
/// quotas, raw I/O ports, file handles, userfaultfd and the new mount API.
pub const ALWAYS_DENIED: &[&str] = &[
    "mount",
    "umount2",
    "unshare",
    "setns",
    "pivot_root",
    "bpf",
    "keyctl",
    "add_key",
    "request_key",
    "ptrace",
    "perf_event_open",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "userfaultfd",
    "open_by_handle_at",
    "name_to_handle_at",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "lookup_dcookie",
    "iopl",
    "ioperm",
    "create_module",
    "uselib",
    "vm86",
    "nfsservctl",
    "fsopen",
    "fsmount",
    "move_mount",
    "open_tree",
    "fspick",
    "mount_setattr",
];

/// The kernel's limit on the length of a seccomp program (`BPF_MAXINSNS`).
const MAX_INSTRUCTIONS: usize = 4096;

impl Profile {
    /// Compiles the profile for the architecture this program runs on.
    pub fn compile(&self) -> Result<BpfProgram, Error> {
        self.compile_for(std::env::consts::ARCH)
    }

    /// Compiles the profile for `arch` (`x86_64`, `aarch64` or `riscv64`) into
    /// the compact program installed in functions (see `compact.rs`).
    pub fn compile_for(&self, arch: &str) -> Result<BpfProgram, Error> {
        let program = compact::compile(self, arch)?;
        if program.len() > MAX_INSTRUCTIONS {
            return Err(Error::TooLarge(program.len()));
        }
        Ok(program)
    }

    /// Compiles the profile for `arch` with seccompiler: a longer program (every
    /// call tested in turn), kept as the reference the compact one is tested
    /// against.
    ///
    /// seccompiler builds a program with one match action. So the profile
    /// becomes a chain of programs, one per action other than allow (each
    /// returning its action on a match), then the allow-list (returning the
    /// default action when nothing matches). In every program but the last,
    /// "allow" means "not mine": those returns become jumps to the next program.
    pub fn compile_reference_for(&self, arch: &str) -> Result<BpfProgram, Error> {
        let target = seccompiler::TargetArch::try_from(arch)
            .map_err(|_| Error::UnsupportedArch(arch.to_owned()))?;
        // seccompiler's rules per action, in order of first appearance.
        let mut programs: Vec<Rules> = Vec::new();
        for group in self.syscalls.iter().filter(|g| g.applies_to(arch)) {
            if group.action == self.default_action {
                continue; // The same as not listing the calls.
            }
            let rules = match programs.iter().position(|p| p.action == group.action) {
                Some(i) => &mut programs[i],
                None => {
                    programs.push(Rules::new(group.action));
                    programs.last_mut().expect("just pushed")
                }
            };
            for name in &group.names {
                rules.add(name, &group.args);
            }
        }
        // The allow-list goes last: it alone returns the default action.
        programs.sort_by_key(|p| p.action == Action::Allow);
        if self.default_action != Action::Allow
            && programs.last().is_none_or(|p| p.action != Action::Allow)
        {
            programs.push(Rules::new(Action::Allow));
        }
        if programs.is_empty() {
            // Allow everything, but still check the architecture: an empty
            // filter whose (never taken) match action is EPERM.
            programs.push(Rules::new(Action::Errno(1)));
        }
        let mut filters = serde_json::Map::new();
        for (i, rules) in programs.iter().enumerate() {
            // In all but the allow-list, "allow" means "not mine": `chain`
            // rewrites it into a jump to the next program.
            let otherwise = if rules.action == Action::Allow {
                self.default_action
            } else {
                Action::Allow
            };
            filters.insert(
                i.to_string(),
                json!({
                    "match_action": rules.action.to_seccompiler(),
                    "mismatch_action": otherwise.to_seccompiler(),
                    "filter": rules.rules,
                }),
            );
        }
        let json = serde_json::to_vec(&Value::Object(filters))?;
        let mut compiled =
            seccompiler::compile_from_json(json.as_slice(), target).map_err(|source| {
                Error::Compile {
                    arch: arch.to_owned(),
                    source,
                }
            })?;
        let parts: Vec<BpfProgram> = (0..programs.len())
            .map(|i| {
                compiled
                    .remove(&i.to_string())
                    .expect("one program per filter")
            })
            .collect();
        let program = chain(parts);
        if program.len() > MAX_INSTRUCTIONS {
            return Err(Error::TooLarge(program.len()));
        }
        Ok(program)
    }
}

/// The rules of one action, in seccompiler's JSON.
struct Rules {
    action: Action,
    rules: Vec<Value>,
    /// Calls matched whatever their arguments.
    unconditional: BTreeSet<String>,
}

impl Rules {
    fn new(action: Action) -> Self {
        Rules {
            action,
            rules: Vec::new(),
            unconditional: BTreeSet::new(),
        }
    }

    fn add(&mut self, name: &str, args: &[Condition]) {
        if self.unconditional.contains(name) {
            return;
        }
        if args.is_empty() {
            // seccompiler ignores an unconditional rule for a call that also
            // has conditional ones (it keeps only the conditions): keep it alone.
            self.rules.retain(|r| r["syscall"] != name);
            self.rules.push(json!({ "syscall": name }));
            self.unconditional.insert(name.to_owned());
        } else {
            self.rules.push(json!({ "syscall": name, "args": args }));
        }
    }
}

/// Concatenates programs: in all but the last, `return ALLOW` becomes a jump to
/// the start of the next program.
fn chain(parts: Vec<BpfProgram>) -> BpfProgram {
    const BPF_RET_K: u16 = 0x06;
    const BPF_JMP_JA: u16 = 0x05;
    const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
    let last = parts.len().saturating_sub(1);
    let mut out = Vec::with_capacity(parts.iter().map(Vec::len).sum());
    for (i, mut part) in parts.into_iter().enumerate() {
        if i < last {
            let len = part.len();
            for (pc, ins) in part.iter_mut().enumerate() {
                if ins.code == BPF_RET_K && ins.k == SECCOMP_RET_ALLOW {
                    *ins = sock_filter {
                        code: BPF_JMP_JA,
                        jt: 0,
                        jf: 0,
                        // The next instruction after the jump is pc + 1 + k.
                        k: u32::try_from(len - pc - 1)
                            .expect("a seccompiler program has far fewer than 2^32 instructions"),
                    };
                }
            }
        }
        out.extend(part);
    }
    out
}

/// The default profile compiled for this architecture.
pub fn default_program() -> Result<BpfProgram, Error> {
    Profile::default_profile()?.compile()
}

/// A profile file (same format as the default profile) compiled for this
/// architecture.
pub fn program_from_file(path: &Path) -> Result<BpfProgram, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    Profile::parse(&text)
        .and_then(|p| p.compile())
        .map_err(|e| Error::InFile {
            path: path.to_owned(),
            source: Box::new(e),
        })
}

mod compact;
mod profile;

#[cfg(test)]
mod tests;
