use std::os::unix::process::CommandExt;
use std::process::Command;

use std::collections::BTreeSet;

use super::*;
use crate::profile::ARCHES;

/// Set in the environment of the re-executed test binary that runs
/// [`probe_under_filter`] with the default program installed.
const PROBE_ENV: &str = "FNRUN_SECCOMP_PROBE";

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
#[cfg(target_arch = "riscv64")]
const AUDIT_ARCH: u32 = 0xC000_00F3;

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;

/// A classic BPF interpreter for the instructions seccompiler emits, run on a
/// `seccomp_data` (nr, arch, ip, args).
fn evaluate(program: &[sock_filter], arch: u32, nr: libc::c_long, args: [u64; 6]) -> u32 {
    let mut data = Vec::with_capacity(64);
    data.extend(
        u32::try_from(nr)
            .expect("syscall numbers fit in 32 bits")
            .to_ne_bytes(),
    );
    data.extend(arch.to_ne_bytes());
    data.extend(0u64.to_ne_bytes());
    for a in args {
        data.extend(a.to_ne_bytes());
    }
    let mut acc: u32 = 0;
    let mut pc = 0usize;
    loop {
        let ins = &program[pc];
        let k = ins.k;
        let jump = |cond: bool| usize::from(if cond { ins.jt } else { ins.jf });
        pc += 1;
        match ins.code {
            // BPF_LD | BPF_W | BPF_ABS
            0x20 => {
                let at = k as usize;
                acc = u32::from_ne_bytes(data[at..at + 4].try_into().unwrap());
            }
            // BPF_ALU | BPF_AND | BPF_K
            0x54 => acc &= k,
            // BPF_JMP | BPF_JA
            0x05 => pc += k as usize,
            // BPF_JMP | BPF_JEQ / JGT / JGE / JSET | BPF_K
            0x15 => pc += jump(acc == k),
            0x25 => pc += jump(acc > k),
            0x35 => pc += jump(acc >= k),
            0x45 => pc += jump(acc & k != 0),
            // BPF_RET | BPF_K
            0x06 => return k,
            code => panic!("unexpected BPF instruction {code:#x} at {}", pc - 1),
        }
    }
}

fn call(program: &[sock_filter], nr: libc::c_long, arg0: u64) -> u32 {
    evaluate(program, AUDIT_ARCH, nr, [arg0, 0, 0, 0, 0, 0])
}

#[test]
fn default_profile_parses_and_compiles_for_every_architecture() {
    let profile = Profile::default_profile().unwrap();
    assert_eq!(profile.default_action, Action::Errno(1));
    for arch in ARCHES {
        let program = profile
            .compile_for(arch)
            .unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(
            program.len() < MAX_INSTRUCTIONS,
            "{arch}: {}",
            program.len()
        );
    }
    assert!(default_program().unwrap().len() > 100);
    // Every group says why.
    for group in &profile.syscalls {
        assert!(group.comment.is_some(), "{:?} has no comment", group.names);
    }
}

#[test]
fn denied_calls_are_not_in_the_allow_list() {
    let profile = Profile::default_profile().unwrap();
    let denied = profile.denied_names();
    for name in ALWAYS_DENIED {
        assert!(denied.contains(name), "{name} missing from the denied list");
    }
    for arch in ARCHES {
        let allowed = profile.allowed_names(arch);
        for name in &denied {
            assert!(!allowed.contains(name), "{name} is allowed on {arch}");
        }
        // Nothing on the denied list has any other action either.
        for group in profile.syscalls.iter().filter(|g| g.applies_to(arch)) {
            for name in &group.names {
                assert!(!denied.contains(name.as_str()), "{name} has a rule");
            }
        }
    }
}

