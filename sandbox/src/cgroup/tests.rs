//! The drivers on a fake cgroupfs in a temp dir, and hierarchy detection from
//! mountinfo texts. The real thing (v1 on this project's hosts) is exercised
//! by the sandbox tests.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::time::Duration;

use super::driver::cpu_quota_us;
use super::layout::{Hierarchy, Mount, unescape};
use super::names::pid_namespace;
use super::v2::{DAEMON_LEAF, V2};
use super::*;
use crate::spec::Limits;

/// A cgroup v2 filesystem in a temp dir, behaving like the kernel's where the
/// drivers rely on it: mkdir adds the interface files of the controllers the
/// parent enables, rmdir drops them but refuses a cgroup with processes or
/// children, `cgroup.subtree_control` takes `+c` commands (refused with EBUSY
/// in a non-root cgroup that has processes), `cgroup.procs` moves a pid and
/// `cgroup.kill` empties the cgroup. No real process is ever signalled.
#[derive(Debug)]
struct FakeV2 {
    root: PathBuf,
}

fn os_err(errno: i32) -> io::Error {
    io::Error::from_raw_os_error(errno)
}

impl FakeV2 {
    /// A root cgroup with `controllers` available.
    fn new(root: &Path, controllers: &str) -> Arc<FakeV2> {
        std::fs::create_dir_all(root).unwrap();
        std::fs::write(root.join("cgroup.controllers"), controllers).unwrap();
        std::fs::write(root.join("cgroup.subtree_control"), "").unwrap();
        std::fs::write(root.join("cgroup.procs"), "").unwrap();
        Arc::new(FakeV2 {
            root: root.to_owned(),
        })
    }

    fn file(&self, path: &Path) -> String {
        std::fs::read_to_string(path).unwrap()
    }

    fn all_procs(&self, dir: &Path, out: &mut Vec<PathBuf>) {
        out.push(dir.join("cgroup.procs"));
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                self.all_procs(&e.path(), out);
            }
        }
    }
}

impl CgroupFs for FakeV2 {
    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn write(&self, path: &Path, value: &str) -> io::Result<()> {
        if !path.is_file() {
            return Err(os_err(libc::ENOENT));
        }
        let dir = path.parent().unwrap();
        match path.file_name().unwrap().to_str().unwrap() {
            "cgroup.subtree_control" => {
                if dir != self.root && !self.file(&dir.join("cgroup.procs")).trim().is_empty() {
                    return Err(os_err(libc::EBUSY));
                }
                let available = self.file(&dir.join("cgroup.controllers"));
                let mut enabled: Vec<String> = self
                    .file(path)
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect();
                for token in value.split_whitespace() {
                    let (op, c) = token.split_at(1);
                    if !available.split_whitespace().any(|a| a == c) {
                        return Err(os_err(libc::ENOENT));
                    }
                    match op {
                        "+" if !enabled.iter().any(|e| e == c) => enabled.push(c.to_owned()),
                        "-" => enabled.retain(|e| e != c),
                        "+" => {}
                        _ => return Err(os_err(libc::EINVAL)),
                    }
                }
                std::fs::write(path, enabled.join(" "))
            }
            "cgroup.procs" => {
                let pid = value.trim();
                let mut files = Vec::new();
                self.all_procs(&self.root, &mut files);
                for f in files {
                    let kept: Vec<String> = self
                        .file(&f)
                        .lines()
                        .filter(|l| *l != pid)
                        .map(|l| format!("{l}\n"))
                        .collect();
                    std::fs::write(&f, kept.concat())?;
                }
                let mut procs = self.file(path);
                procs.push_str(&format!("{pid}\n"));
                std::fs::write(path, procs)
            }
            "cgroup.kill" => {
                std::fs::write(dir.join("cgroup.procs"), "")?;
                std::fs::write(path, format!("killed {value}"))
            }
            _ => std::fs::write(path, value),
        }
    }

