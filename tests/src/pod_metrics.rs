//! What pods on the tests' node ([`crate::node`]) use, read from outside as
//! the node's kernel accounts it: the pods' cgroups (cgroup v1, kubelet's
//! `cgroupfs` driver: `pod<UID>` below [`CGROUP_ROOT`] in each hierarchy,
//! one cgroup per container below it) and their containerd shims, which run
//! outside the pods' cgroups (`containerd-shim-runc-v2 ... -id SANDBOX`,
//! one per pod: the pod's containers share their sandbox's shim).
//!
//! - memory: the cgroup's `memory.usage_in_bytes` and its `memory.stat`
//!   (`total_rss`, `total_cache`, `total_inactive_file`), and the working
//!   set as kubelet and metrics-server compute it (usage less inactive
//!   file pages); RSS and PSS of the processes in the cgroups and of the
//!   shims, from `/proc/PID/smaps_rollup` (PSS splits pages that several
//!   processes map, such as one function binary run by many pods);
//! - CPU: the cgroup's `cpuacct.usage` (ns), and the shims' `utime + stime`
//!   from `/proc/PID/stat`.
//!
//! [`PodSample::take`] reads all of it for a set of pods at one time;
//! [`PodSample::cpu_since`] is the CPU between two samples.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::node::CGROUP_ROOT;

/// Where the cgroup v1 hierarchies are mounted.
pub const CGROUP_FS: &str = "/sys/fs/cgroup";

/// The shim binary containerd starts for a pod sandbox.
pub const SHIM: &str = "containerd-shim-runc-v2";

/// A pod, as the API server names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl Pod {
    /// The pods of `list` (a `kubectl get pods -o json` list).
    pub fn from_list(list: &serde_json::Value) -> Vec<Pod> {
        list["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|p| {
                let meta = &p["metadata"];
                Some(Pod {
                    namespace: meta["namespace"].as_str()?.to_owned(),
                    name: meta["name"].as_str()?.to_owned(),
                    uid: meta["uid"].as_str()?.to_owned(),
                })
            })
            .collect()
    }
}

/// The cgroup of the pod `uid` in the hierarchy `hierarchy`
/// (`/sys/fs/cgroup/memory`, ...): the directory `pod<UID>` (kubelet's
/// `cgroupfs` driver; `pod<UID with _ for ->` with the `systemd` one, which
/// ends in `.slice`) anywhere below [`CGROUP_ROOT`].
pub fn pod_cgroup(hierarchy: &Path, uid: &str) -> Option<PathBuf> {
    let names = [format!("pod{uid}"), format!("pod{}", uid.replace('-', "_"))];
    let mut todo = vec![hierarchy.join(CGROUP_ROOT)];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let bare = name.strip_suffix(".slice").unwrap_or(&name);
            if names
                .iter()
                .any(|n| bare == n || bare.ends_with(&format!("-{n}")))
            {
                return Some(entry.path());
            }
            todo.push(entry.path());
        }
    }
    None
}