#[test]
fn program_returns_the_expected_actions() {
    let program = default_program().unwrap();
    let eperm = RET_ERRNO | 1;
    let enosys = RET_ERRNO | 38;
    for nr in [
        libc::SYS_read,
        libc::SYS_write,
        libc::SYS_getpid,
        libc::SYS_execve,
        libc::SYS_futex,
        libc::SYS_exit_group,
    ] {
        assert_eq!(call(&program, nr, 0), RET_ALLOW, "syscall {nr}");
    }
    for nr in [
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_ptrace,
        libc::SYS_bpf,
        libc::SYS_keyctl,
        libc::SYS_perf_event_open,
        libc::SYS_init_module,
        libc::SYS_reboot,
        libc::SYS_clock_settime,
        libc::SYS_io_uring_setup,
        libc::SYS_fsopen,
        libc::SYS_open_tree,
        libc::SYS_pivot_root,
    ] {
        assert_eq!(call(&program, nr, 0), eperm, "syscall {nr}");
    }
    // An unknown number, past every syscall table.
    assert_eq!(call(&program, 4000, 0), eperm);
    assert_eq!(call(&program, libc::SYS_clone3, 0), enosys);
    // clone: threads and forks yes, namespaces no.
    let thread = (libc::CLONE_VM
        | libc::CLONE_FS
        | libc::CLONE_FILES
        | libc::CLONE_SIGHAND
        | libc::CLONE_THREAD
        | libc::CLONE_SYSVSEM
        | libc::CLONE_SETTLS
        | libc::CLONE_PARENT_SETTID
        | libc::CLONE_CHILD_CLEARTID) as u64;
    assert_eq!(call(&program, libc::SYS_clone, thread), RET_ALLOW);
    assert_eq!(
        call(&program, libc::SYS_clone, libc::SIGCHLD as u64),
        RET_ALLOW
    );
    for ns in [
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWNS,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWCGROUP,
    ] {
        let flags = u64::try_from(ns | libc::SIGCHLD).expect("clone flags are positive");
        assert_eq!(call(&program, libc::SYS_clone, flags), eperm, "{ns:#x}");
    }
    // socket: not AF_VSOCK.
    assert_eq!(
        call(&program, libc::SYS_socket, libc::AF_INET as u64),
        RET_ALLOW
    );
    assert_eq!(
        call(&program, libc::SYS_socket, libc::AF_VSOCK as u64),
        eperm
    );
    // personality: query yes, turning off ASLR no.
    assert_eq!(
        call(&program, libc::SYS_personality, 0xffff_ffff),
        RET_ALLOW
    );
    assert_eq!(
        call(
            &program,
            libc::SYS_personality,
            libc::ADDR_NO_RANDOMIZE as u64
        ),
        eperm
    );
    // Another architecture's calls kill the process.
    assert_eq!(
        evaluate(&program, 0x4000_0003, libc::SYS_read, [0; 6]),
        RET_KILL_PROCESS
    );
}

/// Every operator and width, several actions, alternatives, and a call with both
/// an unconditional and a conditional rule.
const EVERY_FEATURE: &str = r#"{
    "default_action": { "errno": "EPERM" },
    "syscalls": [
        { "action": "allow", "names": ["read", "write", "getpid", "execve", "exit_group"] },
        { "action": { "errno": "ENOSYS" }, "names": ["clone3"] },
        { "action": "trap", "names": ["kill"] },
        { "action": "log", "names": ["tkill"] },
        { "action": "kill_thread", "names": ["tgkill"] },
        { "action": "kill_process", "names": ["getppid"] },
        { "action": "allow", "names": ["socket"], "args": [{ "index": 0, "type": "dword", "op": "ne", "val": 40 }] },
        { "action": "allow", "names": ["personality"], "args": [{ "index": 0, "type": "dword", "op": "eq", "val": 0 }] },
        { "action": "allow", "names": ["personality"], "args": [{ "index": 0, "type": "dword", "op": "eq", "val": 8 }] },
        { "action": "allow", "names": ["clone"], "args": [{ "index": 0, "type": "dword", "op": { "masked_eq": 2114060288 }, "val": 0 }] },
        { "action": "allow", "names": ["mprotect"], "args": [
            { "index": 1, "type": "dword", "op": "lt", "val": 4096 },
            { "index": 2, "type": "dword", "op": "ge", "val": 1 }] },
        { "action": "allow", "names": ["madvise"], "args": [
            { "index": 2, "type": "dword", "op": "le", "val": 4 },
            { "index": 1, "type": "dword", "op": "gt", "val": 7 }] },
        { "action": "allow", "names": ["lseek"], "args": [{ "index": 1, "type": "qword", "op": "eq", "val": 4294967298 }] },
        { "action": "allow", "names": ["pread64"], "args": [{ "index": 3, "type": "qword", "op": "ne", "val": 4294967298 }] },
        { "action": "allow", "names": ["pwrite64"], "args": [{ "index": 3, "type": "qword", "op": "lt", "val": 8589934593 }] },
        { "action": "allow", "names": ["readv"], "args": [{ "index": 2, "type": "qword", "op": "le", "val": 8589934593 }] },
        { "action": "allow", "names": ["writev"], "args": [{ "index": 2, "type": "qword", "op": "gt", "val": 8589934593 }] },
        { "action": "allow", "names": ["fcntl"], "args": [{ "index": 1, "type": "qword", "op": "ge", "val": 8589934593 }] },
        { "action": "allow", "names": ["ioctl"], "args": [{ "index": 1, "type": "qword", "op": { "masked_eq": 1099511627775 }, "val": 1095216660735 }] },
        { "action": "allow", "names": ["ioctl"], "args": [{ "index": 5, "type": "qword", "op": "eq", "val": 18446744073709551615 }] },
        { "action": "allow", "names": ["fstat"], "args": [{ "index": 0, "type": "dword", "op": "eq", "val": 3 }] },
        { "action": "allow", "names": ["fstat"] }
    ]
}"#;