    fn mkdir(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir(path)?;
        let enabled = self.file(&path.parent().unwrap().join("cgroup.subtree_control"));
        let mut files = vec![
            ("cgroup.controllers", enabled.clone()),
            ("cgroup.subtree_control", String::new()),
            ("cgroup.procs", String::new()),
            ("cgroup.events", "populated 0\nfrozen 0\n".to_owned()),
            ("cgroup.kill", String::new()),
            ("cgroup.freeze", "0\n".to_owned()),
            (
                "cpu.stat",
                "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n".to_owned(),
            ),
        ];
        for c in enabled.split_whitespace() {
            match c {
                "memory" => files.extend([
                    ("memory.max", "max\n".to_owned()),
                    ("memory.swap.max", "max\n".to_owned()),
                    ("memory.peak", "0\n".to_owned()),
                    (
                        "memory.events",
                        "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\noom_group_kill 0\n".to_owned(),
                    ),
                ]),
                "cpu" => files.push(("cpu.max", "max 100000\n".to_owned())),
                "pids" => files.push(("pids.max", "max\n".to_owned())),
                _ => {}
            }
        }
        for (name, content) in files {
            std::fs::write(path.join(name), content)?;
        }
        Ok(())
    }

    fn rmdir(&self, path: &Path) -> io::Result<()> {
        if !path.is_dir() {
            return Err(os_err(libc::ENOENT));
        }
        if !self.file(&path.join("cgroup.procs")).trim().is_empty() {
            return Err(os_err(libc::EBUSY));
        }
        for e in std::fs::read_dir(path)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                return Err(os_err(libc::EBUSY));
            }
        }
        std::fs::remove_dir_all(path)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn children(&self, path: &Path) -> io::Result<Vec<String>> {
        HostFs.children(path)
    }
}

fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path).unwrap()
}

/// A delegated subtree as systemd (Delegate=yes) or a pod gives it: the
/// daemon's own cgroup, with the daemon in it and every controller available.
fn delegated(tmp: &Path) -> (Arc<FakeV2>, PathBuf) {
    let fs = FakeV2::new(tmp, "cpuset cpu io memory hugetlb pids rdma misc");
    fs.write(
        &tmp.join("cgroup.subtree_control"),
        "+cpu +memory +pids +io",
    )
    .unwrap();
    let own = tmp.join("system.slice");
    fs.mkdir(&own).unwrap();
    fs.write(&own.join("cgroup.subtree_control"), "+cpu +memory +pids")
        .unwrap();
    let own = own.join("fnrun.service");
    fs.mkdir(&own).unwrap();
    fs.write(&own.join("cgroup.procs"), &std::process::id().to_string())
        .unwrap();
    (fs, own)
}

#[test]
fn v2_enables_controllers_down_to_the_parent_moving_the_daemon_out_of_the_way() {
    let tmp = tempfile::tempdir().unwrap();
    let (fs, own) = delegated(tmp.path());
    let parent = own.join("fnrun");
    let driver = V2::new(fs.clone(), tmp.path(), &own, &parent).unwrap();

    assert_eq!(driver.version(), Version::V2);
    assert_eq!(
        driver.controllers(),
        &Controllers {
            memory: Ok(()),
            cpu: Ok(()),
            pids: Ok(()),
        }
    );
    // The daemon left its own cgroup for a leaf, so that the own cgroup may
    // enable controllers for its children (v2's "no internal processes").
    assert_eq!(read(own.join("cgroup.procs")), "");
    assert_eq!(
        read(own.join(DAEMON_LEAF).join("cgroup.procs")),
        format!("{}\n", std::process::id())
    );
    assert_eq!(read(own.join("cgroup.subtree_control")), "memory cpu pids");
    assert_eq!(
        read(parent.join("cgroup.subtree_control")),
        "memory cpu pids"
    );
    assert_eq!(driver.parents(), vec![parent]);
}

