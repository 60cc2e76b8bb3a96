//! What the runner and its spawner say to each other over their
//! `SOCK_SEQPACKET` socket: one message each way per launch, encoded with
//! postcard (serde), descriptors beside them (`SCM_RIGHTS`).
//!
//! - First, once: a [`Hello`] with the seccomp program of every plan.
//! - Then per launch: a [`Header`] and the [`Plan`], with init's descriptors
//!   ([`InitFds::to_vec`]'s order), the kind's network namespace when init
//!   joins one ([`NetKind::Join`]), and then the placement's ([`PlaceKind`]
//!   says how many).
//! - The answer: a [`Reply`], with init's pidfd when there is one.

use std::os::fd::{AsFd, OwnedFd, RawFd};

use serde::{Deserialize, Serialize};

use crate::init::InitFds;
use crate::launch::clone::{Net, Place};
use crate::plan::Plan;

/// The largest encoded request sent to the spawner; larger ones are cloned
/// directly. Below the default socket buffer (`net.core.wmem_default`,
/// 208 KiB), which bounds one `SOCK_SEQPACKET` message.
pub(crate) const MAX_REQUEST: usize = 192 << 10;
/// Most descriptors in one request: six of init's, a v2 cgroup, and the
/// `tasks` files of a v1 slot and of home (five hierarchies each, with room
/// to spare).
pub(crate) const MAX_FDS: usize = 32;
/// The argument that makes a binary the spawner (see `run_if_asked`).
pub(crate) const SPAWNER_ARG: &str = "__fnrun-spawner";

/// One seccomp instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Instruction {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// The first message: the program every plan that wants one installs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Hello {
    pub seccomp: Option<Vec<Instruction>>,
}

impl Hello {
    pub fn new(program: Option<&fnrun_seccomp::BpfProgram>) -> Hello {
        Hello {
            seccomp: program.map(|p| {
                p.iter()
                    .map(|f| Instruction {
                        code: f.code,
                        jt: f.jt,
                        jf: f.jf,
                        k: f.k,
                    })
                    .collect()
            }),
        }
    }

    pub fn program(&self) -> Option<fnrun_seccomp::BpfProgram> {
        self.seccomp.as_ref().map(|p| {
            p.iter()
                .map(|i| fnrun_seccomp::sock_filter {
                    code: i.code,
                    jt: i.jt,
                    jf: i.jf,
                    k: i.k,
                })
                .collect()
        })
    }
}

/// How the placement's descriptors follow init's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum PlaceKind {
    /// One: the cgroup directory for `CLONE_INTO_CGROUP`.
    Into,
    /// `enter` files, then `leave` files.
    Move { enter: u8, leave: u8 },
    /// None.
    After,
}

/// Which network namespace init starts in ([`Net`], without its descriptor).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum NetKind {
    New,
    Runner,
    /// The one descriptor after init's.
    Join,
}

/// A launch, besides its plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Header {
    pub net: NetKind,
    /// Init's descriptors include the sockets channel (a service run).
    pub sockets: bool,
    pub place: PlaceKind,
}

impl Header {
    /// The header of a launch and the descriptors that go with it.
    pub fn of(net: Net<'_>, fds: InitFds, place: &Place<'_>) -> Option<(Header, Vec<RawFd>)> {
        use std::os::fd::AsRawFd;
        let mut raw = fds.to_vec();
        let net = match net {
            Net::New => NetKind::New,
            Net::Runner => NetKind::Runner,
            Net::Join(fd) => {
                raw.push(fd.as_raw_fd());
                NetKind::Join
            }
        };
        let place = match place {
            Place::Into(fd) => {
                raw.push(fd.as_raw_fd());
                PlaceKind::Into
            }
            Place::Move { enter, leave } => {
                raw.extend(enter.iter().chain(leave).map(AsRawFd::as_raw_fd));
                PlaceKind::Move {
                    enter: u8::try_from(enter.len()).ok()?,
                    leave: u8::try_from(leave.len()).ok()?,
                }
            }
            Place::After => PlaceKind::After,
        };
        let header = Header {
            net,
            sockets: fds.sockets.is_some(),
            place,
        };
        Some((header, raw))
    }

