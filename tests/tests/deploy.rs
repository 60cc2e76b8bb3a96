//! The operator-facing artefacts: every manifest under `deploy/` validates
//! against the Kubernetes 1.29 schemas and says what the runner needs, and the
//! `Dockerfile` builds offline with buildah into an image whose entrypoint is
//! a working, static fnrun that runs as a non-root user, with its man pages.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use serde_norway::Value;

const KUBERNETES_VERSION: &str = "1.29.0";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            yaml_files(&path, out);
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        ) {
            out.push(path);
        }
    }
}

fn manifests() -> Vec<PathBuf> {
    let mut files = Vec::new();
    yaml_files(&repo().join("deploy"), &mut files);
    assert!(!files.is_empty(), "deploy/ has no YAML files");
    files
}

fn output(cmd: &mut Command) -> std::io::Result<Output> {
    cmd.stdin(std::process::Stdio::null()).output()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `kubernetes-validate` command of the tests' own venv
/// (`$FNRUN_TEST_CACHE/validate-venv`, pinned by
/// `tests/python/validate/requirements.txt`), made or brought up to date by
/// `tests/python/venv.sh`, which does nothing when it is current. Never a
/// copy from the system's Python: its version would be whatever was there.
fn kubernetes_validate() -> PathBuf {
    let venv = fnrun_tests::tool_cache::dir().join("validate-venv");
    let requirements = repo().join("tests/python/validate/requirements.txt");
    let out = output(
        Command::new(repo().join("tests/python/venv.sh"))
            .arg(&venv)
            .arg(&requirements)
            .arg("kubernetes_validate"),
    )
    .expect("run tests/python/venv.sh");
    assert!(
        out.status.success(),
        "tests/python/venv.sh {} failed:\n{}",
        venv.display(),
        text(&out)
    );
    venv.join("bin/kubernetes-validate")
}

#[test]
fn every_manifest_under_deploy_validates_against_kubernetes_1_29() {
    let files = manifests();
    let validator = kubernetes_validate();
    let out = output(
        Command::new(&validator)
            .args(["-k", KUBERNETES_VERSION, "--strict"])
            .args(&files),
    )
    .expect("run kubernetes-validate");
    let log = text(&out);
    assert!(
        out.status.success(),
        "kubernetes-validate -k {KUBERNETES_VERSION} --strict failed:\n{log}"
    );
    for bad in ["ERROR", "WARN", "failed"] {
        assert!(!log.contains(bad), "validator output has {bad}:\n{log}");
    }
    for file in &files {
        let name = file.strip_prefix(repo()).unwrap().display().to_string();
        assert!(
            log.lines()
                .any(|l| l.contains(&name) && l.contains("passed")),
            "{name} was not reported as passed:\n{log}"
        );
    }
}

fn load(path: &str) -> Value {
    let path = repo().join(path);
    let source =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::from_str(&source).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn at<'a>(value: &'a Value, path: &str) -> &'a Value {
    path.split('.')
        .fold(value, |v, key| match key.parse::<usize>() {
            Ok(i) => &v[i],
            Err(_) => &v[key],
        })
}