/// Argument values around every condition of `profile`.
fn interesting_values(profile: &Profile) -> Vec<u64> {
    let mut values = vec![
        0,
        1,
        u64::MAX,
        1 << 32,
        u64::from(u32::MAX),
        40,
        0x7E02_0000,
    ];
    for group in &profile.syscalls {
        for c in &group.args {
            for v in [c.val, c.val.wrapping_sub(1), c.val.wrapping_add(1)] {
                values.extend([v, v ^ (1 << 32), v ^ (1 << 63), v & 0xffff_ffff]);
            }
            if let Op::MaskedEq(mask) = c.op {
                values.extend([mask, !mask, c.val | !mask, c.val & mask]);
            }
        }
    }
    values.sort_unstable();
    values.dedup();
    values
}

/// The compact program and seccompiler's give the same answer for every system
/// call number (and past them), for argument values around every condition, and
/// for another architecture.
fn assert_same_as_reference(profile: &Profile, what: &str) {
    let values = interesting_values(profile);
    for arch in ARCHES {
        let compact = profile.compile_for(arch).unwrap();
        let reference = profile.compile_reference_for(arch).unwrap();
        let audit = match arch {
            "x86_64" => 0xC000_003E,
            "aarch64" => 0xC000_00B7,
            _ => 0xC000_00F3,
        };
        let conditional: BTreeSet<u8> = profile
            .syscalls
            .iter()
            .flat_map(|g| g.args.iter().map(|c| c.index))
            .collect();
        // Arguments matter only to calls with conditions.
        let checked: BTreeSet<libc::c_long> = profile
            .syscalls
            .iter()
            .filter(|g| g.applies_to(arch) && !g.args.is_empty())
            .flat_map(|g| &g.names)
            .map(|name| libc::c_long::from(compact::syscall_number(arch, name).unwrap()))
            .collect();
        let numbers = (0..1100).chain([0x4000_0000, 0x4000_0001, u32::MAX as libc::c_long]);
        for nr in numbers {
            let same = |args: [u64; 6]| {
                assert_eq!(
                    evaluate(&compact, audit, nr, args),
                    evaluate(&reference, audit, nr, args),
                    "{what} on {arch}: call {nr} with {args:?}"
                );
            };
            same([0; 6]);
            same([u64::MAX; 6]);
            if !checked.contains(&nr) {
                continue;
            }
            for &index in &conditional {
                for &v in &values {
                    let mut args = [0; 6];
                    args[usize::from(index)] = v;
                    same(args);
                    // With the other conditioned arguments at the same value too.
                    let mut all = [0; 6];
                    for &i in &conditional {
                        all[usize::from(i)] = v;
                    }
                    same(all);
                }
            }
        }
        assert_eq!(
            evaluate(&compact, 0x4000_0003, 0, [0; 6]),
            RET_KILL_PROCESS,
            "{what} on {arch}: another architecture"
        );
    }
}

