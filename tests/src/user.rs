//! Root checks and the unprivileged `fnrun-test` user.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use anyhow::{Context, Result, bail};
use nix::unistd::{Gid, Uid, User, chown};

use crate::process::check_output;

/// The name of the unprivileged user rootless tests run the daemon as.
pub const TEST_USER: &str = "fnrun-test";

/// Whether the tests run as root (effective uid 0).
pub fn is_root() -> bool {
    Uid::effective().is_root()
}

/// Whether the tests run as root. If not, prints why `test` is skipped and
/// returns false; tests then return early.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    eprintln!("SKIPPED {test}: needs root (to create the {TEST_USER} user and switch to it)");
    false
}

/// Root, and the test user where this host allows rootless runs: the users
/// to start a daemon as in a test that covers both.
pub fn root_and_rootless(test: &str) -> Vec<Option<TestUser>> {
    let mut users = vec![None];
    if require_root(test) {
        match unprivileged_userns_blocked() {
            Some(reason) => eprintln!("SKIPPED {test} rootless: {reason}"),
            None => users.push(Some(ensure_test_user().expect("the test user exists"))),
        }
    }
    users
}

/// The unprivileged test user for a rootless test, or `None` (after saying why
/// `test` is skipped) when not run as root or when the kernel forbids
/// unprivileged user namespaces.
pub fn rootless_user(test: &str) -> Option<TestUser> {
    if !require_root(test) {
        return None;
    }
    if let Some(reason) = unprivileged_userns_blocked() {
        eprintln!("SKIPPED {test}: unprivileged user namespaces are disabled ({reason})");
        return None;
    }
    Some(ensure_test_user().expect("the test user exists"))
}

/// Whether an unprivileged process may create a user namespace here; if not,
/// the reason (Debian's `kernel.unprivileged_userns_clone`, Ubuntu's AppArmor
/// restriction, or `user.max_user_namespaces`).
pub fn unprivileged_userns_blocked() -> Option<String> {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_owned())
    };
    if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        return Some("kernel.unprivileged_userns_clone = 0".to_owned());
    }
    if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        return Some("user.max_user_namespaces = 0".to_owned());
    }
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        return Some("kernel.apparmor_restrict_unprivileged_userns = 1".to_owned());
    }
    None
}

/// An unprivileged user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
}

impl TestUser {
    /// Gives `path` to this user (not recursive).
    pub fn chown(&self, path: &std::path::Path) -> Result<()> {
        chown(
            path,
            Some(Uid::from_raw(self.uid)),
            Some(Gid::from_raw(self.gid)),
        )
        .with_context(|| format!("cannot chown {} to {}", path.display(), self.name))
    }

    /// Gives `path` and everything below it to this user.
    pub fn chown_recursive(&self, path: &std::path::Path) -> Result<()> {
        check_output(
            Command::new("chown")
                .arg("-R")
                .arg(format!("{}:{}", self.uid, self.gid))
                .arg(path),
        )?;
        Ok(())
    }

    /// A command that runs `program` as this user: `setpriv` with this user's
    /// uid and gid, no supplementary groups and no capabilities, a clean
    /// environment (HOME, USER, LOGNAME, PATH), and SIGKILL when the spawning
    /// thread exits.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg("--clear-groups")
            .arg("--inh-caps=-all")
            .arg("--pdeathsig=KILL")
            .arg("--")
            .arg(program)
            .env_clear()
            .env("HOME", &self.home)
            .env("USER", &self.name)
            .env("LOGNAME", &self.name)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin");
        cmd
    }
}

fn lookup(name: &str) -> Result<Option<TestUser>> {
    Ok(User::from_name(name)
        .with_context(|| format!("cannot look up user {name}"))?
        .map(|u| TestUser {
            name: u.name,
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
            home: u.dir,
        }))
}

/// Creates the system user `fnrun-test` (with a home directory and its own
/// group) if it does not exist, and returns it. Needs root.
pub fn ensure_test_user() -> Result<TestUser> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(user) = lookup(TEST_USER)? {
        return Ok(user);
    }
    if !is_root() {
        bail!("user {TEST_USER} does not exist and only root can create it");
    }
    let out = Command::new("useradd")
        .args(["--system", "--user-group", "--create-home", "--home-dir"])
        .arg(format!("/home/{TEST_USER}"))
        .args(["--shell", "/usr/sbin/nologin", TEST_USER])
        .output()
        .context("cannot run useradd")?;
    // Another test process may have created it meanwhile (exit code 9).
    if let Some(user) = lookup(TEST_USER)? {
        return Ok(user);
    }
    bail!(
        "useradd {TEST_USER} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )
}