#[test]
fn v2_creates_a_run_with_its_limits_then_removes_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (fs, own) = delegated(tmp.path());
    let parent = own.join("fnrun");
    let driver = V2::new(fs.clone(), tmp.path(), &own, &parent).unwrap();
    let limits = Limits {
        memory_bytes: Some(64 << 20),
        cpu_millis: Some(250),
        pids: Some(100),
    };
    let mut run = driver.create("123-456-0-7", &limits).unwrap();
    let dir = parent.join("123-456-0-7");
    assert_eq!(run.dirs(), vec![dir.clone()]);
    assert_eq!(read(dir.join("memory.max")), "67108864");
    assert_eq!(read(dir.join("memory.swap.max")), "0");
    assert_eq!(read(dir.join("cpu.max")), "25000 100000");
    assert_eq!(read(dir.join("pids.max")), "100");
    // v2 places init with CLONE_INTO_CGROUP, through a descriptor of the dir.
    assert!(matches!(run.placement().unwrap(), Placement::CloneInto(_)));

    run.admit(4242, false).unwrap();
    assert_eq!(read(dir.join("cgroup.procs")), "4242\n");

    std::fs::write(
        dir.join("memory.events"),
        "low 0\nhigh 0\nmax 17\noom 1\noom_kill 1\noom_group_kill 0\n",
    )
    .unwrap();
    std::fs::write(dir.join("memory.peak"), "67100000\n").unwrap();
    assert_eq!(
        run.usage(),
        Usage {
            oom_kills: Some(1),
            hit_memory_limit: true,
            peak_memory_bytes: Some(67_100_000),
            cpu_time: Some(Duration::from_millis(1500)),
        }
    );

    // A process is still there: removal kills it through cgroup.kill, then
    // the rmdir succeeds.
    run.remove().unwrap();
    assert!(!dir.exists());
    run.remove().unwrap();
    drop(run);
    assert_eq!(fs.children(&parent).unwrap(), Vec::<String>::new());
}

#[test]
fn v2_run_without_limits_only_gets_accounting() {
    let tmp = tempfile::tempdir().unwrap();
    let (fs, own) = delegated(tmp.path());
    let parent = own.join("fnrun");
    let driver = V2::new(fs, tmp.path(), &own, &parent).unwrap();
    let run = driver.create("1-2-3-4", &Limits::default()).unwrap();
    let dir = parent.join("1-2-3-4");
    assert_eq!(read(dir.join("memory.max")), "max\n");
    assert_eq!(read(dir.join("pids.max")), "max\n");
    drop(run);
    assert!(!dir.exists(), "dropping a run cgroup removes it");
}

#[test]
fn v2_at_the_top_of_the_hierarchy_needs_no_move() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FakeV2::new(tmp.path(), "cpu memory pids");
    std::fs::write(tmp.path().join("cgroup.procs"), "1\n2\n").unwrap();
    let parent = tmp.path().join("fnrun");
    let driver = V2::new(fs, tmp.path(), tmp.path(), &parent).unwrap();
    assert!(driver.controllers().memory.is_ok());
    assert_eq!(
        read(tmp.path().join("cgroup.subtree_control")),
        "memory cpu pids"
    );
    assert!(!tmp.path().join(DAEMON_LEAF).exists());
}

#[test]
fn v2_reports_a_missing_controller_and_refuses_to_limit_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FakeV2::new(tmp.path(), "cpu pids");
    let parent = tmp.path().join("fnrun");
    let driver = V2::new(fs.clone(), tmp.path(), tmp.path(), &parent).unwrap();
    let why = driver.controllers().memory.clone().unwrap_err();
    assert!(why.contains("memory controller is not available"), "{why}");
    assert!(driver.controllers().cpu.is_ok());

    let err = driver
        .create(
            "1-2-3-4",
            &Limits {
                memory_bytes: Some(1 << 20),
                ..Limits::default()
            },
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("memory.max"), "{err}");
    // Nothing is left of the failed run.
    assert_eq!(fs.children(&parent).unwrap(), Vec::<String>::new());
}

#[test]
fn v2_sweep_removes_stale_runs_only() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FakeV2::new(tmp.path(), "cpu memory pids");
    let parent = tmp.path().join("fnrun");
    let driver = V2::new(fs.clone(), tmp.path(), tmp.path(), &parent).unwrap();
    let mut stale = driver.create("1-1-0-0", &Limits::default()).unwrap();
    stale.admit(777, false).unwrap();
    // A crashed daemon never removes its runs.
    std::mem::forget(stale);
    let live = driver.create("2-2-0-0", &Limits::default()).unwrap();

    let removed = driver.sweep(&|name| name.starts_with("1-")).unwrap();
    assert_eq!(removed, 1);
    assert_eq!(fs.children(&parent).unwrap(), vec!["2-2-0-0".to_owned()]);
    drop(live);
    assert_eq!(fs.children(&parent).unwrap(), Vec::<String>::new());
}