/// The names of the directories right below `dir`: a pod cgroup's
/// containers (their IDs; the sandbox's among them).
pub fn child_cgroups(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

/// Every process in `dir` and the cgroups below it (`cgroup.procs`).
pub fn cgroup_pids(dir: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            out.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            todo.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// `memory.stat` as `key value` pairs.
pub fn parse_memory_stat(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (key, value) = l.split_once(' ')?;
            Some((key.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

/// A memory cgroup's usage (bytes), its whole subtree counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CgroupMemory {
    /// `memory.usage_in_bytes`: anonymous and page cache charged to it.
    pub usage: u64,
    /// `usage` less `total_inactive_file` (what kubelet reports as the
    /// working set, and evicts on).
    pub working_set: u64,
    /// `total_rss`: anonymous memory.
    pub rss: u64,
    /// `total_cache`: page cache charged to the cgroup.
    pub cache: u64,
}

impl CgroupMemory {
    /// From `memory.usage_in_bytes` and `memory.stat`'s text.
    pub fn parse(usage: &str, stat: &str) -> Result<CgroupMemory> {
        let usage: u64 = usage.trim().parse().with_context(|| {
            let shown: String = usage.chars().take(64).collect();
            format!("memory.usage_in_bytes is no count: {shown:?}")
        })?;
        let stat = parse_memory_stat(stat);
        let field = |key: &str| {
            stat.get(key)
                .copied()
                .with_context(|| format!("memory.stat has no {key}"))
        };
        let inactive_file = field("total_inactive_file")?;
        Ok(CgroupMemory {
            usage,
            working_set: usage.saturating_sub(inactive_file),
            rss: field("total_rss")?,
            cache: field("total_cache")?,
        })
    }

    /// Of the memory cgroup `dir`.
    pub fn read(dir: &Path) -> Result<CgroupMemory> {
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .with_context(|| format!("cannot read {}", dir.join(name).display()))
        };
        CgroupMemory::parse(&read("memory.usage_in_bytes")?, &read("memory.stat")?)
    }

    fn add(&mut self, other: &CgroupMemory) {
        self.usage += other.usage;
        self.working_set += other.working_set;
        self.rss += other.rss;
        self.cache += other.cache;
    }
}

/// `cpuacct.usage` (ns) of the cpuacct cgroup `dir`.
pub fn cgroup_cpu_ns(dir: &Path) -> Result<u64> {
    let path = dir.join("cpuacct.usage");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    text.trim()
        .parse()
        .with_context(|| format!("{} is no count: {text:?}", path.display()))
}

/// The cpuacct hierarchy (`cpuacct`, or `cpu,cpuacct` where they are
/// mounted together).
pub fn cpuacct_hierarchy() -> PathBuf {
    let alone = Path::new(CGROUP_FS).join("cpuacct");
    if alone.join("cpuacct.usage").exists() {
        alone
    } else {
        Path::new(CGROUP_FS).join("cpu,cpuacct")
    }
}

/// The sandbox ID a shim serves, from its command line (NUL-separated, as
/// `/proc/PID/cmdline` has it): the value of `-id` if the program is
/// [`SHIM`].
pub fn shim_id(cmdline: &[u8]) -> Option<String> {
    let args: Vec<&str> = cmdline
        .split(|b| *b == 0)
        .filter_map(|a| std::str::from_utf8(a).ok())
        .collect();
    let program = args.first()?;
    if Path::new(program).file_name()?.to_str()? != SHIM {
        return None;
    }
    let at = args.iter().position(|a| *a == "-id")?;
    args.get(at + 1)
        .filter(|id| !id.is_empty())
        .map(|id| (*id).to_owned())
}

/// Every running shim: its PID and sandbox ID.
pub fn shims() -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<(u32, String)> = entries
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some((pid, shim_id(&cmdline)?))
        })
        .collect();
    out.sort();
    out
}

/// `utime + stime` (clock ticks) from the text of `/proc/PID/stat` (the
/// 14th and 15th fields; the command name, 2nd, may hold spaces and
/// parentheses, so the fields are counted after its last `)`).
pub fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at the 3rd field (state).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    utime.checked_add(stime)
}

/// The kernel's clock ticks per second (`_SC_CLK_TCK`).
pub fn clock_ticks() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// CPU time (ns) `pid` has used, 0 if it is gone.
pub fn process_cpu_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_cpu_ticks(&s))
        .map_or(0, |ticks| ticks * 1_000_000_000 / clock_ticks())
}

/// RSS and PSS (KiB) of processes, from `/proc/PID/smaps_rollup`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ProcessMemory {
    pub processes: usize,
    pub rss_kib: u64,
    pub pss_kib: u64,
}

impl ProcessMemory {
    /// Adds the `Rss:` and `Pss:` lines of one process's `smaps_rollup`.
    pub fn add_rollup(&mut self, rollup: &str) {
        let kib = |l: &str| -> u64 {
            l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        self.processes += 1;
        for line in rollup.lines() {
            if line.starts_with("Rss:") {
                self.rss_kib += kib(line);
            } else if line.starts_with("Pss:") {
                self.pss_kib += kib(line);
            }
        }
    }

    /// Of `pids` (those gone or unreadable left out).
    pub fn of(pids: &[u32]) -> ProcessMemory {
        let mut out = ProcessMemory::default();
        for pid in pids {
            if let Ok(rollup) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
                out.add_rollup(&rollup);
            }
        }
        out
    }
}

/// What a set of pods and their shims use at one time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PodSample {
    /// The pods sampled (`namespace/name`).
    pub pods: Vec<String>,
    /// Their memory cgroups, summed.
    pub cgroup_memory: CgroupMemory,
    /// `cpuacct.usage` of their cgroups, summed (ns).
    pub cgroup_cpu_ns: u64,
    /// The processes in their cgroups.
    pub processes: ProcessMemory,
    /// Their shims.
    pub shims: ProcessMemory,
    /// The shims' CPU time, summed (ns).
    pub shims_cpu_ns: u64,
}

