//! The resource limits of a run, and how this host enforces them.
//!
//! Memory and CPU limits need a cgroup ([`crate::cgroup`]). The pids limit
//! (always applied: a fork bomb must be contained by default) uses the pids
//! controller when there is one; otherwise, as for a rootless runner without a
//! delegated cgroup, `RLIMIT_NPROC` stands in. That rlimit is per run, not per
//! host user: since Linux 5.14 the kernel counts processes per (user
//! namespace, uid) and checks the limit at each level of the namespace
//! hierarchy, and every run has a user namespace of its own. So the limit set
//! on the sandbox's init (by the parent, with prlimit(2), before init is
//! released) caps the processes of that run only, however many processes the
//! runner's uid has elsewhere. Before 5.14 the count was per host uid, which
//! would include the daemon and every other run: the fallback is off there.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cgroup::{self, CgroupConfig, CgroupDriver, HostFs, RunCgroup, RunNames, Version};
use crate::error::Error;
use crate::spec::Limits;

/// How one kind of limit is enforced on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enforcement {
    /// By a cgroup controller.
    Cgroup(Version),
    /// By `RLIMIT_NPROC` in the run's user namespace (pids only).
    Rlimit,
    /// Not at all, and why.
    Unavailable(String),
}

impl Enforcement {
    /// Whether the limit can be enforced.
    pub fn is_available(&self) -> bool {
        !matches!(self, Enforcement::Unavailable(_))
    }
}

impl fmt::Display for Enforcement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Enforcement::Cgroup(v) => write!(f, "{v}"),
            Enforcement::Rlimit => f.write_str("RLIMIT_NPROC in the run's user namespace"),
            Enforcement::Unavailable(why) => write!(f, "unavailable ({why})"),
        }
    }
}

/// Which limits this host can enforce: for the daemon to log at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitSupport {
    pub memory: Enforcement,
    pub cpu: Enforcement,
    pub pids: Enforcement,
}

impl fmt::Display for LimitSupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "memory: {}; cpu: {}; pids: {}",
            self.memory, self.cpu, self.pids
        )
    }
}

impl LimitSupport {
    /// The limits of `requested` this host cannot enforce, each with why:
    /// what a run of it would fail with ([`Error::LimitUnavailable`]), or
    /// run without under `best_effort_limits`. Known before any run, so that
    /// a caller can say so where its users look (a revision's condition).
    pub fn unenforceable(&self, requested: &Limits) -> Vec<(&'static str, String)> {
        [
            ("memory", requested.memory_bytes, &self.memory),
            ("cpu", requested.cpu_millis, &self.cpu),
            ("pids", requested.pids, &self.pids),
        ]
        .into_iter()
        .filter_map(|(what, value, how)| match (value, how) {
            (Some(_), Enforcement::Unavailable(why)) => Some((what, why.clone())),
            _ => None,
        })
        .collect()
    }
}

/// Sets up the cgroups of runs and decides how each limit is enforced.
#[derive(Debug)]
pub(crate) struct Limiter {
    driver: Option<Box<dyn CgroupDriver>>,
    support: LimitSupport,
    names: RunNames,
    runs: AtomicU64,
}

/// What [`Limiter::prepare`] set up for one run.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    /// The run's cgroup, with its limits applied; init goes in before release.
    pub cgroup: Option<Box<dyn RunCgroup>>,
    /// `RLIMIT_NPROC` to set on init before release.
    pub nproc: Option<u64>,
}