#[test]
fn detect_builds_a_v2_driver_from_files() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys/fs/cgroup");
    let (fs, _) = delegated(&root);
    let mountinfo = tmp.path().join("mountinfo");
    let self_cgroup = tmp.path().join("cgroup");
    std::fs::write(
        &mountinfo,
        format!(
            "24 30 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:13 - proc proc rw\n\
             35 23 0:30 / {} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n",
            root.display()
        ),
    )
    .unwrap();
    std::fs::write(&self_cgroup, "0::/system.slice/fnrun.service\n").unwrap();
    let config = CgroupConfig {
        enabled: true,
        mountinfo,
        self_cgroup,
        root: root.clone(),
        base: CgroupBase::Auto,
        parent: "fnrun".into(),
        pool: true,
    };
    let driver = detect(&config, fs).unwrap();
    assert_eq!(driver.version(), Version::V2);
    assert_eq!(
        driver.parents(),
        vec![root.join("system.slice/fnrun.service/fnrun")]
    );
}

/// This project's test hosts: v1 controllers, an empty v2 hierarchy.
const HYBRID_MOUNTINFO: &str = "\
23 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime - sysfs sysfs rw
31 23 0:28 / ROOT rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / ROOT/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / ROOT/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / ROOT/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / ROOT/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / ROOT/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / ROOT/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / ROOT/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / ROOT/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / ROOT/unified rw,relatime - cgroup2 cgroup2 rw
";

const HYBRID_SELF: &str = "\
9:name=systemd:/
8:pids:/
6:freezer:/
5:devices:/
4:memory:/process_api/abc
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
";

#[test]
fn detects_v1_on_a_hybrid_host() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let fs = FakeV2::new(&root.join("unified"), "");
    let mountinfo = HYBRID_MOUNTINFO.replace("ROOT", root.to_str().unwrap());
    let Layout::V1(hierarchies) = layout(&mountinfo, HYBRID_SELF, root, fs.as_ref()).unwrap()
    else {
        panic!("not v1");
    };
    let found: Vec<(Vec<String>, PathBuf)> = hierarchies
        .into_iter()
        .map(|h| (h.controllers, h.own))
        .collect();
    let h = |c: &str, own: &str| (vec![c.to_owned()], root.join(own));
    assert_eq!(
        found,
        vec![
            h("cpu", "cpu"),
            h("cpuacct", "cpuacct"),
            h("memory", "memory/process_api/abc"),
            h("freezer", "freezer"),
            h("pids", "pids"),
        ]
    );
}

#[test]
fn detects_co_mounted_v1_controllers_once() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let fs = FakeV2::new(&root.join("unified"), "");
    let mountinfo = format!(
        "32 31 0:29 / {r}/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n\
         35 31 0:32 / {r}/memory rw,relatime - cgroup cgroup rw,memory\n",
        r = root.display()
    );
    let self_cgroup = "3:cpu,cpuacct:/a\n2:memory:/b\n";
    let layout = layout(&mountinfo, self_cgroup, root, fs.as_ref()).unwrap();
    assert_eq!(
        layout,
        Layout::V1(vec![
            Hierarchy {
                controllers: vec!["cpu".into(), "cpuacct".into()],
                mount: root.join("cpu,cpuacct"),
                own: root.join("cpu,cpuacct/a"),
            },
            Hierarchy {
                controllers: vec!["memory".into()],
                mount: root.join("memory"),
                own: root.join("memory/b"),
            },
        ])
    );
}

#[test]
fn detects_v2_on_a_pure_v2_host() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let fs = FakeV2::new(root, "cpuset cpu io memory hugetlb pids rdma misc");
    let mountinfo = format!(
        "35 23 0:30 / {} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n",
        root.display()
    );
    let layout = layout(
        &mountinfo,
        "0::/kubepods.slice/pod1/c1\n",
        root,
        fs.as_ref(),
    )
    .unwrap();
    assert_eq!(
        layout,
        Layout::V2(Hierarchy {
            controllers: vec![],
            mount: root.to_owned(),
            own: root.join("kubepods.slice/pod1/c1"),
        })
    );
}

