//! A profile: its format (docker's `seccomp.json`, as fnrun reads it), parsed and
//! checked. What the compilers (the compact one and seccompiler's, in the crate
//! root) take; a leaf.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The default profile's source.
pub const DEFAULT_PROFILE: &str = include_str!("../profiles/default.json");

/// System calls the sandbox itself makes once the filter is installed: the
/// function reports that it is ready (`write`), waits for the call (`read`),
/// execs (`execve`), or reports a failure and exits (`exit_group`). Every
/// profile must allow them unconditionally.
pub const NEEDED: [&str; 4] = ["read", "write", "execve", "exit_group"];

/// Architectures a profile may name (those `seccompiler` knows).
pub(crate) const ARCHES: [&str; 3] = ["x86_64", "aarch64", "riscv64"];

/// Why a profile could not be loaded or compiled.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The profile file could not be read.
    #[error("read seccomp profile {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Any other error, in the named profile file.
    #[error("seccomp profile {path}: {source}")]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<Error>,
    },
    /// The profile is not valid JSON of the expected shape.
    #[error("parse: {0}")]
    Parse(#[from] serde_json::Error),
    /// A group lists no system call.
    #[error("syscall group {index} has no names")]
    EmptyGroup { index: usize },
    /// A group names an architecture seccompiler does not know.
    #[error(
        "syscall group {index}: unknown architecture {arch:?} (known: x86_64, aarch64, riscv64)"
    )]
    UnknownArch { index: usize, arch: String },
    /// One system call has two different actions.
    #[error("{name} has more than one action")]
    ConflictingActions { name: String },
    /// A system call is both listed as denied and allowed.
    #[error("{name} is listed as denied but allowed by a syscall group")]
    DeniedButAllowed { name: String },
    /// A call the sandbox makes under the filter, before its exec, is not
    /// always allowed.
    #[error(
        "{name} must be allowed without conditions (on {arch}): the sandbox calls it after \
         installing the filter, before the function's exec (every profile must allow {})",
        NEEDED.join(", ")
    )]
    NeededNotAllowed { name: String, arch: String },
    /// seccompiler compiled a call into a program of an unexpected shape.
    #[error("cannot find the number of system call {name:?} on {arch}")]
    UnknownSyscall { arch: String, name: String },
    /// This architecture cannot be compiled for.
    #[error("unsupported architecture {0}")]
    UnsupportedArch(String),
    /// seccompiler rejected the filter (e.g. a name unknown on this architecture).
    #[error("compile for {arch}: {source}")]
    Compile {
        arch: String,
        #[source]
        source: seccompiler::Error,
    },
    /// The program exceeds the kernel's length limit.
    #[error("the compiled program has {0} instructions, the kernel accepts at most 4096")]
    TooLarge(usize),
}

/// What happens to a matching system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Run it.
    Allow,
    /// Run it and log it to the audit log.
    Log,
    /// Send SIGSYS.
    Trap,
    /// Kill the calling thread.
    KillThread,
    /// Kill the whole process.
    KillProcess,
    /// Fail it with this errno.
    Errno(#[serde(deserialize_with = "errno_value")] u32),
}

impl Action {
    /// The action in seccompiler's JSON.
    pub(crate) fn to_seccompiler(self) -> Value {
        match self {
            Action::Allow => json!("allow"),
            Action::Log => json!("log"),
            Action::Trap => json!("trap"),
            Action::KillThread => json!("kill_thread"),
            Action::KillProcess => json!("kill_process"),
            Action::Errno(e) => json!({ "errno": e }),
        }
    }

    pub(crate) fn allows(self) -> bool {
        matches!(self, Action::Allow | Action::Log)
    }
}

fn errno_value<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(u32),
        Name(String),
    }
    match Raw::deserialize(d)? {
        Raw::Number(n) => Ok(n),
        Raw::Name(name) => errno_by_name(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown errno {name:?} (use a number, or EPERM, ENOENT, EACCES, EINVAL, ENOSYS, EOPNOTSUPP)"
            ))
        }),
    }
}

/// The errno values a profile may name (the same on every supported architecture).
fn errno_by_name(name: &str) -> Option<u32> {
    Some(match name {
        "EPERM" => 1,
        "ENOENT" => 2,
        "EACCES" => 13,
        "EINVAL" => 22,
        "ENOSYS" => 38,
        "EOPNOTSUPP" | "ENOTSUP" => 95,
        _ => return None,
    })
}

/// A condition on one argument; the same shape as seccompiler's JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// Argument number, 0-5.
    pub index: u8,
    /// How much of the argument is compared.
    #[serde(rename = "type")]
    pub width: Width,
    /// The comparison.
    pub op: Op,
    /// The value compared with.
    pub val: u64,
    /// Why.
    #[serde(default, skip_serializing)]
    pub comment: Option<String>,
}