impl PodSample {
    /// Samples `pods` (each must have its cgroups and a shim: a pod not yet
    /// or no longer running is an error).
    pub fn take(pods: &[Pod]) -> Result<PodSample> {
        let memory_root = Path::new(CGROUP_FS).join("memory");
        let cpu_root = cpuacct_hierarchy();
        let running = shims();
        let mut out = PodSample::default();
        let mut shim_pids = Vec::new();
        let mut pids = Vec::new();
        for pod in pods {
            let what = format!("{}/{}", pod.namespace, pod.name);
            let memory = pod_cgroup(&memory_root, &pod.uid)
                .with_context(|| format!("the pod {what} has no memory cgroup"))?;
            let cpu = pod_cgroup(&cpu_root, &pod.uid)
                .with_context(|| format!("the pod {what} has no cpuacct cgroup"))?;
            out.cgroup_memory.add(&CgroupMemory::read(&memory)?);
            out.cgroup_cpu_ns += cgroup_cpu_ns(&cpu)?;
            pids.extend(cgroup_pids(&memory));
            let containers = child_cgroups(&memory);
            let shim: Vec<u32> = running
                .iter()
                .filter(|(_, id)| containers.contains(id))
                .map(|(pid, _)| *pid)
                .collect();
            if shim.is_empty() {
                bail!("the pod {what} has no {SHIM} (its containers: {containers:?})");
            }
            shim_pids.extend(shim);
            out.pods.push(what);
        }
        out.processes = ProcessMemory::of(&pids);
        out.shims = ProcessMemory::of(&shim_pids);
        out.shims_cpu_ns = shim_pids.iter().map(|p| process_cpu_ns(*p)).sum();
        Ok(out)
    }

    /// The CPU (ns) the pods' cgroups and shims used since `earlier` (a
    /// sample of the same pods): cgroups, shims.
    pub fn cpu_since(&self, earlier: &PodSample) -> Result<(u64, u64)> {
        if self.pods != earlier.pods {
            bail!(
                "the pods changed between the samples: {:?} then {:?}",
                earlier.pods,
                self.pods
            );
        }
        Ok((
            self.cgroup_cpu_ns.saturating_sub(earlier.cgroup_cpu_ns),
            self.shims_cpu_ns.saturating_sub(earlier.shims_cpu_ns),
        ))
    }
}

#[cfg(test)]
mod tests {

    /// Whatever a file holds, the parsers answer without panicking and
    /// their errors stay short.
    #[test]
    fn hostile_file_contents_neither_panic_nor_grow_the_errors() {
        let max = u64::MAX.to_string();
        let stat = format!("1 (a) S {}", vec![max.as_str(); 20].join(" "));
        assert_eq!(parse_cpu_ticks(&stat), None);
        assert_eq!(parse_cpu_ticks(")"), None);
        assert_eq!(parse_cpu_ticks(""), None);
        let long = "x".repeat(1 << 20);
        let err = CgroupMemory::parse(&long, "").unwrap_err().to_string();
        assert!(err.len() < 200, "{}", err.len());
        assert!(CgroupMemory::parse("1", &long).is_err());
        assert!(
            parse_memory_stat(&format!("{long}\n a b\n\n k 99999999999999999999999")).is_empty()
        );
        let mem = CgroupMemory::parse("5", "total_inactive_file 9\ntotal_rss 1\ntotal_cache 2\n")
            .unwrap();
        assert_eq!(mem.working_set, 0);
    }
    use super::*;

    #[test]
    fn pod_cgroups_are_found_below_the_nodes_root_whatever_their_qos_class() {
        let root = tempfile::tempdir().unwrap();
        let uid = "0f1e2d3c-aaaa-bbbb-cccc-123456789abc";
        let other = "11111111-aaaa-bbbb-cccc-123456789abc";
        let base = root.path().join(CGROUP_ROOT).join("kubepods");
        let pod = base.join(format!("besteffort/pod{uid}"));
        std::fs::create_dir_all(pod.join("sandbox1")).unwrap();
        std::fs::create_dir_all(pod.join("container2")).unwrap();
        std::fs::create_dir_all(base.join(format!("pod{other}"))).unwrap();
        assert_eq!(pod_cgroup(root.path(), uid), Some(pod.clone()));
        assert_eq!(
            pod_cgroup(root.path(), other),
            Some(base.join(format!("pod{other}")))
        );
        assert_eq!(pod_cgroup(root.path(), "22222222-0000"), None);
        assert_eq!(child_cgroups(&pod), ["container2", "sandbox1"]);
        // Outside the node's root: not the node's.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(elsewhere.path().join(format!("x/pod{uid}"))).unwrap();
        assert_eq!(pod_cgroup(elsewhere.path(), uid), None);
        // The systemd driver's names.
        let systemd = tempfile::tempdir().unwrap();
        let slice = systemd.path().join(CGROUP_ROOT).join(format!(
            "kubepods-burstable-pod{}.slice",
            uid.replace('-', "_")
        ));
        std::fs::create_dir_all(&slice).unwrap();
        assert_eq!(pod_cgroup(systemd.path(), uid), Some(slice));
    }