#[test]
fn own_cgroup_of_a_bind_mounted_subtree_is_its_mount_point() {
    // A container that sees only its own cgroup, bind-mounted at the root,
    // without a cgroup namespace: /proc/self/cgroup has the full path.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let fs = FakeV2::new(root, "cpu memory pids");
    let mountinfo = format!(
        "35 23 0:30 /kubepods/pod1/c1 {} rw - cgroup2 cgroup2 rw\n",
        root.display()
    );
    let Layout::V2(h) = layout(&mountinfo, "0::/kubepods/pod1/c1\n", root, fs.as_ref()).unwrap()
    else {
        panic!("not v2");
    };
    assert_eq!(h.own, root);
}

#[test]
fn no_cgroup_mounted_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let fs = FakeV2::new(tmp.path(), "");
    let err = layout(
        "24 30 0:22 / /proc rw - proc proc rw\n",
        "0::/\n",
        tmp.path(),
        fs.as_ref(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("no cgroup filesystem is mounted"), "{err}");
    // An empty unified hierarchy and no v1 one: nothing to limit with.
    let mountinfo = format!(
        "41 31 0:38 / {}/unified rw - cgroup2 cgroup2 rw\n",
        tmp.path().display()
    );
    std::fs::create_dir(tmp.path().join("unified")).unwrap();
    std::fs::write(tmp.path().join("unified/cgroup.controllers"), "").unwrap();
    let err = layout(&mountinfo, "0::/\n", tmp.path(), fs.as_ref())
        .unwrap_err()
        .to_string();
    assert!(err.contains("none of the memory, cpu and pids"), "{err}");
}

#[test]
fn parent_is_a_relative_path_below_the_base() {
    let base = Path::new("/sys/fs/cgroup/system.slice/x.service");
    assert_eq!(
        parent_dir(base, Path::new("fnrun/runs")).unwrap(),
        base.join("fnrun/runs")
    );
    for bad in ["", "/fnrun", "../escape", "a/../b", "./a"] {
        assert!(parent_dir(base, Path::new(bad)).is_err(), "{bad}");
    }
}

#[test]
fn detect_puts_v1_runs_below_the_own_cgroup_unless_told_otherwise() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    FakeV2::new(&root.join("unified"), "");
    for c in [
        "cpu",
        "cpuacct",
        "memory/process_api/abc",
        "freezer",
        "pids",
    ] {
        std::fs::create_dir_all(root.join(c)).unwrap();
    }
    let mountinfo = tmp.path().join("mountinfo");
    let self_cgroup = tmp.path().join("cgroup");
    std::fs::write(
        &mountinfo,
        HYBRID_MOUNTINFO.replace("ROOT", root.to_str().unwrap()),
    )
    .unwrap();
    std::fs::write(&self_cgroup, HYBRID_SELF).unwrap();
    let mut config = CgroupConfig {
        enabled: true,
        mountinfo,
        self_cgroup,
        root: root.to_owned(),
        base: CgroupBase::Auto,
        parent: "fnrun".into(),
        pool: true,
    };
    // Plain directories stand in for the v1 hierarchies here.
    let fs: Arc<dyn CgroupFs> = Arc::new(HostFs);
    // By default below this process's own cgroup in each hierarchy (its
    // memory cgroup is /process_api/abc, the others the top), so that the
    // limits of the daemon's own cgroup bound its runs.
    let driver = detect(&config, fs.clone()).unwrap();
    assert_eq!(driver.version(), Version::V1);
    assert!(
        driver
            .parents()
            .contains(&root.join("memory/process_api/abc/fnrun"))
    );
    assert!(driver.parents().contains(&root.join("pids/fnrun")));
    config.base = CgroupBase::Own;
    let driver = detect(&config, fs.clone()).unwrap();
    assert!(
        driver
            .parents()
            .contains(&root.join("memory/process_api/abc/fnrun"))
    );
    assert!(driver.parents().contains(&root.join("pids/fnrun")));
    config.base = CgroupBase::Top;
    let driver = detect(&config, fs.clone()).unwrap();
    assert!(driver.parents().contains(&root.join("memory/fnrun")));
    // Where no cgroup can be made below the own one, the top of that
    // hierarchy (here the own "cgroup" is a plain file).
    config.base = CgroupBase::Auto;
    let own = root.join("memory/process_api/abc");
    std::fs::remove_dir_all(&own).unwrap();
    std::fs::write(&own, "").unwrap();
    let driver = detect(&config, fs.clone()).unwrap();
    assert!(driver.parents().contains(&root.join("memory/fnrun")));
    config.base = CgroupBase::Own;
    assert!(detect(&config, fs).is_ok_and(|d| !d.parents().contains(&own.join("fnrun"))));
}

