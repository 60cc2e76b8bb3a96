//! A kind's network namespaces (`NetworkNamespaces::PerKind`).
//!
//! A new network namespace is the most expensive namespace a run makes, and
//! its teardown (`cleanup_net`, with its RCU waits) costs every CPU of the
//! host. The runs of one *kind* (equal [`RunSpec`]s: the same image and run
//! spec, as the runner's pool keys them) may share one under network policy
//! ISOLATED, one run at a time (shared/SPEC.md, "Sandbox"), so:
//!
//! - **Made by this process**, owned by its user namespace, never by a run's:
//!   a run's new user namespace is a child of this process's, and holds no
//!   capability in the namespace or in the user namespace that owns it. It
//!   cannot add links, addresses, routes or rules, or change a sysctl. The
//!   namespace holds only `lo` (up), with `net.ipv4.tcp_no_metrics_save=1`
//!   and `net.ipv4.tcp_fastopen=0`, both set before any run enters: closed
//!   connections leave no `tcp_metrics` entry, and neither does a fast open
//!   attempt (which records its MSS there whatever `tcp_no_metrics_save`
//!   says). Making one needs `CAP_SYS_ADMIN` in this process's own user
//!   namespace: a rootless runner cannot ([`Kinds::possible`]), and its runs
//!   keep a new namespace each.
//! - **One run at a time in each.** A kind has a free list; a run takes a
//!   namespace off it (or a new one is made) when it is launched, and gives
//!   it back once its init is reaped: every process of the run is dead then
//!   (its PID namespace is gone), so none of its sockets is open.
//! - **Reused only clean.** What a dead run can still leave behind is
//!   checked before the namespace is reused, from `/proc/net` files opened
//!   inside it when it was made: any socket in use (`sockstat`'s and
//!   `sockstat6`'s counts: a socket kept alive in flight in a unix socket's
//!   queue until the kernel's garbage collector runs, a TCP socket still
//!   closing, a loopback `TIME_WAIT` entry, a socket whose memory waits for
//!   an RCU grace period), a unix, packet or netlink socket, an IPv6 flow
//!   label lingering after its socket. A namespace with any of that is set
//!   aside (at most [`MAX_UNCLEAN`] per kind, the oldest ended beyond) and
//!   reused only once a new check finds it clean. What is left is the
//!   namespace's counters (`/proc/net/snmp`, `netstat`, `dev`): the one
//!   carry-over `docs/security.md` accepts.
//! - **Never shared between kinds; ended with its kind's last sandbox.** A
//!   kind counts its live runs (prepared, running or ending); when the last
//!   gives its namespace back, the kind's free namespaces are closed, and the
//!   kernel ends them.

use std::collections::{HashMap, VecDeque};
use std::ffi::CStr;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex, PoisonError};

use crate::RunSpec;
use crate::error::Error;
use crate::sys;

/// The sysctls of a kind's namespace, set when it is made.
const SYSCTLS: [(&CStr, &[u8]); 2] = [
    (c"/proc/sys/net/ipv4/tcp_no_metrics_save", b"1"),
    (c"/proc/sys/net/ipv4/tcp_fastopen", b"0"),
];

/// Files of `/proc/net` whose counts must be zero for a namespace to be
/// reused: `sockets: used`, every `inuse` and `tw`.
const COUNTED: [&CStr; 2] = [
    c"/proc/thread-self/net/sockstat",
    c"/proc/thread-self/net/sockstat6",
];

/// Files of `/proc/net` with a row per object: as many rows as when the
/// namespace was made (the kernel's own netlink sockets).
const LISTED: [&CStr; 4] = [
    c"/proc/thread-self/net/unix",
    c"/proc/thread-self/net/packet",
    c"/proc/thread-self/net/netlink",
    c"/proc/thread-self/net/ip6_flowlabel",
];