fn container<'a>(workload: &'a Value, name: &str) -> &'a Value {
    at(workload, "spec.template.spec.containers")
        .as_sequence()
        .expect("containers")
        .iter()
        .find(|c| c["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn args(c: &Value) -> Vec<&str> {
    c["args"]
        .as_sequence()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg"))
        .collect()
}

/// On SIGTERM fnrun keeps serving for `--shutdown-delay` (health
/// NOT_SERVING), then drains within `--shutdown-grace`: the pod's
/// termination grace period must cover both, or the kubelet kills calls in
/// flight.
#[test]
fn termination_grace_covers_the_shutdown_delay_and_grace() {
    for file in [
        "deploy/daemonset.yaml",
        "deploy/rootless/daemonset.yaml",
        "deploy/crossplane-file/deployment.yaml",
        "deploy/crossplane/deployment.yaml",
        "deploy/crossplane/privileged/deployment.yaml",
    ] {
        let workload = load(file);
        let a = args(container(&workload, "fnrun"));
        let seconds = |name: &str| -> u64 {
            let value = a
                .iter()
                .find_map(|arg| arg.strip_prefix(&format!("--{name}=")))
                .unwrap_or_else(|| panic!("{file}: --{name} is not explicit: {a:?}"));
            value
                .strip_suffix('s')
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{file}: --{name}={value} is not in seconds"))
        };
        let delay = seconds("shutdown-delay");
        let grace = seconds("shutdown-grace");
        assert!(delay > 0, "{file}: no shutdown delay");
        let termination = at(
            &workload,
            "spec.template.spec.terminationGracePeriodSeconds",
        )
        .as_u64()
        .unwrap_or_else(|| panic!("{file}: terminationGracePeriodSeconds"));
        assert!(
            termination > delay + grace,
            "{file}: terminationGracePeriodSeconds {termination} <= {delay}s delay + {grace}s grace"
        );
    }
}

#[test]
fn daemonsets_serve_the_socket_and_tcp_with_grpc_probes_and_limits() {
    for (file, uid) in [
        ("deploy/daemonset.yaml", 0),
        ("deploy/rootless/daemonset.yaml", 65532),
    ] {
        let ds = load(file);
        assert_eq!(ds["kind"].as_str(), Some("DaemonSet"), "{file}");
        let pod = at(&ds, "spec.template.spec");
        assert_eq!(pod["serviceAccountName"].as_str(), Some("fnrun"), "{file}");
        let c = container(&ds, "fnrun");
        let a = args(c);
        assert_eq!(a[0], "serve", "{file}");
        assert!(
            a.contains(&"--listen=unix:/var/run/fnrun/fn.sock"),
            "{file}: {a:?}"
        );
        assert!(a.contains(&"--listen=0.0.0.0:9443"), "{file}: {a:?}");
        assert!(a.contains(&"--cache-dir=/var/cache/fnrun"), "{file}: {a:?}");
        let run_as = c["securityContext"]["runAsUser"]
            .as_u64()
            .or(pod["securityContext"]["runAsUser"].as_u64());
        assert_eq!(run_as, Some(uid), "{file}: runAsUser");
        for probe in ["readinessProbe", "livenessProbe"] {
            assert_eq!(
                c[probe]["grpc"]["port"].as_u64(),
                Some(9443),
                "{file}: {probe} is a gRPC probe on the TCP listener"
            );
        }
        for kind in ["requests", "limits"] {
            for resource in ["cpu", "memory"] {
                assert!(
                    !c["resources"][kind][resource].is_null(),
                    "{file}: resources.{kind}.{resource}"
                );
            }
        }
        let volumes = pod["volumes"].as_sequence().expect("volumes");
        let host_paths: Vec<&str> = volumes
            .iter()
            .filter_map(|v| v["hostPath"]["path"].as_str())
            .collect();
        assert!(
            host_paths.contains(&"/var/run/fnrun"),
            "{file}: {host_paths:?}"
        );
        assert!(
            host_paths.iter().any(|p| p.starts_with("/var/cache/fnrun")),
            "{file}: {host_paths:?}"
        );
        let image = c["image"].as_str().expect("image");
        assert!(
            !image.ends_with(":latest") && image.contains(':'),
            "{file}: {image}"
        );
    }

    // The root variant can write cgroups and map 65536 ids.
    let root = load("deploy/daemonset.yaml");
    let sc = &container(&root, "fnrun")["securityContext"];
    let caps: Vec<&str> = sc["capabilities"]["add"]
        .as_sequence()
        .expect("capabilities.add")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        caps.contains(&"SETUID") && caps.contains(&"SETGID"),
        "{caps:?}"
    );
    assert_eq!(sc["privileged"].as_bool(), Some(true));

    // The rootless variant has no capability, the shipped seccomp profile and
    // no AppArmor confinement.
    let rootless = load("deploy/rootless/daemonset.yaml");
    let c = container(&rootless, "fnrun");
    assert_eq!(
        c["securityContext"]["capabilities"]["drop"][0].as_str(),
        Some("ALL")
    );
    assert_eq!(
        c["securityContext"]["allowPrivilegeEscalation"].as_bool(),
        Some(false)
    );
    // procMount: Unmasked is refused by the API server (1.33 and later)
    // unless the pod has its own user namespace.
    assert_eq!(c["securityContext"]["procMount"].as_str(), Some("Unmasked"));
    assert_eq!(
        at(&rootless, "spec.template.spec.hostUsers").as_bool(),
        Some(false)
    );
    let seccomp = at(
        &rootless,
        "spec.template.spec.securityContext.seccompProfile",
    );
    assert_eq!(seccomp["type"].as_str(), Some("Localhost"));
    assert_eq!(
        seccomp["localhostProfile"].as_str(),
        Some("fnrun/fnrun.json"),
        "the profile the docs tell operators to copy from deploy/seccomp/fnrun.json"
    );
    assert_eq!(
        at(&rootless, "spec.template.metadata.annotations")
            ["container.apparmor.security.beta.kubernetes.io/fnrun"]
            .as_str(),
        Some("unconfined")
    );
}