#[test]
fn mountinfo_escapes_are_undone() {
    assert_eq!(unescape(r"/a\040b\011c\134d\x"), "/a b\tc\\d\\x");
    let m = Mount::parse("1 2 0:3 / /mnt/with\\040space rw - cgroup2 none rw").unwrap();
    assert_eq!(m.mount_point, Path::new("/mnt/with space"));
}

#[test]
fn only_runs_of_dead_daemons_are_stale() {
    let names = RunNames::new();
    let mine = names.run(3);
    assert!(names.is_mine(&mine));
    assert!(!is_stale(&mine), "this process is alive");
    let ns = pid_namespace();
    let pid = std::process::id();
    assert!(
        is_stale(&format!("{ns}-{pid}-1-0-0")),
        "same pid, another start"
    );
    assert!(is_stale(&format!("{ns}-4194304999-5-0-0")), "no such pid");
    assert!(
        !is_stale(&format!("{}-4194304999-5-0-0", ns + 1)),
        "another PID namespace: cannot tell"
    );
    for foreign in [
        "fnrun-daemon",
        "x-1-2-3-4",
        "1-2-3-4",
        "1-2-3-4-5-6",
        "1-2-3-a-4",
    ] {
        assert!(!is_stale(foreign), "{foreign} is not ours");
    }
    assert!(!RunNames::new().is_mine(&mine), "another sandbox's run");
}

#[test]
fn cpu_quota_is_millicores_of_a_100ms_period() {
    assert_eq!(cpu_quota_us(1000), 100_000);
    assert_eq!(cpu_quota_us(100), 10_000);
    assert_eq!(cpu_quota_us(2500), 250_000);
    assert_eq!(cpu_quota_us(1), 1000, "the kernel's minimum");
}

#[test]
fn an_open_interface_file_is_read_whole_from_its_start_each_time() {
    use super::driver::read_whole;
    use std::io::Write;
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("file");
    for len in [0, 1, 511, 512, 513, 1300] {
        let text: String = ('a'..='z').cycle().take(len).collect();
        std::fs::write(&path, &text).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        assert_eq!(read_whole(&file).unwrap(), text, "{len} bytes");
        // Again from the start, with what the file holds then.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"\nmore")
            .unwrap();
        assert_eq!(
            read_whole(&file).unwrap(),
            text + "\nmore",
            "{len} bytes, again"
        );
    }
    // A cgroupfs file longer than one read, where the host has one: the
    // same keys as a plain read gives.
    let Ok(file) = std::fs::File::open("/sys/fs/cgroup/memory/memory.stat") else {
        return;
    };
    let keys = |text: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect()
    };
    let whole = read_whole(&file).unwrap();
    assert!(whole.len() > 512, "{whole}");
    assert_eq!(
        keys(&whole),
        keys(&std::fs::read_to_string("/sys/fs/cgroup/memory/memory.stat").unwrap())
    );
    assert_eq!(keys(&read_whole(&file).unwrap()), keys(&whole));
}