impl Limiter {
    /// Detects the cgroup hierarchy, creates the parent cgroup and sweeps the
    /// run cgroups a crashed daemon left behind. Never fails: what cannot be
    /// used is recorded in [`Self::support`].
    pub fn new(config: &CgroupConfig) -> Limiter {
        let driver = if config.enabled {
            cgroup::detect(config, Arc::new(HostFs)).map_err(|e| e.to_string())
        } else {
            Err("cgroups are disabled in the configuration".to_owned())
        };
        if let Ok(driver) = &driver {
            match driver.sweep(&cgroup::is_stale) {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(removed = n, "removed run cgroups left by an earlier daemon")
                }
                Err(e) => tracing::warn!(error = %e, "cannot sweep stale run cgroups"),
            }
        }
        let enforcement = |c: &dyn Fn(&cgroup::Controllers) -> &Result<(), String>| match &driver {
            Ok(d) => match c(d.controllers()) {
                Ok(()) => Enforcement::Cgroup(d.version()),
                Err(why) => Enforcement::Unavailable(why.clone()),
            },
            Err(why) => Enforcement::Unavailable(format!("no usable cgroup: {why}")),
        };
        let memory = enforcement(&|c| &c.memory);
        let cpu = enforcement(&|c| &c.cpu);
        let pids = match enforcement(&|c| &c.pids) {
            Enforcement::Unavailable(why) => match nproc_is_per_namespace() {
                Ok(()) => Enforcement::Rlimit,
                Err(no) => Enforcement::Unavailable(format!("{why}; {no}")),
            },
            e => e,
        };
        Limiter {
            driver: driver.ok(),
            support: LimitSupport { memory, cpu, pids },
            names: RunNames::new(),
            runs: AtomicU64::new(0),
        }
    }

    /// Which limits can be enforced.
    pub fn support(&self) -> &LimitSupport {
        &self.support
    }

    /// The cgroup driver, if cgroups are usable.
    #[cfg(test)]
    pub fn driver(&self) -> Option<&dyn CgroupDriver> {
        self.driver.as_deref()
    }

    /// Whether `name` is a run cgroup of this limiter.
    #[cfg(test)]
    pub fn is_mine(&self, name: &str) -> bool {
        self.names.is_mine(name)
    }

    /// Creates the run's cgroup with `requested` limits (and the default pids
    /// limit). A requested limit that cannot be enforced is an error, unless
    /// `best_effort`, when it is logged and left out.
    pub fn prepare(
        &self,
        requested: &Limits,
        default_pids: u64,
        best_effort: bool,
    ) -> Result<Prepared, Error> {
        let unavailable = |what: &'static str, why: &str| -> Result<(), Error> {
            if best_effort {
                tracing::warn!(
                    limit = what,
                    reason = why,
                    "running without a requested limit"
                );
                Ok(())
            } else {
                Err(Error::LimitUnavailable {
                    what,
                    why: why.to_owned(),
                })
            }
        };
        let mut in_cgroup = Limits::default();
        let mut nproc = None;
        for (what, value, how, slot) in [
            (
                "memory",
                requested.memory_bytes,
                &self.support.memory,
                &mut in_cgroup.memory_bytes,
            ),
            (
                "cpu",
                requested.cpu_millis,
                &self.support.cpu,
                &mut in_cgroup.cpu_millis,
            ),
        ] {
            if let Some(value) = value {
                match how {
                    Enforcement::Unavailable(why) => unavailable(what, why)?,
                    _ => *slot = Some(value),
                }
            }
        }
        let pids = requested
            .pids
            .or((default_pids > 0).then_some(default_pids));
        if let Some(pids) = pids {
            match &self.support.pids {
                Enforcement::Cgroup(_) => in_cgroup.pids = Some(pids),
                Enforcement::Rlimit => nproc = Some(pids),
                Enforcement::Unavailable(why) if requested.pids.is_some() => {
                    unavailable("pids", why)?
                }
                Enforcement::Unavailable(_) => {}
            }
        }

        let Some(driver) = &self.driver else {
            return Ok(Prepared {
                cgroup: None,
                nproc,
            });
        };
        let name = self.names.run(self.runs.fetch_add(1, Ordering::Relaxed));
        match driver.create(&name, &in_cgroup) {
            Ok(cgroup) => Ok(Prepared {
                cgroup: Some(cgroup),
                nproc,
            }),
            Err(e) => {
                let why = format!("cannot create the run's cgroup: {e}");
                if in_cgroup.memory_bytes.is_some() {
                    unavailable("memory", &why)?;
                }
                if in_cgroup.cpu_millis.is_some() {
                    unavailable("cpu", &why)?;
                }
                if requested.pids.is_some() && nproc.is_none() {
                    unavailable("pids", &why)?;
                }
                tracing::warn!(reason = %why, "running without a cgroup");
                let nproc = nproc.or_else(|| {
                    nproc_is_per_namespace().ok()?;
                    in_cgroup.pids
                });
                Ok(Prepared {
                    cgroup: None,
                    nproc,
                })
            }
        }
    }
}

/// Whether `RLIMIT_NPROC` counts the processes of each user namespace apart
/// (Linux 5.14 and later).
fn nproc_is_per_namespace() -> Result<(), String> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']);
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    if (major, minor) >= (5, 14) {
        Ok(())
    } else {
        Err(format!(
            "Linux {} counts RLIMIT_NPROC per host user, not per run (5.14 needed)",
            release.trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_requested_limits_this_host_cannot_enforce_are_named() {
        let support = LimitSupport {
            memory: Enforcement::Unavailable("no writable cgroup v1 hierarchy".into()),
            cpu: Enforcement::Cgroup(Version::V2),
            pids: Enforcement::Rlimit,
        };
        assert!(support.unenforceable(&Limits::default()).is_empty());
        let all = Limits {
            memory_bytes: Some(1 << 20),
            cpu_millis: Some(500),
            pids: Some(10),
        };
        assert_eq!(
            support.unenforceable(&all),
            vec![("memory", "no writable cgroup v1 hierarchy".to_owned())]
        );
        let cpu_only = Limits {
            cpu_millis: Some(500),
            ..Limits::default()
        };
        assert!(support.unenforceable(&cpu_only).is_empty());
        let none = LimitSupport {
            memory: Enforcement::Unavailable("m".into()),
            cpu: Enforcement::Unavailable("c".into()),
            pids: Enforcement::Unavailable("p".into()),
        };
        let names: Vec<_> = none
            .unenforceable(&all)
            .into_iter()
            .map(|(w, _)| w)
            .collect();
        assert_eq!(names, ["memory", "cpu", "pids"]);
    }
}