#[test]
fn service_is_node_local_and_sidecar_uses_the_default_abstract_socket() {
    let svc = load("deploy/service.yaml");
    assert_eq!(svc["kind"].as_str(), Some("Service"));
    assert_eq!(
        at(&svc, "spec.internalTrafficPolicy").as_str(),
        Some("Local")
    );
    assert_eq!(at(&svc, "spec.ports.0.port").as_u64(), Some(9443));

    let sidecar = load("deploy/sidecar/crossplane-patch.yaml");
    let c = container(&sidecar, "fnrun");
    let a = args(c);
    assert_eq!(
        a[0], "start",
        "Crossplane's own runner is started with `start`"
    );
    assert!(
        a.contains(&"--listen=unix-abstract:crossplane/fn/default.sock"),
        "{a:?}"
    );
    assert_eq!(c["securityContext"]["runAsUser"].as_u64(), Some(65532));
}

#[test]
fn seccomp_profile_allows_user_namespaces_and_mounts_and_nothing_dangerous() {
    let path = repo().join("deploy/seccomp/fnrun.json");
    let profile: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).expect("read profile")).expect("JSON");
    assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
    let allowed: Vec<&str> = profile["syscalls"]
        .as_array()
        .expect("syscalls")
        .iter()
        .filter(|r| r["action"] == "SCMP_ACT_ALLOW")
        .flat_map(|r| r["names"].as_array().expect("names"))
        .map(|n| n.as_str().expect("name"))
        .collect();
    for needed in [
        "clone",
        "clone3",
        "unshare",
        "mount",
        "umount2",
        "pivot_root",
        "sethostname",
        "setns",
        "seccomp",
        "prctl",
        "execve",
        "wait4",
        "pidfd_open",
        "pidfd_send_signal",
        "close_range",
        "socket",
        "epoll_wait",
        "futex",
    ] {
        assert!(allowed.contains(&needed), "{needed} is not allowed");
    }
    for denied in [
        "bpf",
        "keyctl",
        "add_key",
        "ptrace",
        "perf_event_open",
        "kexec_load",
        "init_module",
        "finit_module",
        "delete_module",
        "reboot",
        "swapon",
        "clock_settime",
        "settimeofday",
        "open_by_handle_at",
        "userfaultfd",
        "io_uring_setup",
    ] {
        assert!(!allowed.contains(&denied), "{denied} must not be allowed");
    }
}