/// cgroup v1's pool of run cgroups: a slot its run left charged with more
/// than `MAX_CARRIED_BYTES` (page cache, dentries) is removed, not reused;
/// a run with a memory limit takes an idle slot only when the slot's charge
/// is below half that limit, else a fresh one (v1 refuses, EBUSY, a limit
/// below a charge it cannot reclaim).
#[test]
fn v1_never_hands_a_memory_limit_a_slot_left_charged() {
    let tmp = tempfile::tempdir().unwrap();
    let memory = tmp.path().join("memory");
    let fs = FakeV2::new(&memory, "");
    let home = memory.join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(home.join("tasks"), "").unwrap();
    let parent = memory.join("fnrun");
    let driver = v1::V1::new(
        fs,
        vec![v1::Hierarchy {
            controllers: vec!["memory".to_owned()],
            parent: parent.clone(),
            fallback: None,
            own: home,
        }],
        true,
    )
    .unwrap();
    // What the kernel would show once the run's processes are gone.
    let charge = |run: &dyn RunCgroup, bytes: u64| {
        for dir in run.dirs() {
            for file in ["memory.usage_in_bytes", "memory.max_usage_in_bytes"] {
                std::fs::write(dir.join(file), format!("{bytes}\n")).unwrap();
            }
        }
    };
    let mib = 1u64 << 20;
    let no_limits = Limits::default();
    let limited = |bytes| Limits {
        memory_bytes: Some(bytes),
        ..Limits::default()
    };

    // Charged with 100 MiB: removed when its run ends.
    let mut a = driver.create("a", &no_limits).unwrap();
    charge(a.as_ref(), 100 * mib);
    a.remove().unwrap();
    assert!(!parent.join("a").exists());

    // 3 MiB: kept for the next run ...
    let mut b = driver.create("b", &no_limits).unwrap();
    charge(b.as_ref(), 3 * mib);
    b.remove().unwrap();
    assert!(parent.join("b").exists());
    // ... but not for one limited to 4 MiB: that gets a fresh cgroup, and
    // the charged one goes.
    let mut c = driver.create("c", &limited(4 * mib)).unwrap();
    assert_eq!(c.dirs(), vec![parent.join("c")]);
    assert!(!parent.join("b").exists());
    charge(c.as_ref(), mib);
    c.remove().unwrap();
    // A slot charged with 1 MiB takes a limit of 64 MiB.
    let d = driver.create("d", &limited(64 * mib)).unwrap();
    assert_eq!(d.dirs(), vec![parent.join("c")]);
}

/// A container in a user namespace of its own with a writable cgroupfs and a
/// cgroup namespace, as containerd's `cgroup_writable` runtime option and
/// runc make it on a cgroup v2 node: `/sys/fs/cgroup` shows the container's
/// own cgroup as its root (which runc handed to the container's root), with
/// the daemon in it. Unlike the host's root cgroup it has a `cgroup.type`
/// and is bound by "no internal processes".
#[test]
fn v2_at_the_root_of_a_cgroup_namespace_moves_the_daemon_into_a_leaf() {
    let tmp = tempfile::tempdir().unwrap();
    // The fake's root stands for the host's, which the container never sees.
    let host = tmp.path().join("host");
    let fs = FakeV2::new(&host, "cpu memory pids");
    let own = host.join("kubepods/pod1/ctr");
    std::fs::create_dir_all(&own).unwrap();
    for (name, content) in [
        ("cgroup.controllers", "cpu memory pids".to_owned()),
        ("cgroup.type", "domain\n".to_owned()),
        ("cgroup.subtree_control", String::new()),
        ("cgroup.procs", format!("{}\n", std::process::id())),
    ] {
        std::fs::write(own.join(name), content).unwrap();
    }
    for dir in [host.join("kubepods"), host.join("kubepods/pod1")] {
        std::fs::write(dir.join("cgroup.procs"), "").unwrap();
    }
    let mountinfo = tmp.path().join("mountinfo");
    std::fs::write(
        &mountinfo,
        format!(
            "35 23 0:30 / {} rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n",
            own.display()
        ),
    )
    .unwrap();
    let self_cgroup = tmp.path().join("cgroup");
    std::fs::write(&self_cgroup, "0::/\n").unwrap();
    let config = CgroupConfig {
        enabled: true,
        mountinfo,
        self_cgroup,
        root: own.clone(),
        base: CgroupBase::Auto,
        parent: "fnrun".into(),
        pool: true,
    };
    let driver = detect(&config, fs).unwrap();
    assert_eq!(
        driver.controllers(),
        &Controllers {
            memory: Ok(()),
            cpu: Ok(()),
            pids: Ok(()),
        }
    );
    assert_eq!(driver.parents(), vec![own.join("fnrun")]);
    assert_eq!(read(own.join("cgroup.procs")), "");
    assert_eq!(
        read(own.join(DAEMON_LEAF).join("cgroup.procs")),
        format!("{}\n", std::process::id())
    );
    let limits = Limits {
        memory_bytes: Some(64 << 20),
        ..Limits::default()
    };
    let run = driver.create("1-2-3-4", &limits).unwrap();
    assert_eq!(read(own.join("fnrun/1-2-3-4/memory.max")), "67108864");
    drop(run);
}