#[test]
fn compact_programs_agree_with_seccompiler() {
    let default = Profile::default_profile().unwrap();
    assert_same_as_reference(&default, "the default profile");
    assert_same_as_reference(&Profile::parse(EVERY_FEATURE).unwrap(), "every feature");
    // Every allowed call under a condition: leaves too long for a conditional
    // jump over them (the unconditional-jump form of the search).
    let mut conditioned = default.clone();
    for (i, group) in conditioned.syscalls.iter_mut().enumerate() {
        if group.action == Action::Allow && group.args.is_empty() {
            group.args.push(Condition {
                index: u8::try_from(i % 6).expect("below 6"),
                width: if i % 2 == 0 {
                    Width::Dword
                } else {
                    Width::Qword
                },
                op: Op::Ne,
                val: 7 + i as u64,
                comment: None,
            });
        }
    }
    let long = conditioned.compile_for(std::env::consts::ARCH).unwrap();
    assert!(
        long.iter().any(|i| i.code == 0x05),
        "no far jump in the search"
    );
    assert_same_as_reference(&conditioned, "every call conditioned");
    let permissive = Profile::parse(r#"{ "default_action": "allow", "syscalls": [] }"#).unwrap();
    assert_same_as_reference(&permissive, "allow everything");
}

#[test]
fn the_default_program_is_short() {
    // What each install costs the kernel grows with the length; seccompiler's
    // program was about 1,500 instructions.
    let program = default_program().unwrap();
    let reference = Profile::default_profile()
        .unwrap()
        .compile_reference_for(std::env::consts::ARCH)
        .unwrap();
    eprintln!(
        "default program: {} instructions (seccompiler: {})",
        program.len(),
        reference.len()
    );
    assert!(
        program.len() * 3 < reference.len(),
        "{} instructions (seccompiler: {})",
        program.len(),
        reference.len()
    );
}

#[test]
fn chained_actions_and_permissive_profiles_compile() {
    let profile = Profile::parse(
        r#"{
            "default_action": "allow",
            "syscalls": [
                { "action": { "errno": 13 }, "names": ["mkdirat"] },
                { "action": "kill_process", "names": ["getppid"] },
                { "action": "allow", "names": ["read"] }
            ]
        }"#,
    )
    .unwrap();
    let program = profile.compile().unwrap();
    assert_eq!(call(&program, libc::SYS_mkdirat, 0), RET_ERRNO | 13);
    assert_eq!(call(&program, libc::SYS_getppid, 0), RET_KILL_PROCESS);
    assert_eq!(call(&program, libc::SYS_read, 0), RET_ALLOW);
    assert_eq!(call(&program, libc::SYS_mount, 0), RET_ALLOW);

    let everything = Profile::parse(r#"{ "default_action": "allow", "syscalls": [] }"#).unwrap();
    let program = everything.compile().unwrap();
    assert_eq!(call(&program, libc::SYS_mount, 0), RET_ALLOW);

    // Unconditional and conditional rules for one call: unconditional wins.
    let both = Profile::parse(
        r#"{
            "default_action": { "errno": "EPERM" },
            "syscalls": [
                { "action": "allow", "names": ["socket"],
                  "args": [{ "index": 0, "type": "dword", "op": "eq", "val": 1 }] },
                { "action": "allow", "names": ["socket"] },
                { "action": "allow", "names": ["read", "write", "execve", "exit_group"] }
            ]
        }"#,
    )
    .unwrap();
    let program = both.compile().unwrap();
    assert_eq!(call(&program, libc::SYS_socket, 40), RET_ALLOW);
}

#[test]
fn invalid_profiles_are_rejected_with_a_reason() {
    let cases = [
        (
            r#"{ "default_action": "allow", "syscalls": [], "extra": 1 }"#,
            "unknown field",
        ),
        (
            r#"{ "default_action": { "errno": "EWHAT" }, "syscalls": [] }"#,
            "unknown errno",
        ),
        (
            r#"{ "default_action": "log", "syscalls": [{ "action": "allow", "names": [] }] }"#,
            "has no names",
        ),
        (
            r#"{ "default_action": "log", "syscalls": [
                { "action": "allow", "names": ["read"], "arches": ["mips"] }] }"#,
            "unknown architecture",
        ),
        (
            r#"{ "default_action": "log", "syscalls": [
                { "action": "allow", "names": ["read"] },
                { "action": "trap", "names": ["read"] }] }"#,
            "read has more than one action",
        ),
        (
            r#"{ "default_action": "log", "syscalls": [{ "action": "allow", "names": ["mount"] }],
                 "denied": [{ "names": ["mount"] }] }"#,
            "mount is listed as denied",
        ),
        // The calls the sandbox makes under the filter, before the exec.
        (
            r#"{ "default_action": { "errno": "EPERM" }, "syscalls": [
                { "action": "allow", "names": ["read", "write", "exit_group"] }] }"#,
            "execve must be allowed without conditions",
        ),
        (
            r#"{ "default_action": "allow", "syscalls": [
                { "action": "kill_process", "names": ["read"] }] }"#,
            "read must be allowed without conditions",
        ),
        (
            r#"{ "default_action": { "errno": "EPERM" }, "syscalls": [
                { "action": "allow", "names": ["read", "execve", "exit_group"] },
                { "action": "allow", "names": ["write"],
                  "args": [{ "index": 0, "type": "dword", "op": "eq", "val": 1 }] }] }"#,
            "write must be allowed without conditions",
        ),
        (
            r#"{ "default_action": { "errno": "EPERM" }, "syscalls": [
                { "action": "allow", "names": ["read", "write", "execve"] },
                { "action": "allow", "names": ["exit_group"], "arches": ["aarch64"] }] }"#,
            "exit_group must be allowed without conditions (on x86_64)",
        ),
    ];
    for (json, expected) in cases {
        let err = Profile::parse(json).unwrap_err().to_string();
        assert!(err.contains(expected), "{json}: {err}");
    }
    // Allowed by the default action, or conditioned but with an allowing
    // default: always allowed.
    Profile::parse(
        r#"{ "default_action": "allow", "syscalls": [
            { "action": "allow", "names": ["write"],
              "args": [{ "index": 0, "type": "dword", "op": "eq", "val": 1 }] }] }"#,
    )
    .unwrap();
    // A typo is an error, not a silently missing rule.
    let typo = Profile::parse(
        r#"{ "default_action": "log", "syscalls": [{ "action": "allow", "names": ["raed"] }] }"#,
    )
    .unwrap();
    let err = typo.compile().unwrap_err().to_string();
    assert!(err.contains("raed"), "{err}");
}