/// The kinds' namespaces of one sandbox.
#[derive(Debug, Default)]
pub(crate) struct Kinds {
    kinds: Mutex<HashMap<Arc<RunSpec>, Kind>>,
    /// A namespace could not be made (and the warning said so).
    warned: std::sync::atomic::AtomicBool,
}

/// Most namespaces a kind keeps that were not clean when given back.
const MAX_UNCLEAN: usize = 4;

/// One kind's namespaces.
#[derive(Debug, Default)]
struct Kind {
    /// Runs of the kind that hold a namespace.
    live: usize,
    /// Namespaces no run holds, clean when given back.
    free: Vec<KindNet>,
    /// Namespaces no run holds that were not clean when given back, oldest
    /// first: reused once clean (a socket's memory, and its count, is freed
    /// an RCU grace period after its last process is gone, a netlink
    /// socket's always; a socket in flight when the garbage collector has
    /// run; a `TIME_WAIT` entry after a minute).
    unclean: VecDeque<KindNet>,
}

/// A namespace a run holds, given back when dropped.
#[derive(Debug)]
pub(crate) struct Lease {
    kinds: Arc<Kinds>,
    kind: Arc<RunSpec>,
    net: Option<KindNet>,
}

impl Lease {
    /// The namespace, for init to be cloned into.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.net
            .as_ref()
            .expect("a lease holds its namespace until dropped")
            .ns
            .as_fd()
    }
}

impl Drop for Lease {
    /// Counts the run out of its kind, giving its namespace back (none if
    /// none could be made for it).
    fn drop(&mut self) {
        self.kinds.give_back(&self.kind, self.net.take());
    }
}

