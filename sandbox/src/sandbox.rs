//! The [`Sandbox`]: the settings of every run and what they set up once (the
//! limiter, the launcher). Its runs are `impl`s of their own modules (`run`,
//! `service`, and `process` below both), which build on this one.

use std::sync::Arc;

use crate::config::{NetworkNamespaces, SandboxConfig};
use crate::error::Error;
use crate::launch;
use crate::limits::{self, LimitSupport};
use crate::netns;

/// Runs functions. Cheap to share: every run takes `&self`.
#[derive(Debug)]
pub struct Sandbox {
    pub(crate) config: SandboxConfig,
    /// Highest capability number of the running kernel.
    pub(crate) last_cap: u32,
    pub(crate) limiter: limits::Limiter,
    pub(crate) launcher: Box<dyn launch::Launcher>,
    /// The kinds' network namespaces, when runs share them.
    pub(crate) nets: Option<Arc<netns::Kinds>>,
}

impl Sandbox {
    /// Checks the host, creates the scratch mount point, and removes the run
    /// cgroups a crashed runner left behind.
    pub fn new(config: SandboxConfig) -> Result<Self, Error> {
        let scratch = &config.scratch_dir;
        std::fs::create_dir_all(scratch).map_err(Error::io_at("create", scratch))?;
        // The sandbox's root (a mapped id) must be able to reach the mount point.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(scratch, std::fs::Permissions::from_mode(0o755))
            .map_err(Error::io_at("chmod", scratch))?;
        let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(63);
        let limiter = limits::Limiter::new(&config.cgroup);
        let launcher = launch::launcher(&config);
        let nets = (config.network_namespaces == NetworkNamespaces::PerKind
            && netns::Kinds::possible())
        .then(Arc::default);
        Ok(Sandbox {
            config,
            last_cap,
            limiter,
            launcher,
            nets,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// Which limits this host can enforce, and how: for the runner to log.
    pub fn limit_support(&self) -> &LimitSupport {
        self.limiter.support()
    }

    /// Whether ISOLATED per-call runs of one kind share network namespaces
    /// ([`NetworkNamespaces::PerKind`] asked for, and this process can make
    /// them: not a rootless runner).
    pub fn shares_network_namespaces(&self) -> bool {
        self.nets.is_some()
    }

    /// The spawner's pid, while one runs (see [`SandboxConfig::spawner`]).
    #[cfg(test)]
    pub(crate) fn spawner_pid(&self) -> Option<libc::pid_t> {
        self.launcher.spawner_pid()
    }
}
