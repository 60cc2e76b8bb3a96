//! What a function sees inside its sandbox (root mode): no capabilities,
//! no_new_privs, seccomp, a shifted user namespace, its own PID and UTS
//! namespaces, a minimal /dev, throwaway writes, and contained process counts.

use std::path::Path;
use std::time::Duration;

use fnrun_tests::cli::Cli;
use fnrun_tests::fixtures;
use fnrun_tests::functionio::{SAMPLE, last_message, report_script};
use fnrun_tests::image::TestImage;
use fnrun_tests::registry::Registry;
use fnrun_tests::user::require_root;

/// Runs `image` once with a fresh CLI and returns the last result's message.
fn report(image: TestImage) -> String {
    let registry = Registry::start().expect("registry starts");
    let image = image.push_to(&registry, "fns/probe:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
    last_message(&out.stdout)
}

/// A `Key: value` field of the message produced by `grep ... | xargs`.
fn field<'a>(message: &'a str, key: &str) -> Option<&'a str> {
    let mut words = message.split_whitespace();
    words.find(|w| *w == key)?;
    words.next()
}

#[test]
fn function_has_no_capabilities_no_new_privs_and_seccomp() {
    let message = report(TestImage::script(&report_script(
        "st=$(grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | xargs)",
        "$st",
    )));
    for cap in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(
            field(&message, cap),
            Some("0000000000000000"),
            "{cap} in {message}"
        );
    }
    assert_eq!(field(&message, "NoNewPrivs:"), Some("1"), "{message}");
    assert_eq!(
        field(&message, "Seccomp:"),
        Some("2"),
        "filter mode: {message}"
    );
}

#[test]
fn root_mode_maps_65536_ids_from_100000() {
    if !require_root("root_mode_maps_65536_ids_from_100000") {
        return;
    }
    let message = report(TestImage::script(&report_script(
        "u=$(xargs < /proc/self/uid_map); g=$(xargs < /proc/self/gid_map)",
        "uid_map=$u gid_map=$g",
    )));
    assert_eq!(message, "uid_map=0 100000 65536 gid_map=0 100000 65536");
}

#[test]
fn function_sees_only_its_own_processes_and_hostname() {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let message = report(TestImage::script(&report_script(
        "n=$(ls -d /proc/[0-9]* | wc -l)",
        "procs=$n host=$(hostname)",
    )));
    let procs: u32 = field(&message.replace('=', " "), "procs")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{message}"));
    assert!(procs < 10, "sees host processes: {message}");
    assert!(
        !message.ends_with(&format!("host={}", host.trim())),
        "{message}"
    );
}

#[test]
fn dev_has_only_the_basic_devices() {
    let message = report(TestImage::script(&report_script(
        "d=$(find /dev -type c -o -type b | sort | xargs)",
        "$d",
    )));
    let devices: Vec<&str> = message.split_whitespace().collect();
    for needed in [
        "/dev/full",
        "/dev/null",
        "/dev/random",
        "/dev/tty",
        "/dev/urandom",
        "/dev/zero",
    ] {
        assert!(devices.contains(&needed), "{needed} missing: {message}");
    }
    let allowed = [
        "/dev/full",
        "/dev/null",
        "/dev/random",
        "/dev/tty",
        "/dev/urandom",
        "/dev/zero",
        // A private devpts instance is harmless.
        "/dev/ptmx",
        "/dev/pts/ptmx",
    ];
    let extra: Vec<&&str> = devices.iter().filter(|d| !allowed.contains(d)).collect();
    assert!(
        extra.is_empty(),
        "unexpected devices {extra:?} in {message}"
    );
}

#[test]
fn writes_are_thrown_away_and_the_cache_is_untouched() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::script(&report_script(
        "before=$(ls /marker /tmp/marker /etc/marker 2>/dev/null | wc -l)\n\
         echo x > /marker && echo x > /tmp/marker && echo x > /etc/marker && echo x >> /etc/passwd\n\
         wrote=$?\n\
         after=$(ls /marker /tmp/marker /etc/marker 2>/dev/null | wc -l)\n\
         tmpfs=$(grep -c ' /tmp tmpfs ' /proc/mounts)",
        "before=$before wrote=$wrote after=$after tmpfs=$tmpfs",
    ))
    .push_to(&registry, "fns/writer:v1");
    let cli = Cli::new().expect("cli");
    for run in 0..2 {
        let out = cli.run(&["run", &image, "-"], Some(SAMPLE.as_bytes()));
        assert_eq!(out.code, Some(0), "run {run}: {}", out.describe());
        assert_eq!(
            last_message(&out.stdout),
            "before=0 wrote=0 after=3 tmpfs=1",
            "run {run}"
        );
    }
    let found = find_named(&cli.cache_dir(), "marker");
    assert!(found.is_empty(), "a run wrote into the cache: {found:?}");
}

fn find_named(dir: &Path, name: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_name() == name {
            found.push(path.clone());
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(find_named(&path, name));
        }
    }
    found
}

/// A bounded stand-in for a fork bomb (5000 sleeping processes at most, so a
/// runner without a pids limit does not take the test host down): the default
/// pids limit stops it early, and nothing of it survives the run.
#[test]
fn process_count_is_limited_by_default_and_nothing_survives() {
    let registry = Registry::start().expect("registry starts");
    let image = TestImage::script(&report_script(
        "n=0\nwhile [ $n -lt 5000 ]; do sleep 987 & n=$((n+1)); done",
        "started=$n",
    ))
    .push_to(&registry, "fns/forks:v1");
    let cli = Cli::new().expect("cli");
    let out = cli.run(
        &["run", "--timeout", "60s", &image, "-"],
        Some(SAMPLE.as_bytes()),
    );
    let left = fixtures::leftover_processes(&["sleep", "987"], Duration::from_secs(10));
    fixtures::kill_pids(&left);
    assert!(
        left.is_empty(),
        "{} processes of the run survived it",
        left.len()
    );
    match out.code {
        // The shell gave up when fork failed.
        Some(1) => {}
        Some(0) => {
            let started: u32 = last_message(&out.stdout)
                .trim_start_matches("started=")
                .parse()
                .expect("count");
            assert!(started < 5000, "no pids limit: started {started} processes");
        }
        _ => panic!("{}", out.describe()),
    }
    // The runner is fine afterwards.
    let echo = TestImage::echo().push_to(&registry, "fns/echo:v1");
    let out = cli.run(&["run", &echo, "-"], Some(SAMPLE.as_bytes()));
    assert_eq!(out.code, Some(0), "{}", out.describe());
}