/// buildah, installed with apt-get when missing and possible.
fn buildah() -> Option<String> {
    let present =
        || output(Command::new("buildah").arg("--version")).is_ok_and(|o| o.status.success());
    if present() {
        return None;
    }
    if !nix::unistd::geteuid().is_root() {
        return Some("buildah is not installed and installing it needs root".into());
    }
    let install = || {
        output(
            Command::new("apt-get")
                .args(["install", "-y", "-q", "--no-install-recommends", "buildah"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    let ok = |r: std::io::Result<Output>| r.is_ok_and(|o| o.status.success());
    if !ok(install()) {
        let _ = output(Command::new("apt-get").args(["update", "-q"]));
        if !ok(install()) {
            return Some("buildah is not installed and apt-get could not install it".into());
        }
    }
    if present() {
        None
    } else {
        Some("buildah is still not runnable after apt-get install".into())
    }
}

#[test]
fn image_builds_offline_with_buildah_and_runs_fnrun_as_non_root() {
    if let Some(reason) = buildah() {
        eprintln!("SKIP image_builds_offline_with_buildah_and_runs_fnrun_as_non_root: {reason}");
        return;
    }
    let storage = tempfile::tempdir().expect("tempdir");
    let root = storage.path().join("root");
    let runroot = storage.path().join("runroot");
    let tag = format!("localhost/fnrun-test:{}", std::process::id());
    // A target dir of its own (`cargo test` may hold the lock on the main
    // one), or FNRUN_IMAGE_TARGET_DIR to reuse an existing static build.
    let target = std::env::var_os("FNRUN_IMAGE_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| repo().join("target"))
                .join("image")
        });

    let buildah = |args: &[&str]| -> Output {
        let out = output(
            Command::new("buildah")
                .args(["--storage-driver", "vfs", "--root"])
                .arg(&root)
                .arg("--runroot")
                .arg(&runroot)
                .args(args),
        )
        .expect("run buildah");
        assert!(out.status.success(), "buildah {args:?}:\n{}", text(&out));
        out
    };

    let started = Instant::now();
    let out = output(
        Command::new(repo().join("scripts/build-image"))
            .arg(&tag)
            .env("CARGO_TARGET_DIR", &target)
            .env("FNRUN_BUILDAH_ROOT", &root)
            .env("FNRUN_BUILDAH_RUNROOT", &runroot)
            // Offline: the build must not need a registry or the network.
            .env("BUILDAH_ISOLATION", "chroot")
            .env("CARGO_NET_OFFLINE", "true")
            // The Dockerfile, the build context and the image are the
            // release's; the binary is unoptimized. A static release build
            // from nothing took most of this test's 21 minutes on a fresh
            // machine (docs/testing.md).
            .env(
                "FNRUN_CARGO_PROFILE",
                std::env::var("FNRUN_IMAGE_PROFILE").unwrap_or_else(|_| "dev".into()),
            )
            // Built once per target dir: incremental state would be written
            // and never read.
            .env("CARGO_INCREMENTAL", "0")
            .env_remove("RUSTFLAGS"),
    )
    .expect("run scripts/build-image");
    assert!(
        out.status.success(),
        "scripts/build-image failed:\n{}",
        text(&out)
    );
    eprintln!("scripts/build-image took {:?}", started.elapsed());

    let inspect = buildah(&["inspect", "--type", "image", &tag]);
    let json: serde_json::Value = serde_json::from_slice(&inspect.stdout).expect("inspect JSON");
    let config = &json["OCIv1"]["config"];
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/fnrun"]),
        "{config}"
    );
    assert_eq!(config["Cmd"], serde_json::json!(["serve"]), "{config}");
    let user = config["User"].as_str().unwrap_or_default();
    let uid = user.split(':').next().unwrap_or_default();
    assert!(
        !uid.is_empty() && uid != "0" && uid != "root",
        "the image runs as non-root by default, not {user:?}"
    );
    assert_eq!(uid, "65532");

    // The image's files, from a working container's mount.
    let from = buildah(&["from", "--pull=never", &tag]);
    let ctr = String::from_utf8_lossy(&from.stdout).trim().to_string();
    let mount = buildah(&["mount", &ctr]);
    let rootfs = PathBuf::from(String::from_utf8_lossy(&mount.stdout).trim());
    let result = std::panic::catch_unwind(|| {
        let fnrun = rootfs.join("usr/local/bin/fnrun");
        let version = output(Command::new(&fnrun).arg("--version")).expect("run fnrun");
        assert!(
            version.status.success(),
            "fnrun --version:\n{}",
            text(&version)
        );
        assert!(
            String::from_utf8_lossy(&version.stdout).starts_with("fnrun "),
            "{}",
            text(&version)
        );
        // The man pages, generated from the command line by `fnrun man`.
        for page in ["fnrun.1", "fnrun-run.1", "fnrun-cache-rm.1"] {
            let path = rootfs.join("usr/share/man/man1").join(page);
            let roff = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(roff.contains(".TH fnrun"), "{page}");
        }
        let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).expect("/etc/passwd");
        assert!(passwd.contains(":65532:65532:"), "{passwd}");
        assert!(rootfs.join("etc/group").is_file());
        assert!(
            std::fs::metadata(rootfs.join("etc/ssl/certs/ca-certificates.crt"))
                .expect("CA certificates")
                .len()
                > 0
        );
        for dir in ["var/cache/fnrun", "var/run/fnrun"] {
            let meta = std::fs::metadata(rootfs.join(dir)).expect(dir);
            assert!(meta.is_dir(), "{dir}");
            assert_eq!(
                (meta.uid(), meta.gid()),
                (65532, 65532),
                "{dir} belongs to fnrun"
            );
            assert_eq!(
                std::fs::read_dir(rootfs.join(dir)).unwrap().count(),
                0,
                "{dir} is empty"
            );
        }
        // Nothing else: no shell, no libc, no package manager.
        let mut top: Vec<String> = std::fs::read_dir(&rootfs)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        top.sort();
        assert_eq!(top, ["etc", "tmp", "usr", "var"], "top-level entries");
        assert!(!rootfs.join("bin/sh").exists() && !rootfs.join("lib").exists());
    });
    buildah(&["umount", &ctr]);
    buildah(&["rm", &ctr]);
    buildah(&["rmi", "--force", &tag]);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// The shipped seccomp profile, applied by runc the way a container runtime
/// applies a Localhost profile, lets an unprivileged process without
/// capabilities do what fnrun's sandbox does: a user and mount namespace, a
/// tmpfs mount, a PID namespace with a fresh /proc (the container's /proc
/// unmasked, as with `procMount: Unmasked`).
#[test]
fn seccomp_profile_lets_an_unprivileged_runner_create_namespaces_under_runc() {
    let busybox = Path::new("/bin/busybox");
    let runc_ok = output(Command::new("runc").arg("--version")).is_ok_and(|o| o.status.success());
    if !nix::unistd::geteuid().is_root() || !runc_ok || !busybox.is_file() {
        eprintln!("SKIP: needs root, runc and /bin/busybox (busybox-static)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = dir.path().join("bundle");
    let rootfs = bundle.join("rootfs");
    for sub in ["bin", "proc", "tmp", "dev"] {
        std::fs::create_dir_all(rootfs.join(sub)).expect("mkdir");
    }
    std::fs::copy(busybox, rootfs.join("bin/busybox")).expect("copy busybox");
    for applet in ["sh", "unshare", "mount", "id", "cat", "grep"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).expect("symlink");
    }
    let spec = output(Command::new("runc").arg("spec").current_dir(&bundle)).expect("runc spec");
    assert!(spec.status.success(), "runc spec: {}", text(&spec));

    let config_path = bundle.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config_path).unwrap()).unwrap();
    let mut profile: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo().join("deploy/seccomp/fnrun.json")).unwrap())
            .unwrap();
    for rule in profile["syscalls"].as_array_mut().unwrap() {
        rule.as_object_mut().unwrap().remove("comment");
    }
    let script = "unshare -Urm sh -c 'mount -t tmpfs x /tmp && echo MOUNT_OK' && \
                  unshare -Urmpf --mount-proc sh -c 'echo PROC_OK; grep ^Seccomp: /proc/self/status'";
    config["linux"]["seccomp"] = profile;
    config["linux"]["maskedPaths"] = serde_json::json!([]);
    config["linux"]["readonlyPaths"] = serde_json::json!([]);
    config["root"]["readonly"] = serde_json::json!(true);
    let process = &mut config["process"];
    process["terminal"] = serde_json::json!(false);
    process["user"] = serde_json::json!({"uid": 65532, "gid": 65532});
    process["noNewPrivileges"] = serde_json::json!(true);
    process["capabilities"] = serde_json::json!({
        "bounding": [], "effective": [], "permitted": [], "inheritable": [], "ambient": []
    });
    process["args"] = serde_json::json!(["/bin/sh", "-c", script]);
    std::fs::write(&config_path, serde_json::to_vec(&config).unwrap()).unwrap();

    let state = dir.path().join("state");
    let name = format!("fnrun-deploy-seccomp-{}", std::process::id());
    let run = output(
        Command::new("timeout")
            .args(["60", "runc", "--root"])
            .arg(&state)
            .args(["run", &name])
            .current_dir(&bundle),
    )
    .expect("runc run");
    let _ = output(
        Command::new("runc")
            .arg("--root")
            .arg(&state)
            .args(["delete", "-f", &name]),
    );
    let log = text(&run);
    assert!(run.status.success(), "runc run failed:\n{log}");
    assert!(log.contains("MOUNT_OK") && log.contains("PROC_OK"), "{log}");
    assert!(
        log.contains("Seccomp:\t2"),
        "the profile was applied (filter mode):\n{log}"
    );
}