#[test]
fn profile_files_are_read_and_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("default.json");
    std::fs::write(&good, DEFAULT_PROFILE).unwrap();
    assert_eq!(
        program_from_file(&good).unwrap(),
        default_program().unwrap()
    );
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{").unwrap();
    let err = program_from_file(&bad).unwrap_err().to_string();
    assert!(err.contains("bad.json"), "{err}");
    let err = program_from_file(&dir.path().join("missing.json"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.json"), "{err}");
}

/// Runs [`probe_under_filter`] in a fresh process of this test binary, with the
/// program installed between fork and exec.
fn run_probe(program: Option<BpfProgram>) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "tests::probe_under_filter",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(PROBE_ENV, "1");
    if let Some(program) = program {
        // SAFETY: the closure runs between fork and exec and only makes two
        // system calls (prctl, seccomp) on memory prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                seccompiler::apply_filter(&program)
                    .map_err(|_| std::io::Error::from_raw_os_error(libc::EPERM))
            })
        };
    }
    cmd.output().unwrap()
}

#[test]
fn a_filtered_process_runs_normally_but_cannot_mount_unshare_or_ptrace() {
    let out = run_probe(Some(default_program().unwrap()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("probe: all checks passed"), "{stdout}");
}

#[test]
fn the_probe_fails_without_the_filter() {
    let out = run_probe(None);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(!stdout.contains("probe: all checks passed"), "{stdout}");
}

fn errno_of(ret: libc::c_long) -> i32 {
    assert_eq!(ret, -1, "the call succeeded");
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

/// Only does something in the process started by [`run_probe`].
#[test]
fn probe_under_filter() {
    if std::env::var_os(PROBE_ENV).is_none() {
        return;
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    // First, so that nothing below runs unfiltered.
    assert!(status.contains("\nSeccomp:\t2\n"), "{status}");
    assert!(status.contains("\nNoNewPrivs:\t1\n"), "{status}");

    // SAFETY: raw system calls with integer, null or NUL-terminated string
    // arguments; each is expected to fail at the filter (a clone that does
    // create a child makes it exit at once).
    unsafe {
        assert!(libc::getpid() > 0);
        // Without the filter: success (no flags), EBADF, ENOENT, success.
        assert_eq!(errno_of(libc::syscall(libc::SYS_unshare, 0)), libc::EPERM);
        assert_eq!(errno_of(libc::syscall(libc::SYS_setns, -1, 0)), libc::EPERM);
        assert_eq!(
            errno_of(libc::syscall(
                libc::SYS_mount,
                c"none".as_ptr(),
                c"/nonexistent-fnrun-probe".as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null::<libc::c_void>(),
            )),
            libc::EPERM
        );
        assert_eq!(
            errno_of(libc::syscall(
                libc::SYS_ptrace,
                libc::PTRACE_TRACEME,
                0,
                0,
                0
            )),
            libc::EPERM
        );
        assert_eq!(
            errno_of(libc::syscall(libc::SYS_clone3, std::ptr::null::<u8>(), 0)),
            libc::ENOSYS
        );
        let ret = libc::syscall(
            libc::SYS_clone,
            libc::CLONE_NEWUSER | libc::SIGCHLD,
            0,
            0,
            0,
            0,
        );
        if ret == 0 {
            libc::_exit(0);
        }
        assert_eq!(errno_of(ret), libc::EPERM);
    }
    // Threads and child processes still work (glibc falls back from clone3).
    assert_eq!(std::thread::spawn(|| 7).join().unwrap(), 7);
    let child = Command::new("/bin/sh").args(["-c", "exit 3"]).status();
    assert_eq!(child.unwrap().code(), Some(3));
    println!("probe: all checks passed");
}