impl Kinds {
    /// Whether this process can make namespaces for its runs to share: it
    /// holds `CAP_SYS_ADMIN` in its own user namespace (root, or root of a
    /// container's user namespace), which both making one and entering it
    /// need.
    ///
    /// The cloning thread must also be able to go back to this process's
    /// own network namespace after each clone, which takes `CAP_SYS_ADMIN`
    /// in the user namespace that owns *that* namespace: root in a user
    /// namespace of its own (a `hostUsers: false` pod) that shares the
    /// host's network namespace cannot, and its runs get a namespace each.
    /// Tried on a thread of its own: `setns` into its own namespace.
    pub fn possible() -> bool {
        const CAP_SYS_ADMIN: u32 = 21;
        let capable = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
                u64::from_str_radix(hex.trim(), 16).ok()
            })
            .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0);
        capable
            && std::thread::spawn(|| {
                let home = sys::open_cloexec(c"/proc/thread-self/ns/net")?;
                sys::setns(home.as_raw_fd(), libc::CLONE_NEWNET)
            })
            .join()
            .is_ok_and(|entered| entered.is_ok())
    }

    /// A namespace of `spec`'s kind for one run: a free one, else a new
    /// one; `None` if none can be made (a read-only `/proc/sys` in a
    /// container, say): the run then gets its own, as per-run, with a
    /// warning the first time.
    pub fn take_or_own(self: &Arc<Self>, spec: &RunSpec) -> Option<Lease> {
        match self.take(spec) {
            Ok(lease) => Some(lease),
            Err(e) => {
                if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(error = %e, "cannot make a network namespace for a kind's runs: runs get their own");
                }
                None
            }
        }
    }

    /// A namespace of `spec`'s kind for one run: a free one, else a new one.
    pub fn take(self: &Arc<Self>, spec: &RunSpec) -> Result<Lease, Error> {
        let (kind, free) = {
            let mut kinds = self.lock();
            let (kind, entry) = match kinds.get_key_value(spec) {
                Some((kind, _)) => (kind.clone(), kinds.get_mut(spec).expect("just found")),
                None => {
                    let kind = Arc::new(spec.clone());
                    (kind.clone(), kinds.entry(kind).or_default())
                }
            };
            entry.live += 1;
            let free = entry.free.pop().or_else(|| {
                let clean = entry.unclean.iter().position(KindNet::is_clean)?;
                entry.unclean.remove(clean)
            });
            (kind, free)
        };
        let mut lease = Lease {
            kinds: self.clone(),
            kind,
            net: None,
        };
        lease.net = Some(match free {
            Some(net) => net,
            None => match KindNet::make() {
                Ok(net) => net,
                Err(e) => {
                    // Dropping the lease counts the run out again.
                    drop(lease);
                    return Err(e);
                }
            },
        });
        Ok(lease)
    }

    /// Gives `net` back to `kind` (once its run is over), if it is as clean
    /// as made; ends the kind's namespaces if that was its last run.
    fn give_back(&self, kind: &Arc<RunSpec>, net: Option<KindNet>) {
        let left = net.as_ref().and_then(KindNet::left);
        let clean = left.is_none();
        if let Some(left) = left {
            tracing::debug!(%left, "a run left sockets in its kind's network namespace: set aside");
        }
        let ended = {
            let mut kinds = self.lock();
            let Some(entry) = kinds.get_mut(kind) else {
                return;
            };
            entry.live = entry.live.saturating_sub(1);
            let Some(net) = net else {
                let ended = (entry.live == 0).then(|| kinds.remove(kind));
                drop(kinds);
                drop(ended);
                return;
            };
            if entry.live == 0 {
                kinds.remove(kind).map(|k| (k.free, k.unclean))
            } else if clean {
                entry.free.push(net);
                None
            } else {
                entry.unclean.push_back(net);
                let over = entry.unclean.len().saturating_sub(MAX_UNCLEAN);
                Some((Vec::new(), entry.unclean.drain(..over).collect()))
            }
        };
        // Closed outside the lock: the kernel ends them in the background.
        drop(ended);
    }

    /// How many namespaces the kinds hold (in use or free), and how many
    /// kinds: for tests.
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize) {
        let kinds = self.lock();
        let free: usize = kinds.values().map(|k| k.free.len() + k.unclean.len()).sum();
        let live: usize = kinds.values().map(|k| k.live).sum();
        (free + live, kinds.len())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<RunSpec>, Kind>> {
        self.kinds.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One namespace of a kind, with the `/proc/net` files that show what is in
/// it.
#[derive(Debug)]
struct KindNet {
    ns: OwnedFd,
    /// [`COUNTED`]'s files that exist (no `sockstat6` without IPv6).
    counted: Vec<File>,
    /// [`LISTED`]'s files that exist, with their rows when made.
    listed: Vec<(File, usize)>,
}

impl KindNet {
    /// Makes a namespace, on a thread of its own that ends in it: this
    /// process's other threads stay where they are.
    fn make() -> Result<KindNet, Error> {
        std::thread::Builder::new()
            .name("fnrun-netns".into())
            .spawn(Self::make_here)
            .map_err(Error::io("start a thread to make a network namespace"))?
            .join()
            .unwrap_or_else(|_| {
                Err(Error::errno("make a network namespace")(
                    nix::errno::Errno::EIO,
                ))
            })
    }

    /// Moves this thread into a new network namespace and sets it up.
    fn make_here() -> Result<KindNet, Error> {
        sys::unshare(libc::CLONE_NEWNET).map_err(Error::errno("unshare a network namespace"))?;
        sys::loopback_up().map_err(Error::errno("bring up the loopback interface"))?;
        for (path, value) in SYSCTLS {
            sys::write_file(path, value)
                .map_err(Error::errno("set a sysctl of a kind's network namespace"))?;
        }
        let ns = sys::open_cloexec(c"/proc/thread-self/ns/net")
            .map_err(Error::errno("open a network namespace"))?;
        let open = |path: &CStr| sys::open_cloexec(path).ok().map(File::from);
        let counted = COUNTED.into_iter().filter_map(open).collect();
        let listed = LISTED
            .into_iter()
            .filter_map(open)
            .map(|file| {
                let rows = rows(&file).unwrap_or(usize::MAX);
                (file, rows)
            })
            .collect();
        Ok(KindNet {
            ns,
            counted,
            listed,
        })
    }

    /// Whether the namespace is as it was made (but for its counters).
    fn is_clean(&self) -> bool {
        self.left().is_none()
    }

    /// The first thing found in the namespace that was not there when it
    /// was made, in words.
    fn left(&self) -> Option<String> {
        for file in &self.counted {
            match read(file) {
                Some(text) if counts_are_zero(&text) => {}
                Some(text) => return Some(text),
                None => return Some("an unreadable sockstat".to_owned()),
            }
        }
        for (file, made) in &self.listed {
            match rows(file) {
                Some(n) if n == *made => {}
                n => return Some(format!("{n:?} rows where {made} were")),
            }
        }
        None
    }
}

/// The whole of a `/proc/net` file, read from its start (each read makes
/// it anew, for the namespace it was opened in).
fn read(file: &File) -> Option<String> {
    let mut text = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    loop {
        let n = file.read_at(&mut buf, text.len() as u64).ok()?;
        if n == 0 {
            return String::from_utf8(text).ok();
        }
        text.extend_from_slice(&buf[..n]);
        if text.len() > 1 << 20 {
            return None;
        }
    }
}

/// Lines after the header.
fn rows(file: &File) -> Option<usize> {
    Some(
        read(file)?
            .lines()
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .count(),
    )
}

/// Whether every per-namespace count of a `sockstat` file is zero:
/// `sockets: used`, `inuse` and `tw` (`orphan`, `alloc` and `mem` are the
/// host's, not the namespace's).
fn counts_are_zero(text: &str) -> bool {
    text.lines().all(|line| {
        let mut words = line.split_whitespace().skip(1);
        while let (Some(name), Some(value)) = (words.next(), words.next()) {
            if matches!(name, "used" | "inuse" | "tw") && value != "0" {
                return false;
            }
        }
        true
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run whose namespace could not be made (its lease holds none) is
    /// counted out of its kind all the same: the kind's last run gone, the
    /// kind is.
    #[test]
    fn a_lease_without_a_namespace_counts_its_run_out() {
        let kinds = Arc::new(Kinds::default());
        let spec = Arc::new(RunSpec {
            layers: Vec::new(),
            argv: vec!["true".into()],
            env: Vec::new(),
            workdir: "/".into(),
            uid: 0,
            gid: 0,
            groups: Vec::new(),
            network: crate::Network::Isolated,
            limits: crate::Limits::default(),
            mounts: Vec::new(),
            caller: None,
        });
        kinds.lock().insert(
            spec.clone(),
            Kind {
                live: 2,
                ..Kind::default()
            },
        );
        let lease = || Lease {
            kinds: kinds.clone(),
            kind: spec.clone(),
            net: None,
        };
        drop(lease());
        assert_eq!(kinds.lock()[&spec].live, 1);
        drop(lease());
        assert_eq!(kinds.counts(), (0, 0));
    }

    #[test]
    fn sockstat_counts() {
        let fresh = "sockets: used 0\nTCP: inuse 0 orphan 3 tw 0 alloc 2 mem 7\n\
                     UDP: inuse 0 mem 0\nFRAG: inuse 0 memory 0\n";
        assert!(counts_are_zero(fresh));
        assert!(counts_are_zero("TCP6: inuse 0\nRAW6: inuse 0\n"));
        assert!(!counts_are_zero("sockets: used 1\n"));
        assert!(!counts_are_zero(
            "TCP: inuse 0 orphan 0 tw 2 alloc 2 mem 0\n"
        ));
        assert!(!counts_are_zero("UDP6: inuse 1\n"));
        assert!(!counts_are_zero("FRAG: inuse 1 memory 0\n"));
    }
}
