//! The planner: turns a [`RunSpec`] into the [`Plan`] that init walks. Pure
//! (no system calls), so every check and the order of the steps are
//! unit-tested without root.
//!
//! The plan holds everything init and the function need as C strings and
//! numbers, prepared before the clone: the child allocates nothing (see
//! `init.rs`). It crosses to the spawner whole (serde), without the
//! descriptors and the seccomp program, which travel apart.

use std::ffi::CString;

use serde::{Deserialize, Serialize};

use crate::cstr::cstring;
use crate::error::{Error, SpecError};
use crate::steps::{self, Step};
use crate::{DEFAULT_PATH, RunSpec, SandboxConfig};

/// Everything init needs, prepared before the clone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Plan {
    /// setgroups(2) is allowed (a full id map written by a privileged parent).
    pub can_setgroups: bool,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<libc::gid_t>,
    /// How init builds the root, in order.
    pub steps: Vec<Step>,
    pub workdir: CString,
    /// `/a`, `/a/b`, ... of the working directory, to create it if missing.
    pub workdir_prefixes: Vec<CString>,
    /// Paths to try for the entrypoint, in order (a PATH search done ahead).
    pub exec_paths: Vec<CString>,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    /// Highest capability number of the running kernel.
    pub last_cap: u32,
    /// Install the sandbox's seccomp program last before exec.
    pub seccomp: bool,
}

/// Plans a run of `spec` (in its kind's network namespace when `joined`,
/// see [`steps::rootfs`]): checks it (argv, an absolute working directory,
/// ids inside the mapped range, strings without NUL bytes) and prepares it.
pub(crate) fn plan(
    config: &SandboxConfig,
    last_cap: u32,
    spec: &RunSpec,
    run_tag: &str,
    joined: bool,
) -> Result<Plan, Error> {
    let Some(argv0) = spec.argv.first() else {
        return Err(SpecError::NoCommand.into());
    };
    if !spec.workdir.starts_with('/') {
        return Err(SpecError::RelativeWorkdir(spec.workdir.clone()).into());
    }
    let size = config.id_map.size();
    // The caller's ids, when the run maps them too.
    let caller = spec
        .caller
        .map(|user| config.id_map.inside_ids(user))
        .transpose()?;
    for (what, id) in [("uid", spec.uid), ("gid", spec.gid)]
        .into_iter()
        .chain(spec.groups.iter().map(|g| ("group", *g)))
    {
        let callers = caller.is_some_and(|(uid, gid)| match what {
            "uid" => id == uid,
            _ => id == gid,
        });
        if id >= size && !callers {
            return Err(SpecError::Unmapped { what, id, size }.into());
        }
    }
    let path_var = spec
        .env
        .iter()
        .rev()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or(DEFAULT_PATH);
    let exec_paths = if argv0.contains('/') {
        vec![cstring("entrypoint", argv0.as_bytes())?]
    } else {
        path_var
            .split(':')
            .filter(|d| !d.is_empty())
            .map(|d| {
                cstring(
                    "entrypoint",
                    format!("{}/{argv0}", d.trim_end_matches('/')).as_bytes(),
                )
            })
            .collect::<Result<_, _>>()?
    };
    let mut prefixes = Vec::new();
    let mut prefix = String::new();
    for part in spec.workdir.split('/').filter(|p| !p.is_empty()) {
        prefix.push('/');
        prefix.push_str(part);
        prefixes.push(cstring("working directory", prefix.as_bytes())?);
    }
    Ok(Plan {
        can_setgroups: config.id_map.can_setgroups(),
        uid: spec.uid,
        gid: spec.gid,
        groups: spec.groups.clone(),
        steps: steps::rootfs(config, spec, run_tag, joined)?,
        workdir: cstring("working directory", spec.workdir.as_bytes())?,
        workdir_prefixes: prefixes,
        exec_paths,
        argv: spec
            .argv
            .iter()
            .map(|a| cstring("argument", a.as_bytes()))
            .collect::<Result<_, _>>()?,
        env: spec
            .env
            .iter()
            .map(|e| cstring("environment variable", e.as_bytes()))
            .collect::<Result<_, _>>()?,
        last_cap,
        seccomp: config.seccomp.is_some(),
    })
}
