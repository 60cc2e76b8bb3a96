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
    ///
    /// The range must exist in this process's own user namespace: root in a
    /// container with a user namespace of its own (a `hostUsers: false`
    /// pod) has only the ids its `uid_map` and `gid_map` list, 65536 from 0
    /// there. Where the asked-for range is not among them, the largest
    /// range of at least `MIN_RANGE_SIZE` (65535) ids that is (never the
    /// runner's own id) stands in, with a warning; where there is none,
    /// the runner's own ids, as an unprivileged runner maps them.
    pub fn detect(map_root_uid: u32, map_root_gid: u32) -> IdMap {
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        let own = IdMap::Own {
            host_uid: uid,
            host_gid: gid,
        };
        if !has_setid_caps() {
            return own;
        }
        let read = |file| std::fs::read_to_string(format!("/proc/self/{file}")).ok();
        let (Some(uid_map), Some(gid_map)) = (read("uid_map"), read("gid_map")) else {
            return own;
        };
        let uids = fit(map_root_uid, &uid_map, uid);
        let gids = fit(map_root_gid, &gid_map, gid);
        match (uids, gids) {
            (Some((host_uid, usize)), Some((host_gid, gsize))) => {
                let size = usize.min(gsize);
                if (host_uid, host_gid, size) != (map_root_uid, map_root_gid, RANGE_SIZE) {
                    tracing::warn!(
                        asked = %format!("{map_root_uid}/{map_root_gid}+{RANGE_SIZE}"),
                        mapped = %format!("{host_uid}/{host_gid}+{size}"),
                        "the ids --map-root-uid/--map-root-gid name do not all exist in this \
                         process's user namespace; runs map the ids it has"
                    );
                }
                IdMap::Range {
                    host_uid,
                    host_gid,
                    size,
                }
            }
            _ => {
                tracing::warn!(
                    "this process's user namespace has no range of {MIN_RANGE_SIZE} ids to map \
                     for runs; each run maps the runner's own ids, as a rootless runner does"
                );
                own
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

/// The fewest ids a range mapped for runs may have: every id images use by
/// convention (`nobody` is 65534).
pub const MIN_RANGE_SIZE: u32 = 65535;

/// The first id and size of the range of ids to map for runs, in a user
/// namespace whose map (`uid_map` or `gid_map`: `inside outside count`
/// lines) is `map`: `RANGE_SIZE` ids from `wanted` when they all exist,
/// else the largest run of at least [`MIN_RANGE_SIZE`] ids that do, short
/// of `own` (the runner's id, which a run must never share); `None` when
/// there is none.
fn fit(wanted: u32, map: &str, own: u32) -> Option<(u32, u32)> {
    let mut spans: Vec<(u64, u64)> = map
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().map(|n| n.parse::<u64>().ok());
            let (first, _, count) = (f.next()??, f.next()??, f.next()??);
            Some((first, first + count))
        })
        .collect();
    spans.sort_unstable();
    // Adjacent lines make one span.
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (start, end) in spans {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    let own = u64::from(own);
    let want = (u64::from(wanted), u64::from(wanted) + u64::from(RANGE_SIZE));
    if merged.iter().any(|&(s, e)| s <= want.0 && want.1 <= e) && !(want.0..want.1).contains(&own) {
        return Some((wanted, RANGE_SIZE));
    }
    // Each span, split around the runner's own id; ids past u32 do not exist.
    merged
        .iter()
        .flat_map(|&(s, e)| {
            let e = e.min(1 << 32);
            if (s..e).contains(&own) {
                vec![(s, own), (own + 1, e)]
            } else {
                vec![(s, e)]
            }
        })
        .map(|(s, e)| (s, e.saturating_sub(s).min(u64::from(RANGE_SIZE))))
        .filter(|&(_, n)| n >= u64::from(MIN_RANGE_SIZE))
        .max_by_key(|&(_, n)| n)
        .and_then(|(s, n)| Some((u32::try_from(s).ok()?, u32::try_from(n).ok()?)))
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
    fn the_range_is_one_this_process_has() {
        // The initial user namespace has every id.
        let host = "         0          0 4294967295\n";
        assert_eq!(fit(100000, host, 0), Some((100000, RANGE_SIZE)));
        // A hostUsers: false pod: 65536 ids from 0, root among them. The
        // asked-for range is not there: the ids past root stand in.
        let pod = "         0 1234567296      65536\n";
        assert_eq!(fit(100000, pod, 0), Some((1, 65535)));
        // The range is there but holds the runner's own id.
        assert_eq!(fit(0, host, 1000), Some((1001, RANGE_SIZE)));
        // Two lines that meet make one span.
        let split = "0 500000 100000\n100000 800000 100000\n";
        assert_eq!(fit(100000, split, 0), Some((100000, RANGE_SIZE)));
        // Too few ids anywhere: none.
        assert_eq!(fit(100000, "0 1000 1\n", 0), None);
        assert_eq!(fit(100000, "0 1000 40000\n", 0), None);
        assert_eq!(fit(100000, "", 0), None);
        assert_eq!(fit(100000, "garbage\n", 0), None);
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
