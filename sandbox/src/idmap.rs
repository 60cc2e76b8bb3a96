//! User and group id maps of the sandbox's user namespace.

use std::io::Write;

use crate::error::SpecError;
use crate::spec::HostUser;

/// How ids inside the sandbox map to the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdMap {
    /// A privileged runner (CAP_SETUID and CAP_SETGID): `size` ids from
    /// `host_uid`/`host_gid` become 0.. inside.
    Range {
        host_uid: u32,
        host_gid: u32,
        size: u32,
    },
    /// An unprivileged runner: only its own uid and gid, mapped to 0.
    Own { host_uid: u32, host_gid: u32 },
}

/// Number of ids mapped for a privileged runner.
pub const RANGE_SIZE: u32 = 65536;

const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;

impl IdMap {
    /// The map this process can set up: a range from `map_root_uid`/`gid` when
    /// it holds CAP_SETUID and CAP_SETGID, else its own ids.
    pub fn detect(map_root_uid: u32, map_root_gid: u32) -> IdMap {
        if has_setid_caps() {
            IdMap::Range {
                host_uid: map_root_uid,
                host_gid: map_root_gid,
                size: RANGE_SIZE,
            }
        } else {
            IdMap::Own {
                host_uid: nix::unistd::geteuid().as_raw(),
                host_gid: nix::unistd::getegid().as_raw(),
            }
        }
    }

    /// How many ids exist inside the sandbox.
    pub fn size(&self) -> u32 {
        match self {
            IdMap::Range { size, .. } => *size,
            IdMap::Own { .. } => 1,
        }
    }

    /// Whether the sandbox may call setgroups(2): only with a map written by a
    /// privileged parent; otherwise the kernel requires setgroups to be denied.
    pub fn can_setgroups(&self) -> bool {
        matches!(self, IdMap::Range { .. })
    }

    /// The uid and gid `user` has inside a run that maps it.
    ///
    /// A privileged runner maps it as one more id, right past its range
    /// (`size`, so 65536 by default), by an extra line in that run's maps; it
    /// cannot be one of the range's host ids. An unprivileged runner maps only
    /// its own ids, to 0: `user` must be those.
    pub fn inside_ids(&self, user: HostUser) -> Result<(u32, u32), SpecError> {
        let refuse = |why| SpecError::HostUser {
            uid: user.uid,
            gid: user.gid,
            why,
        };
        match *self {
            IdMap::Range {
                host_uid,
                host_gid,
                size,
            } => {
                let inside = |id: u32, first: u32| id >= first && id - first < size;
                if inside(user.uid, host_uid) || inside(user.gid, host_gid) {
                    return Err(refuse("its ids are in the range mapped for the image"));
                }
                Ok((size, size))
            }
            IdMap::Own { host_uid, host_gid } => {
                if (user.uid, user.gid) != (host_uid, host_gid) {
                    return Err(refuse(
                        "an unprivileged runner can map only its own uid and gid",
                    ));
                }
                Ok((0, 0))
            }
        }
    }

    /// The contents of `uid_map` and `gid_map`.
    pub fn lines(&self) -> (String, String) {
        match *self {
            IdMap::Range {
                host_uid,
                host_gid,
                size,
            } => (
                format!("0 {host_uid} {size}\n"),
                format!("0 {host_gid} {size}\n"),
            ),
            IdMap::Own { host_uid, host_gid } => {
                (format!("0 {host_uid} 1\n"), format!("0 {host_gid} 1\n"))
            }
        }
    }

    /// The contents of `uid_map` and `gid_map` of a run that also maps
    /// `caller` (see [`IdMap::inside_ids`], which must have accepted it).
    pub fn lines_with(&self, caller: Option<HostUser>) -> (String, String) {
        let (mut uid_map, mut gid_map) = self.lines();
        if let (Some(user), IdMap::Range { size, .. }) = (caller, self) {
            uid_map.push_str(&format!("{size} {} 1\n", user.uid));
            gid_map.push_str(&format!("{size} {} 1\n", user.gid));
        }
        (uid_map, gid_map)
    }

    /// Writes the maps of the child `pid`'s user namespace, with `caller`'s
    /// ids too.
    pub fn write(&self, pid: libc::pid_t, caller: Option<HostUser>) -> std::io::Result<()> {
        let (uid_map, gid_map) = self.lines_with(caller);
        let write = |file: &str, data: &str| -> std::io::Result<()> {
            let path = format!("/proc/{pid}/{file}");
            let mut f = std::fs::OpenOptions::new().write(true).open(&path)?;
            f.write_all(data.as_bytes())
                .map_err(|e| std::io::Error::new(e.kind(), format!("{path}: {e}")))
        };
        if !self.can_setgroups() {
            write("setgroups", "deny")?;
        }
        write("uid_map", &uid_map)?;
        write("gid_map", &gid_map)
    }
}

fn has_setid_caps() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let want = (1u64 << CAP_SETUID) | (1u64 << CAP_SETGID);
    eff & want == want
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_lines() {
        let range = IdMap::Range {
            host_uid: 100000,
            host_gid: 200000,
            size: RANGE_SIZE,
        };
        assert_eq!(
            range.lines(),
            ("0 100000 65536\n".to_owned(), "0 200000 65536\n".to_owned())
        );
        assert!(range.can_setgroups());
        let own = IdMap::Own {
            host_uid: 1000,
            host_gid: 1001,
        };
        assert_eq!(
            own.lines(),
            ("0 1000 1\n".to_owned(), "0 1001 1\n".to_owned())
        );
        assert_eq!(own.size(), 1);
        assert!(!own.can_setgroups());
    }

    #[test]
    fn a_host_user_is_mapped_past_the_range_or_as_the_runner() {
        let range = IdMap::Range {
            host_uid: 100000,
            host_gid: 200000,
            size: RANGE_SIZE,
        };
        let root = HostUser { uid: 0, gid: 0 };
        assert_eq!(range.inside_ids(root), Ok((65536, 65536)));
        assert_eq!(
            range.lines_with(Some(root)),
            (
                "0 100000 65536\n65536 0 1\n".to_owned(),
                "0 200000 65536\n65536 0 1\n".to_owned()
            )
        );
        assert_eq!(range.lines_with(None), range.lines());
        for user in [
            HostUser {
                uid: 100000,
                gid: 0,
            },
            HostUser {
                uid: 165535,
                gid: 0,
            },
            HostUser {
                uid: 0,
                gid: 200000,
            },
        ] {
            let err = range.inside_ids(user).unwrap_err().to_string();
            assert!(err.contains("in the range mapped for the image"), "{err}");
        }
        assert!(
            range
                .inside_ids(HostUser {
                    uid: 165536,
                    gid: 0
                })
                .is_ok()
        );
        let own = IdMap::Own {
            host_uid: 1000,
            host_gid: 1001,
        };
        assert_eq!(
            own.inside_ids(HostUser {
                uid: 1000,
                gid: 1001
            }),
            Ok((0, 0))
        );
        assert_eq!(
            own.lines_with(Some(HostUser {
                uid: 1000,
                gid: 1001
            })),
            own.lines()
        );
        let err = own.inside_ids(root).unwrap_err().to_string();
        assert!(err.contains("only its own uid and gid"), "{err}");
    }

    #[test]
    fn detect_matches_privilege() {
        let map = IdMap::detect(100000, 100000);
        if nix::unistd::geteuid().is_root() && has_setid_caps() {
            assert_eq!(map.size(), RANGE_SIZE);
        } else {
            assert_eq!(map.size(), 1);
        }
    }
}