/// The Crossplane External function runtime (deploy/crossplane-file/): a
/// Deployment in Crossplane's namespace serving every function of its
/// ConfigMap over mTLS with certificates from `crossplane-root-ca`, and a
/// Service per function selecting its pods.
#[test]
fn crossplane_function_runtime_serves_every_listed_function_over_mtls() {
    let deployment = load("deploy/crossplane-file/deployment.yaml");
    assert_eq!(deployment["kind"].as_str(), Some("Deployment"));
    assert_eq!(
        at(&deployment, "metadata.namespace").as_str(),
        Some("crossplane-system")
    );
    let pod = at(&deployment, "spec.template.spec");
    let pod_labels = at(&deployment, "spec.template.metadata.labels")
        .as_mapping()
        .expect("pod labels");
    let c = container(&deployment, "fnrun");
    let a = args(c);
    assert_eq!(a[0], "serve");
    let flag = |name: &str| {
        a.iter()
            .find_map(|arg| arg.strip_prefix(&format!("--{name}=")))
            .unwrap_or_else(|| panic!("--{name} missing: {a:?}"))
            .to_owned()
    };
    assert_eq!(flag("functions-listen"), "0.0.0.0:9443");
    assert_eq!(flag("functions-namespace"), "crossplane-system");
    assert!(!a.contains(&"--functions-insecure"), "{a:?}");
    // No v1alpha1 runner: only the functions are served.
    assert_eq!(flag("listen"), "none", "{a:?}");
    // Certificates minted from Crossplane's root CA, which also signs
    // Crossplane's client certificate.
    let ca_cert = flag("functions-ca-cert");
    let ca_key = flag("functions-ca-key");
    assert_eq!(flag("functions-client-ca"), ca_cert);
    let mounted = |path: &str| -> String {
        let mounts = c["volumeMounts"].as_sequence().expect("volumeMounts");
        let mount = mounts
            .iter()
            .find(|m| {
                let dir = m["mountPath"].as_str().unwrap_or_default();
                path.starts_with(&format!("{dir}/"))
            })
            .unwrap_or_else(|| panic!("{path} is on no mount"));
        mount["name"].as_str().expect("mount name").to_owned()
    };
    let volume = |name: &str| -> Value {
        pod["volumes"]
            .as_sequence()
            .expect("volumes")
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no volume {name}"))
            .clone()
    };
    for path in [&ca_cert, &ca_key] {
        assert_eq!(
            volume(&mounted(path))["secret"]["secretName"].as_str(),
            Some("crossplane-root-ca"),
            "{path}"
        );
    }
    for file in [&ca_cert, &ca_key] {
        let key = file.rsplit('/').next().unwrap();
        assert!(["tls.crt", "tls.key"].contains(&key), "{file}");
    }
    let functions_file = flag("functions");
    let configmap = volume(&mounted(&functions_file));
    let configmap_name = configmap["configMap"]["name"]
        .as_str()
        .expect("a ConfigMap");
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(
            c[probe]["tcpSocket"]["port"].as_u64(),
            Some(9443),
            "{probe}"
        );
    }

    // The ConfigMap's functions file, and a Service for each function.
    let cm = load("deploy/crossplane-file/functions.yaml");
    assert_eq!(cm["kind"].as_str(), Some("ConfigMap"));
    assert_eq!(cm["metadata"]["name"].as_str(), Some(configmap_name));
    let key = functions_file.rsplit('/').next().unwrap();
    let text = cm["data"][key].as_str().expect("the functions file");
    let doc: Value = serde_norway::from_str(text).expect("the functions file is YAML");
    let names: Vec<&str> = doc["functions"]
        .as_sequence()
        .expect("functions")
        .iter()
        .map(|f| f["name"].as_str().expect("a name"))
        .collect();
    assert!(names.len() >= 3, "{names:?}");
    let mut services = Vec::new();
    yaml_files(
        &repo().join("deploy/crossplane-file/services"),
        &mut services,
    );
    let mut service_names = Vec::new();
    for file in &services {
        let svc: Value = serde_norway::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        assert_eq!(svc["kind"].as_str(), Some("Service"), "{}", file.display());
        assert_eq!(
            at(&svc, "metadata.namespace").as_str(),
            Some("crossplane-system")
        );
        assert_eq!(at(&svc, "spec.ports.0.port").as_u64(), Some(9443));
        assert_eq!(
            at(&svc, "spec.ports.0.targetPort").as_str(),
            Some("functions")
        );
        for (k, v) in at(&svc, "spec.selector").as_mapping().expect("a selector") {
            assert_eq!(
                pod_labels.get(k),
                Some(v),
                "{}: selector {k:?}",
                file.display()
            );
        }
        service_names.push(svc["metadata"]["name"].as_str().unwrap().to_owned());
    }
    service_names.sort();
    let mut sorted: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    sorted.sort();
    assert_eq!(
        service_names, sorted,
        "a Service per function, and no other"
    );

    // fnrun itself accepts the functions file as shipped.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("functions.yaml");
    std::fs::write(&file, text).unwrap();
    let daemon = fnrun_tests::daemon::Daemon::start(
        fnrun_tests::daemon::DaemonOpts::default()
            .arg("--functions")
            .arg(file.display().to_string())
            .arg("--functions-insecure")
            .arg("--functions-listen")
            .arg(format!(
                "127.0.0.1:{}",
                fnrun_tests::registry::free_port().unwrap()
            )),
    )
    .expect("fnrun serve takes the shipped functions file");
    let log = fnrun_tests::wait_for(std::time::Duration::from_secs(10), || {
        let log = daemon.log();
        log.contains("serving Crossplane functions").then_some(log)
    })
    .expect("the functions are served");
    assert!(log.contains(&format!("functions={}", names.len())), "{log}");
}