    /// Init's descriptors, its network namespace and the placement, from
    /// the descriptors received with this header; `None` if they do not
    /// match it.
    pub fn split<'a>(&self, fds: &'a [OwnedFd]) -> Option<(InitFds, Net<'a>, Place<'a>)> {
        use std::os::fd::AsRawFd;
        let n_init = if self.sockets { 6 } else { 5 };
        let (init, mut rest) = (fds.get(..n_init)?, &fds[n_init..]);
        let raw: Vec<RawFd> = init.iter().map(AsRawFd::as_raw_fd).collect();
        let init = InitFds::from_slice(&raw)?;
        let net = match self.net {
            NetKind::New => Net::New,
            NetKind::Runner => Net::Runner,
            NetKind::Join => {
                let (ns, after) = rest.split_first()?;
                rest = after;
                Net::Join(ns.as_fd())
            }
        };
        let place = match self.place {
            PlaceKind::Into if rest.len() == 1 => Place::Into(rest[0].as_fd()),
            PlaceKind::Move { enter, leave }
                if rest.len() == usize::from(enter) + usize::from(leave) =>
            {
                let (enter, leave) = rest.split_at(usize::from(enter));
                Place::Move {
                    enter: enter.iter().map(AsFd::as_fd).collect(),
                    leave: leave.iter().map(AsFd::as_fd).collect(),
                }
            }
            PlaceKind::After if rest.is_empty() => Place::After,
            _ => return None,
        };
        Some((init, net, place))
    }
}

/// Encodes a launch request.
pub(crate) fn encode_request(header: &Header, plan: &Plan) -> Vec<u8> {
    let header = postcard::to_allocvec(header).expect("a header always encodes");
    postcard::to_extend(plan, header).expect("a plan always encodes")
}

/// Decodes a launch request; `None` if it is not one.
pub(crate) fn decode_request(bytes: &[u8]) -> Option<(Header, Plan)> {
    let (header, rest) = postcard::take_from_bytes::<Header>(bytes).ok()?;
    let (plan, rest) = postcard::take_from_bytes::<Plan>(rest).ok()?;
    rest.is_empty().then_some((header, plan))
}

/// A request decoded as the spawner decodes it ([`decode_request`]) and
/// encoded again; `None` if it does not decode.
pub(crate) fn reencode_request(bytes: &[u8]) -> Option<Vec<u8>> {
    decode_request(bytes).map(|(header, plan)| encode_request(&header, &plan))
}

/// A hello decoded as the spawner decodes it, its program taken, and
/// encoded again; `None` if it does not decode.
pub(crate) fn reencode_hello(bytes: &[u8]) -> Option<Vec<u8>> {
    let hello = postcard::from_bytes::<Hello>(bytes).ok()?;
    let again = Hello::new(hello.program().as_ref());
    Some(postcard::to_allocvec(&again).expect("a hello always encodes"))
}

/// A reply decoded as the runner decodes it and encoded again; `None` if
/// it does not decode.
pub(crate) fn reencode_reply(bytes: &[u8]) -> Option<Vec<u8>> {
    let reply = postcard::from_bytes::<Reply>(bytes).ok()?;
    Some(postcard::to_allocvec(&reply).expect("a reply always encodes"))
}

/// Where a launch failed in the spawner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum FailedAt {
    /// The request did not decode, or its descriptors did not match it.
    Request,
    /// Moving into the run's cgroup.
    Enter,
    /// clone3.
    Clone,
    /// Leaving the run's cgroup: init, if cloned, was killed, and the
    /// spawner exits.
    Leave,
}

/// The answer to a launch (init's pidfd beside it when there is one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Reply {
    Cloned { pid: libc::pid_t, placed: bool },
    Failed { at: FailedAt, errno: i32 },
}