    #[test]
    fn cgroup_pids_holds_every_process_of_the_subtree_once() {
        let root = tempfile::tempdir().unwrap();
        let pod = root.path();
        std::fs::create_dir_all(pod.join("a/inner")).unwrap();
        std::fs::create_dir_all(pod.join("b")).unwrap();
        std::fs::write(pod.join("cgroup.procs"), "").unwrap();
        std::fs::write(pod.join("a/cgroup.procs"), "10\n11\n").unwrap();
        std::fs::write(pod.join("a/inner/cgroup.procs"), "12\n").unwrap();
        std::fs::write(pod.join("b/cgroup.procs"), "11\n5\n").unwrap();
        assert_eq!(cgroup_pids(pod), [5, 10, 11, 12]);
    }

    #[test]
    fn memory_is_read_as_kubelet_reads_it() {
        let stat = "cache 100\nrss 7\ntotal_cache 4096\ntotal_rss 8192\n\
                    total_inactive_file 1024\ntotal_active_file 3072\n";
        let memory = CgroupMemory::parse("13000\n", stat).unwrap();
        assert_eq!(
            memory,
            CgroupMemory {
                usage: 13000,
                working_set: 11976,
                rss: 8192,
                cache: 4096
            }
        );
        // A cgroup whose inactive file pages exceed the usage (the
        // counters are read at different times): no underflow.
        let memory = CgroupMemory::parse("10", stat).unwrap();
        assert_eq!(memory.working_set, 0);
        let err = CgroupMemory::parse("x", stat).unwrap_err().to_string();
        assert!(err.contains("memory.usage_in_bytes is no count"), "{err}");
        let err = CgroupMemory::parse("1", "total_rss 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("memory.stat has no total_inactive_file"),
            "{err}"
        );
    }

    #[test]
    fn shims_are_known_by_their_program_and_their_id() {
        let cmdline = |args: &[&str]| args.join("\0").into_bytes();
        assert_eq!(
            shim_id(&cmdline(&[
                "/var/cache/fnrun-tests/go/containerd/containerd-shim-runc-v2",
                "-namespace",
                "k8s.io",
                "-id",
                "abc123",
                "-address",
                "/tmp/x/containerd.sock",
                ""
            ])),
            Some("abc123".to_owned())
        );
        assert_eq!(shim_id(&cmdline(&[SHIM, "-id"])), None);
        assert_eq!(shim_id(&cmdline(&[SHIM, "-id", ""])), None);
        assert_eq!(shim_id(&cmdline(&["containerd", "-id", "abc"])), None);
        assert_eq!(shim_id(b""), None);
    }

    #[test]
    fn cpu_ticks_are_read_after_the_command_name() {
        let stat = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 2000 0 0 0 \
                    150 25 0 0 20 0 9 0 12345 1000000 500 18446744073709551615";
        assert_eq!(parse_cpu_ticks(stat), Some(175));
        assert_eq!(parse_cpu_ticks("1 (x) S 1"), None);
        assert_eq!(parse_cpu_ticks("garbage"), None);
        // This process has used some CPU, in whole ticks.
        assert!(clock_ticks() >= 1);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(parse_cpu_ticks(&own).is_some(), "{own}");
    }

    #[test]
    fn process_memory_sums_rss_and_pss() {
        let mut memory = ProcessMemory::default();
        memory.add_rollup("00400000-7ff [rollup]\nRss:  100 kB\nPss:  40 kB\nPss_Anon: 30 kB\n");
        memory.add_rollup("Rss: 10 kB\nPss: 10 kB\n");
        assert_eq!(
            memory,
            ProcessMemory {
                processes: 2,
                rss_kib: 110,
                pss_kib: 50
            }
        );
        // This process, read from /proc.
        let own = ProcessMemory::of(&[std::process::id()]);
        assert_eq!(own.processes, 1);
        assert!(own.rss_kib >= own.pss_kib && own.pss_kib > 0, "{own:?}");
    }

    #[test]
    fn pods_are_read_from_a_list_and_samples_refuse_other_pods() {
        let list = serde_json::json!({"items": [
            {"metadata": {"namespace": "crossplane-system", "name": "a", "uid": "u1"}},
            {"metadata": {"name": "no-namespace", "uid": "u2"}},
        ]});
        assert_eq!(
            Pod::from_list(&list),
            [Pod {
                namespace: "crossplane-system".into(),
                name: "a".into(),
                uid: "u1".into()
            }]
        );
        let one = PodSample {
            pods: vec!["ns/a".into()],
            cgroup_cpu_ns: 10,
            shims_cpu_ns: 3,
            ..PodSample::default()
        };
        let later = PodSample {
            cgroup_cpu_ns: 25,
            shims_cpu_ns: 4,
            ..one.clone()
        };
        assert_eq!(later.cpu_since(&one).unwrap(), (15, 1));
        let other = PodSample {
            pods: vec!["ns/b".into()],
            ..later
        };
        assert!(other.cpu_since(&one).is_err());
    }
}