/// Kubernetes mode (deploy/crossplane/): the functions listener accepts TCP
/// before fnrun has read the API, so readiness is asked of `/readyz` on the
/// metrics listener, which says whether it can serve; and the Lease it
/// elects with is made by the manifests (its ServiceAccount may not create
/// one).
#[test]
fn kubernetes_mode_is_ready_by_readyz_and_its_lease_is_made_for_it() {
    for file in [
        "deploy/crossplane/deployment.yaml",
        "deploy/crossplane/privileged/deployment.yaml",
    ] {
        ready_by_readyz(file);
    }
    let lease = load("deploy/crossplane/lease.yaml");
    assert_eq!(lease["kind"].as_str(), Some("Lease"));
    assert_eq!(lease["metadata"]["name"].as_str(), Some("fnrun-functions"));
    assert_eq!(
        lease["metadata"]["namespace"].as_str(),
        Some("crossplane-system")
    );
    assert!(lease["spec"].is_null(), "the holder is fnrun's to write");
}

/// Kubernetes mode's default Deployment is the unprivileged one (its own
/// user namespace, uid 65532, no capability, /proc unmasked, fnrun's
/// seccomp profile), the privileged one beside it is privileged; both run
/// fnrun with the same arguments, the same Deployment by the same name.
#[test]
fn kubernetes_modes_default_is_unprivileged_and_the_privileged_variant_runs_the_same() {
    let default = load("deploy/crossplane/deployment.yaml");
    let privileged = load("deploy/crossplane/privileged/deployment.yaml");
    let pod = at(&default, "spec.template.spec");
    assert_eq!(pod["hostUsers"].as_bool(), Some(false));
    assert_eq!(pod["securityContext"]["runAsUser"].as_u64(), Some(65532));
    assert_eq!(pod["securityContext"]["runAsNonRoot"].as_bool(), Some(true));
    let seccomp = &pod["securityContext"]["seccompProfile"];
    assert_eq!(seccomp["type"].as_str(), Some("Localhost"));
    assert_eq!(
        seccomp["localhostProfile"].as_str(),
        Some("fnrun/fnrun.json")
    );
    let sc = &container(&default, "fnrun")["securityContext"];
    assert_eq!(sc["privileged"].as_bool(), Some(false));
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(sc["procMount"].as_str(), Some("Unmasked"));
    assert_eq!(sc["capabilities"]["drop"][0].as_str(), Some("ALL"));
    assert!(sc["capabilities"]["add"].is_null(), "{sc:?}");

    let sc = &container(&privileged, "fnrun")["securityContext"];
    assert_eq!(sc["privileged"].as_bool(), Some(true));
    assert!(at(&privileged, "spec.template.spec.hostUsers").is_null());
    assert_eq!(
        args(container(&default, "fnrun")),
        args(container(&privileged, "fnrun"))
    );
    assert_eq!(default["metadata"], privileged["metadata"]);
}

fn ready_by_readyz(file: &str) {
    let deployment = load(file);
    let c = container(&deployment, "fnrun");
    let a = args(c);
    assert!(a.contains(&"--metrics-listen=0.0.0.0:9090"), "{a:?}");
    let metrics = c["ports"]
        .as_sequence()
        .expect("ports")
        .iter()
        .find(|p| p["name"].as_str() == Some("metrics"))
        .expect("a port named metrics");
    assert_eq!(metrics["containerPort"].as_u64(), Some(9090));
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/livez")] {
        assert_eq!(
            c[probe]["httpGet"]["path"].as_str(),
            Some(path),
            "{file}: {probe}"
        );
        assert_eq!(
            c[probe]["httpGet"]["port"].as_str(),
            Some("metrics"),
            "{file}: {probe}"
        );
        assert!(c[probe]["tcpSocket"].is_null(), "{file}: {probe}");
    }
}