/// How much of an argument a [`Condition`] compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Width {
    /// The low 32 bits.
    Dword,
    /// All 64 bits.
    Qword,
}

/// The comparison of a [`Condition`]: `argument OP val`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// `argument & MASK == val`.
    MaskedEq(u64),
}

/// System calls that share an action (and argument conditions).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Group {
    /// Why these calls get this action.
    #[serde(default)]
    pub comment: Option<String>,
    /// What happens to them.
    pub action: Action,
    /// System call names.
    pub names: Vec<String>,
    /// Only on these architectures (all when absent).
    #[serde(default)]
    pub arches: Option<Vec<String>>,
    /// Conditions that must all hold; none means the call always matches.
    #[serde(default)]
    pub args: Vec<Condition>,
}

impl Group {
    pub(crate) fn applies_to(&self, arch: &str) -> bool {
        self.arches
            .as_ref()
            .is_none_or(|arches| arches.iter().any(|a| a == arch))
    }
}

/// Calls that must not be allowed, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Denied {
    /// Why.
    #[serde(default)]
    pub comment: Option<String>,
    /// System call names.
    pub names: Vec<String>,
}

/// A parsed, validated profile.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Free text.
    #[serde(default)]
    pub comment: Option<String>,
    /// The action for every call that no group matches.
    pub default_action: Action,
    /// The rules.
    pub syscalls: Vec<Group>,
    /// Calls the profile promises not to allow.
    #[serde(default)]
    pub denied: Vec<Denied>,
}

impl Profile {
    /// The built-in default profile.
    pub fn default_profile() -> Result<Profile, Error> {
        Profile::parse(DEFAULT_PROFILE)
    }

    /// Parses and validates a profile.
    pub fn parse(json: &str) -> Result<Profile, Error> {
        let profile: Profile = serde_json::from_str(json)?;
        profile.validate()?;
        Ok(profile)
    }

    fn validate(&self) -> Result<(), Error> {
        let mut actions: BTreeMap<(&str, &str), Action> = BTreeMap::new();
        for (index, group) in self.syscalls.iter().enumerate() {
            if group.names.is_empty() {
                return Err(Error::EmptyGroup { index });
            }
            for arch in group.arches.iter().flatten() {
                if !ARCHES.contains(&arch.as_str()) {
                    return Err(Error::UnknownArch {
                        index,
                        arch: arch.clone(),
                    });
                }
            }
            for arch in ARCHES.into_iter().filter(|a| group.applies_to(a)) {
                for name in &group.names {
                    if *actions.entry((arch, name)).or_insert(group.action) != group.action {
                        return Err(Error::ConflictingActions { name: name.clone() });
                    }
                }
            }
        }
        let allowed: BTreeSet<&str> = self
            .syscalls
            .iter()
            .filter(|g| g.action.allows())
            .flat_map(|g| g.names.iter().map(String::as_str))
            .collect();
        if let Some(name) = self.denied_names().intersection(&allowed).next() {
            return Err(Error::DeniedButAllowed {
                name: (*name).to_owned(),
            });
        }
        for arch in ARCHES {
            for name in NEEDED {
                if !self.always_allows(arch, name) {
                    return Err(Error::NeededNotAllowed {
                        name: name.to_owned(),
                        arch: arch.to_owned(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Whether `name` is allowed on `arch` whatever its arguments: by a group
    /// without conditions, or by the default action when no group gives it
    /// another one.
    fn always_allows(&self, arch: &str, name: &str) -> bool {
        let mut groups = self
            .syscalls
            .iter()
            .filter(|g| g.applies_to(arch) && g.names.iter().any(|n| n == name));
        // A name has one action across its groups (checked above).
        match groups.next() {
            None => self.default_action.allows(),
            Some(g) if !g.action.allows() => false,
            Some(g) => {
                self.default_action.allows()
                    || g.args.is_empty()
                    || groups.any(|g| g.args.is_empty())
            }
        }
    }

    /// Every name listed under `denied`.
    pub fn denied_names(&self) -> BTreeSet<&str> {
        self.denied
            .iter()
            .flat_map(|d| d.names.iter().map(String::as_str))
            .collect()
    }

    /// Every name an `allow` or `log` group lists for `arch`, with or without
    /// argument conditions.
    pub fn allowed_names(&self, arch: &str) -> BTreeSet<&str> {
        self.syscalls
            .iter()
            .filter(|g| g.action.allows() && g.applies_to(arch))
            .flat_map(|g| g.names.iter().map(String::as_str))
            .collect()
    }
}