/// The largest reply, for the receive buffer.
pub(crate) const MAX_REPLY: usize = 32;

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;
    use crate::steps::Step;

    #[test]
    fn the_hello_carries_the_seccomp_program() {
        let program = fnrun_seccomp::default_program().unwrap();
        let bytes = postcard::to_allocvec(&Hello::new(Some(&program))).unwrap();
        let back = postcard::from_bytes::<Hello>(&bytes)
            .unwrap()
            .program()
            .unwrap();
        assert_eq!(back.len(), program.len());
        for (a, b) in back.iter().zip(&program) {
            assert_eq!((a.code, a.jt, a.jf, a.k), (b.code, b.jt, b.jf, b.k));
        }
        let none = postcard::to_allocvec(&Hello::new(None)).unwrap();
        assert_eq!(
            postcard::from_bytes::<Hello>(&none).unwrap().program(),
            None
        );
    }

    #[test]
    fn requests_cross_the_socket_unchanged() {
        let c = |s: &str| std::ffi::CString::new(s).unwrap();
        let plan = Plan {
            can_setgroups: true,
            uid: 1000,
            gid: 1001,
            groups: vec![1, 2, 3],
            steps: vec![
                Step::Mount {
                    source: Some(c("proc")),
                    target: c("/proc"),
                    fstype: None,
                    flags: libc::MS_RDONLY | libc::MS_NOSUID,
                    data: Some(c("x=y")),
                },
                Step::Hostname {
                    name: c("function"),
                },
                Step::LoopbackUp,
                Step::NewSession,
            ],
            workdir: c("/w"),
            workdir_prefixes: vec![c("/w")],
            exec_paths: vec![c("/bin/cat"), c("/usr/bin/cat")],
            argv: vec![c("cat"), c("")],
            env: vec![c("PATH=/bin"), c("A=b c")],
            last_cap: 40,
            seccomp: true,
        };
        let header = Header {
            net: NetKind::Join,
            sockets: false,
            place: PlaceKind::Move { enter: 5, leave: 5 },
        };
        let mut bytes = encode_request(&header, &plan);
        assert_eq!(decode_request(&bytes), Some((header, plan.clone())));
        // Every truncation, and trailing bytes, are refused.
        for n in 0..bytes.len() {
            assert!(decode_request(&bytes[..n]).is_none(), "{n}");
        }
        bytes.push(0);
        assert!(decode_request(&bytes).is_none());
    }

    #[test]
    fn descriptors_must_match_their_header() {
        let devnull = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let fds: Vec<OwnedFd> = (0..7).map(|_| devnull()).collect();
        let header = |sockets, place| Header {
            net: NetKind::New,
            sockets,
            place,
        };
        let (init, net, place) = header(true, PlaceKind::Into).split(&fds).unwrap();
        assert!(init.sockets.is_some());
        assert!(matches!(net, Net::New));
        assert!(matches!(place, Place::Into(_)));
        let (init, _, place) = header(false, PlaceKind::Move { enter: 1, leave: 1 })
            .split(&fds)
            .unwrap();
        assert!(init.sockets.is_none());
        assert!(
            matches!(place, Place::Move { enter, leave } if enter.len() == 1 && leave.len() == 1)
        );
        assert!(header(false, PlaceKind::After).split(&fds).is_none());
        assert!(header(true, PlaceKind::After).split(&fds[..6]).is_some());
        assert!(header(true, PlaceKind::After).split(&fds[..5]).is_none());
        // A kind's namespace is the one descriptor after init's.
        let joins = |sockets, place| Header {
            net: NetKind::Join,
            sockets,
            place,
        };
        let (_, net, place) = joins(false, PlaceKind::Into).split(&fds).unwrap();
        let Net::Join(ns) = net else {
            panic!("not joined: {net:?}")
        };
        assert_eq!(ns.as_raw_fd(), fds[5].as_raw_fd());
        assert!(matches!(place, Place::Into(p) if p.as_raw_fd() == fds[6].as_raw_fd()));
        assert!(joins(true, PlaceKind::Into).split(&fds[..7]).is_none());
        assert!(joins(true, PlaceKind::After).split(&fds[..6]).is_none());
    }
}
