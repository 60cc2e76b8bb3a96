//! A real single-node Kubernetes cluster for the tests: the control plane of
//! [`crate::kube`] (etcd, kube-apiserver) and a node made of the real
//! programs, each built from its Go module at a pinned version:
//!
//! - containerd v2 with its CRI plugin, its runc shim and `ctr`
//!   (`tests/go/upstream/containerd`), running containers with runc
//!   (`tests/go/upstream/runc`, with cgo and libseccomp);
//! - kubelet and kube-proxy (iptables mode) from `k8s.io/kubernetes` v1.35.4
//!   on the pins of kube-apiserver (`tests/go/upstream/kubelet`);
//! - the CNI `bridge`, `host-local` and `loopback` plugins of Debian's
//!   `containernetworking-plugins` (`/usr/lib/cni`);
//! - a pause image compiled from kubernetes' `build/pause/linux/pause.c`
//!   (`gcc -static`) and imported into containerd, as every image here is
//!   (`ctr images import`, nothing is pulled).
//!
//! The node's address is on a bridge of its own ([`BRIDGE`], [`NODE_IP`]),
//! which the CNI bridge plugin then uses for the pods' network
//! ([`POD_CIDR`]). The API server listens on that address
//! ([`ControlPlane::start_on`]: made before it starts) and on no other, with a
//! serving certificate for it and for the `kubernetes` Service's address and
//! names: the Service's endpoint is real, kube-proxy routes the pods' calls to
//! it, and a pod's in-cluster configuration (the ServiceAccount token kubelet
//! projects, `kube-root-ca.crt`) works. Without [`Options::controllers`] there
//! is no scheduler and no controller manager: a test's Pods name the node
//! (`spec.nodeName`).
//!
//! Everything lives in a temp dir (state, configuration, logs), except what
//! the programs hard-code (`/run/containerd/s`, `/var/lib/cni`,
//! `/var/log/containers`, `/var/lib/kubelet/device-plugins`): those are
//! removed at stop if they were not there before. Stopping (also on drop,
//! so also when a test panics) deletes the Pods, stops the programs, kills
//! whatever of the node still runs, unmounts what it mounted, removes its
//! cgroups, its links and its iptables rules and restores the sysctls that
//! kubelet and the bridge plugin set. [`HostState`] is what a test compares
//! before and after. Only one node runs at a time on a machine (a file lock).
//!
//! The machines have cgroup v1 (hybrid), so kubelet runs with
//! `failCgroupV1: false`; root there lacks CAP_SYS_RESOURCE, so containerd
//! runs with `restrict_oom_score_adj`.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::fcntl::Flock;
use tempfile::TempDir;

use crate::go::Toolchain;
use crate::image::BuiltImage;
use crate::kube::ControlPlane;
use crate::process::{check_output, die_with_parent, run_capture, terminate};
use crate::registry::free_port;
use crate::tool_cache::{self, Key};

/// The node's name.
pub const NODE_NAME: &str = "fnrun-node";

/// The node's own bridge, which holds its address and the pods' veths.
pub const BRIDGE: &str = "fnrunbr0";

/// The node's address, on [`BRIDGE`]: kubelet's `--node-ip`, the pods'
/// gateway.
pub const NODE_IP: &str = "10.244.0.1";

/// The pods' addresses.
pub const POD_CIDR: &str = "10.244.0.0/24";

/// The Service `kube-system/kube-dns`'s address (CoreDNS), which kubelet
/// gives the Pods as their resolver.
pub const CLUSTER_DNS: &str = "10.96.0.10";

/// The pause image's name in containerd (a name only: nothing is pulled).
pub const PAUSE_IMAGE: &str = "fnrun.test/pause:3.10";

/// The cgroup (in every hierarchy) under which kubelet puts the pods.
pub const CGROUP_ROOT: &str = "fnrun-node";

/// The CNI plugins, from Debian's containernetworking-plugins.
pub const CNI_BIN: &str = "/usr/lib/cni";

/// The paths that the node's programs make whatever their configuration
/// says; removed at stop unless they were there before (the deeper ones
/// first, so that what the node made inside a directory that was there
/// goes too).
pub const HARD_CODED_PATHS: [&str; 8] = [
    "/run/containerd/s",
    "/run/containerd",
    "/var/lib/cni",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet",
    "/run/netns",
];

/// The sysctls that kubelet (`vm.overcommit_memory`, `vm.panic_on_oom`,
/// `kernel.panic`, `kernel.panic_on_oops`, `kernel.keys.*`), the bridge
/// plugin (`net.ipv4.ip_forward`) and kube-proxy may set; restored at stop.
pub const SYSCTLS: [&str; 10] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv4/conf/all/forwarding",
    "net/bridge/bridge-nf-call-iptables",
];

/// The version kubelet and kube-proxy report (a release's build stamps it
/// so; unstamped they say `v0.0.0-master`).
const KUBE_VERSION_LDFLAGS: &str = "-X k8s.io/component-base/version.gitVersion=v1.35.4 \
     -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35";

/// fnrun's image in containerd, as [`fnrun_image_archive`] builds it.
pub const FNRUN_IMAGE: &str = "fnrun.test/fnrun:dev";

/// How long the node may take to become Ready.
const STARTUP: Duration = Duration::from_secs(180);

/// The node's programs, built once.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub containerd: PathBuf,
    pub shim: PathBuf,
    pub ctr: PathBuf,
    pub runc: PathBuf,
    pub kubelet: PathBuf,
    pub kube_proxy: PathBuf,
    pub pause: PathBuf,
    pub coredns: PathBuf,
    pub controller_manager: PathBuf,
    pub scheduler: PathBuf,
}

impl Binaries {
    /// Builds (once, in the tool cache) every program of the node.
    pub fn build() -> Result<Binaries> {
        let go = Toolchain::find()?;
        let containerd = |cmd: &str| {
            go.build_upstream(
                "containerd",
                &format!("github.com/containerd/containerd/v2/cmd/{cmd}"),
                cmd,
            )
        };
        Ok(Binaries {
            runc: go.build_upstream_cgo(
                "runc",
                "github.com/opencontainers/runc",
                "runc",
                "seccomp urfave_cli_no_docs",
            )?,
            containerd: containerd("containerd")?,
            shim: containerd("containerd-shim-runc-v2")?,
            ctr: containerd("ctr")?,
            kubelet: go.build_upstream_with(
                "kubelet",
                "k8s.io/kubernetes/cmd/kubelet",
                "kubelet",
                KUBE_VERSION_LDFLAGS,
            )?,
            kube_proxy: go.build_upstream_with(
                "kubelet",
                "k8s.io/kubernetes/cmd/kube-proxy",
                "kube-proxy",
                KUBE_VERSION_LDFLAGS,
            )?,
            pause: pause_binary(&go)?,
            coredns: go.build_upstream("coredns", "github.com/coredns/coredns", "coredns")?,
            controller_manager: go.build_upstream_with(
                "kubelet",
                "k8s.io/kubernetes/cmd/kube-controller-manager",
                "kube-controller-manager",
                KUBE_VERSION_LDFLAGS,
            )?,
            scheduler: go.build_upstream_with(
                "kubelet",
                "k8s.io/kubernetes/cmd/kube-scheduler",
                "kube-scheduler",
                KUBE_VERSION_LDFLAGS,
            )?,
        })
    }
}

/// kubernetes' pause (`build/pause/linux/pause.c` of the module
/// `k8s.io/kubernetes` that `tests/go/upstream/kubelet` pins), compiled
/// with `gcc -static` into the tool cache.
fn pause_binary(go: &Toolchain) -> Result<PathBuf> {
    let source = go
        .module_dir("kubelet", "k8s.io/kubernetes")?
        .join("build/pause/linux/pause.c");
    let gcc = check_output(Command::new("gcc").arg("--version"))?;
    let mut key = Key::new();
    key.part("pause.c", fs::read(&source)?).part("gcc", gcc);
    let entry = tool_cache::dir()
        .join("node")
        .join(format!("pause-{}", key.short()));
    let entry = tool_cache::entry(&entry, |work| {
        check_output(
            Command::new("gcc")
                .args([
                    "-Os",
                    "-Wall",
                    "-Werror",
                    "-static",
                    "-DVERSION=v3.10-fnrun",
                ])
                .arg("-o")
                .arg(work.join("pause"))
                .arg(&source),
        )
        .context("cannot compile pause.c (gcc -static)")?;
        Ok(())
    })?;
    Ok(entry.join("pause"))
}

/// What a node may leave on the host, taken before and after: a test
/// compares the two.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostState {
    /// Processes of the node's programs (by the name of their executable)
    /// or in its cgroups: `pid name`.
    pub processes: Vec<String>,
    /// Mount points of containerd, kubelet, the node's dir or its pods.
    pub mounts: Vec<String>,
    /// The node's cgroups, in every hierarchy.
    pub cgroups: Vec<String>,
    /// Network links: `name type`.
    pub links: Vec<String>,
    /// `iptables-save` and `ip6tables-save`, without counters or comments.
    pub iptables: Vec<String>,
    /// [`SYSCTLS`]' values.
    pub sysctls: BTreeMap<String, String>,
    /// Which of [`HARD_CODED_PATHS`] exist.
    pub paths: Vec<String>,
}

/// The names of the node's programs' executables, as `/proc/PID/comm` has
/// them (15 characters at most).
const PROGRAMS: [&str; 7] = [
    "containerd",
    "containerd-shim",
    "runc",
    "kubelet",
    "kube-proxy",
    "pause",
    "ctr",
];

impl HostState {
    /// The host as it is now.
    pub fn now() -> HostState {
        HostState {
            processes: node_processes(None)
                .into_iter()
                .map(|(pid, name)| format!("{pid} {name}"))
                .collect(),
            mounts: node_mounts(None),
            cgroups: node_cgroups(),
            links: links(),
            iptables: iptables(),
            sysctls: sysctls(),
            paths: HARD_CODED_PATHS
                .iter()
                .filter(|p| Path::new(p).exists())
                .map(|p| (*p).to_owned())
                .collect(),
        }
    }

    /// What differs from `other`, one line each; empty if nothing.
    pub fn diff(&self, other: &HostState) -> Vec<String> {
        fn list(what: &str, a: &[String], b: &[String], out: &mut Vec<String>) {
            // A process of another program that ended meanwhile is no
            // leftover.
            for x in a.iter().filter(|x| !b.contains(x) && what != "process") {
                out.push(format!("{what} gone: {x}"));
            }
            for x in b.iter().filter(|x| !a.contains(x)) {
                out.push(format!("{what} new: {x}"));
            }
        }
        let mut out = Vec::new();
        list("process", &self.processes, &other.processes, &mut out);
        list("mount", &self.mounts, &other.mounts, &mut out);
        list("cgroup", &self.cgroups, &other.cgroups, &mut out);
        list("link", &self.links, &other.links, &mut out);
        list("iptables", &self.iptables, &other.iptables, &mut out);
        list("path", &self.paths, &other.paths, &mut out);
        for (name, value) in &self.sysctls {
            let now = other.sysctls.get(name).map_or("", String::as_str);
            if now != value {
                out.push(format!("sysctl {name}: {value} -> {now}"));
            }
        }
        out
    }
}

/// What [`Node::start_with`] starts beside the node.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// kube-controller-manager and kube-scheduler: Deployments and
    /// DaemonSets make Pods, which are scheduled onto the node.
    pub controllers: bool,
}

/// A control plane and a node registered with it, Ready; everything stopped
/// and cleaned up on drop.
pub struct Node {
    // Dropped in this order after `stop`: the control plane, then the dir.
    cp: Option<ControlPlane>,
    containerd: Option<Child>,
    kubelet: Option<Child>,
    proxy: Option<Child>,
    // kube-controller-manager and kube-scheduler, with `controllers`.
    controllers: Vec<Child>,
    bins: Binaries,
    before: HostState,
    dir: TempDir,
    stopped: bool,
    _lock: Flock<File>,
}

impl Node {
    /// Builds (once) and starts the control plane and the node; returns when
    /// the Node is Ready and the pause image is in containerd.
    pub fn start() -> Result<Node> {
        Node::start_with(Options::default())
    }

    /// [`Node::start`] with `options`.
    pub fn start_with(options: Options) -> Result<Node> {
        let bins = Binaries::build()?;
        // One node at a time on a machine: they share hard-coded paths,
        // iptables chains and sysctls.
        let lock = tool_cache::lock(Path::new("/run/lock"), "fnrun-test-node")?;
        let before = HostState::now();
        let dir = tempfile::Builder::new()
            .prefix("fnrun-node-")
            .tempdir()
            .context("cannot create the node's temp dir")?;
        let mut node = Node {
            cp: None,
            containerd: None,
            kubelet: None,
            proxy: None,
            controllers: Vec::new(),
            bins,
            before,
            dir,
            stopped: false,
            _lock: lock,
        };
        node.start_node(options).map_err(|e| {
            let logs = node.log_tails();
            e.context(logs)
        })?;
        Ok(node)
    }

    fn start_node(&mut self, options: Options) -> Result<()> {
        let root = self.dir.path().to_path_buf();
        let path = |name: &str| root.join(name);
        // The node's bridge and address, before the API server binds it and
        // before kubelet reads its interfaces' addresses.
        if !links().iter().any(|l| l.starts_with(&format!("{BRIDGE} "))) {
            check_output(Command::new("ip").args(["link", "add", BRIDGE, "type", "bridge"]))?;
        }
        check_output(Command::new("ip").args([
            "addr",
            "replace",
            &format!("{NODE_IP}/24"),
            "dev",
            BRIDGE,
        ]))?;
        check_output(Command::new("ip").args(["link", "set", BRIDGE, "up"]))?;
        // The control plane on the node's address: the `kubernetes`
        // Service's endpoint, which kube-proxy routes the pods' calls to.
        self.cp = Some(ControlPlane::start_on(NODE_IP)?);
        if options.controllers {
            self.start_controllers()?;
        }
        for dir in ["containerd", "net.d", "kubelet", "pod-logs", "cni-ipam"] {
            fs::create_dir_all(path(dir))?;
        }

        // The pods' cgroup root, which kubelet wants there, in every
        // hierarchy (v1 controllers, systemd's named one, the unified one).
        for h in fs::read_dir("/sys/fs/cgroup")?.flatten() {
            if h.file_type()?.is_dir() {
                let dir = h.path().join(CGROUP_ROOT);
                if !dir.exists() {
                    fs::create_dir(&dir)
                        .with_context(|| format!("cannot create {}", dir.display()))?;
                }
            }
        }

        // CNI: the bridge plugin on that bridge, host-local addresses.
        let cni = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "fnrun-node",
            "plugins": [{
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": path("cni-ipam"),
                    "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }],
        });
        fs::write(
            path("net.d/10-fnrun-node.conflist"),
            serde_json::to_string_pretty(&cni)?,
        )?;

        // containerd.
        let sock = path("containerd/containerd.sock");
        fs::write(path("containerd.toml"), self.containerd_config())?;
        let bin_dirs = std::env::join_paths([
            self.bins.shim.parent().expect("a binary has a dir"),
            self.bins.runc.parent().expect("a binary has a dir"),
            Path::new("/usr/local/sbin"),
            Path::new("/usr/local/bin"),
            Path::new("/usr/sbin"),
            Path::new("/usr/bin"),
            Path::new("/sbin"),
            Path::new("/bin"),
        ])?;
        let containerd = spawn(
            Command::new(&self.bins.containerd)
                .arg("--config")
                .arg(path("containerd.toml"))
                .env("PATH", &bin_dirs),
            &path("containerd.log"),
        )?;
        self.containerd = Some(containerd);
        self.wait("containerd", |node| {
            Ok(sock.exists()
                && run_capture(node.ctr().args(["version"]), None, Duration::from_secs(10)).code
                    == Some(0))
        })?;

        // The pause image.
        let pause = crate::image::TestImage::scratch()
            .tag("3.10")
            .binary(&self.bins.pause, "/pause")
            .entrypoint(["/pause"])
            .user("65535:65535")
            .build()?;
        self.import_image(&pause, "fnrun.test/pause")?;

        // kubelet, as the admin (the API server authorizes with RBAC only).
        let cp = self.cp.as_ref().expect("the control plane runs");
        let kubelet_port = free_port()?;
        let healthz_port = free_port()?;
        let kubelet_config = serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": false,
            "failSwapOn": false,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{CGROUP_ROOT}"),
            "containerRuntimeEndpoint": format!("unix://{}", sock.display()),
            "address": NODE_IP,
            "port": kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz_port,
            "authentication": {
                "anonymous": {"enabled": true},
                "webhook": {"enabled": false},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "clusterDomain": "cluster.local",
            "clusterDNS": [CLUSTER_DNS],
            "podLogsDir": path("pod-logs"),
            "resolvConf": "/etc/resolv.conf",
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": false,
            "registerNode": true,
            "localStorageCapacityIsolation": false,
        });
        fs::write(
            path("kubelet.yaml"),
            serde_norway::to_string(&kubelet_config)?,
        )?;
        let kubelet = spawn(
            Command::new(&self.bins.kubelet)
                .arg(format!("--config={}", path("kubelet.yaml").display()))
                .arg(format!("--kubeconfig={}", cp.kubeconfig().display()))
                .arg(format!("--hostname-override={NODE_NAME}"))
                .arg(format!("--node-ip={NODE_IP}"))
                .arg(format!("--root-dir={}", path("kubelet").display()))
                .arg("--v=2")
                .env("PATH", &bin_dirs),
            &path("kubelet.log"),
        )?;
        self.kubelet = Some(kubelet);

        // kube-proxy, iptables mode, leaving conntrack's and route_localnet's
        // sysctls as they are.
        let proxy_config = serde_json::json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": cp.kubeconfig()},
            "hostnameOverride": NODE_NAME,
            "clusterCIDR": POD_CIDR,
            "healthzBindAddress": format!("127.0.0.1:{}", free_port()?),
            "metricsBindAddress": format!("127.0.0.1:{}", free_port()?),
            "nodePortAddresses": [format!("{NODE_IP}/32")],
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "iptables": {"localhostNodePorts": false, "syncPeriod": "30s", "minSyncPeriod": "1s"},
        });
        fs::write(
            path("kube-proxy.yaml"),
            serde_norway::to_string(&proxy_config)?,
        )?;
        let proxy = spawn(
            Command::new(&self.bins.kube_proxy)
                .arg(format!("--config={}", path("kube-proxy.yaml").display()))
                .arg("--v=2"),
            &path("kube-proxy.log"),
        )?;
        self.proxy = Some(proxy);

        // Ready.
        self.wait("the Node to be Ready", |node| {
            let out = run_capture(
                node.cp().kubectl_command().args([
                    "get",
                    "node",
                    NODE_NAME,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ]),
                None,
                Duration::from_secs(10),
            );
            Ok(out.code == Some(0) && out.stdout.trim() == "True")
        })?;
        // What the controller manager would make: the default
        // ServiceAccount and the root CA's ConfigMap of `default`.
        self.prepare_namespace("default")?;
        self.start_dns()
    }

    /// CoreDNS as a cluster has it: a Pod in `kube-system` (on the host's
    /// network, at the node's address, which the EndpointSlice below names;
    /// reading the API with its ServiceAccount's token and the RBAC that
    /// kubeadm grants it),
    /// behind the Service `kube-dns` at the `clusterDNS` address that
    /// kubelet gives every Pod. No controller manager makes the Service's
    /// EndpointSlice: it is written here, as that controller would.
    /// Without an upstream (`forward`), CoreDNS's `loop` plugin is left
    /// out: it would find no loop to detect and fail.
    fn start_dns(&mut self) -> Result<()> {
        let image = crate::image::TestImage::scratch()
            .tag("1.13.1")
            .binary(&self.bins.coredns, "/coredns")
            .entrypoint(["/coredns"])
            .build()?;
        let reference = self.import_image(&image, "fnrun.test/coredns")?;
        self.wait("the namespace kube-system", |node| {
            Ok(node
                .kubectl(&["get", "namespace", "kube-system", "-o", "name"])
                .is_ok())
        })?;
        self.prepare_namespace("kube-system")?;
        let ready_port = free_port()?;
        let health_port = free_port()?;
        let api = self.cp().url().to_owned();
        let manifests = format!(
            r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: coredns, namespace: kube-system}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: "system:coredns"}}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: "system:coredns"}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}}
subjects: [{{kind: ServiceAccount, name: coredns, namespace: kube-system}}]
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: coredns, namespace: kube-system}}
data:
  Corefile: |
    .:53 {{
        bind {NODE_IP}
        errors
        health {NODE_IP}:{health_port}
        ready {NODE_IP}:{ready_port}
        kubernetes cluster.local in-addr.arpa ip6.arpa {{
            kubeconfig /etc/coredns/kubeconfig
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }}
        cache 30
    }}
  kubeconfig: |
    apiVersion: v1
    kind: Config
    clusters: [{{name: api, cluster: {{server: "{api}", certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt}}}}]
    users: [{{name: coredns, user: {{tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token}}}}]
    contexts: [{{name: api, context: {{cluster: api, user: coredns}}}}]
    current-context: api
---
apiVersion: v1
kind: Pod
metadata: {{name: coredns, namespace: kube-system, labels: {{k8s-app: kube-dns}}}}
spec:
  nodeName: {NODE_NAME}
  serviceAccountName: coredns
  hostNetwork: true
  dnsPolicy: Default
  containers:
  - name: coredns
    image: {reference}
    imagePullPolicy: Never
    args: ["-conf", "/etc/coredns/Corefile"]
    volumeMounts: [{{name: config, mountPath: /etc/coredns, readOnly: true}}]
    readinessProbe:
      httpGet: {{host: {NODE_IP}, path: /ready, port: {ready_port}}}
      periodSeconds: 1
  volumes:
  - name: config
    configMap: {{name: coredns}}
---
apiVersion: v1
kind: Service
metadata: {{name: kube-dns, namespace: kube-system, labels: {{k8s-app: kube-dns}}}}
spec:
  clusterIP: {CLUSTER_DNS}
  ports:
  - {{name: dns, port: 53, protocol: UDP}}
  - {{name: dns-tcp, port: 53, protocol: TCP}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kube-dns-node
  namespace: kube-system
  labels:
    kubernetes.io/service-name: kube-dns
    endpointslice.kubernetes.io/managed-by: fnrun-tests
addressType: IPv4
endpoints:
- addresses: ["{NODE_IP}"]
  conditions: {{ready: true}}
  nodeName: {NODE_NAME}
ports:
- {{name: dns, port: 53, protocol: UDP}}
- {{name: dns-tcp, port: 53, protocol: TCP}}
"#
        );
        self.cp().apply(&manifests)?;
        self.wait("CoreDNS to be Ready", |node| {
            let out = run_capture(
                node.cp().kubectl_command().args([
                    "get",
                    "pod",
                    "coredns",
                    "-n",
                    "kube-system",
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ]),
                None,
                Duration::from_secs(10),
            );
            Ok(out.code == Some(0) && out.stdout.trim() == "True")
        })
        .with_context(|| {
            self.kubectl(&["get", "pod", "coredns", "-n", "kube-system", "-o", "yaml"])
                .unwrap_or_default()
        })
    }

    /// kube-controller-manager (its default controllers: DaemonSets,
    /// Deployments, EndpointSlices, garbage collection, ServiceAccounts, the
    /// root CA's ConfigMap, ...) and kube-scheduler, as the admin, without
    /// leader election, serving on loopback only.
    fn start_controllers(&mut self) -> Result<()> {
        let root = self.dir.path().to_path_buf();
        let cp = self.cp.as_ref().expect("the control plane runs");
        let kubeconfig = format!("--kubeconfig={}", cp.kubeconfig().display());
        let manager = spawn(
            Command::new(&self.bins.controller_manager)
                .arg(&kubeconfig)
                .arg("--leader-elect=false")
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={}", free_port()?))
                .arg(format!("--cert-dir={}", root.join("kcm-certs").display()))
                .arg(format!("--root-ca-file={}", cp.ca_cert().display()))
                .arg("--use-service-account-credentials=false")
                .arg("--v=2"),
            &root.join("kube-controller-manager.log"),
        )?;
        self.controllers.push(manager);
        let scheduler = spawn(
            Command::new(&self.bins.scheduler)
                .arg(&kubeconfig)
                .arg("--leader-elect=false")
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={}", free_port()?))
                .arg(format!(
                    "--cert-dir={}",
                    root.join("scheduler-certs").display()
                ))
                .arg("--v=2"),
            &root.join("kube-scheduler.log"),
        )?;
        self.controllers.push(scheduler);
        Ok(())
    }

    fn containerd_config(&self) -> String {
        let dir = self.dir.path().join("containerd");
        let d = |name: &str| dir.join(name).display().to_string();
        format!(
            r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[debug]
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".registry]
  config_path = "{certs_d}"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{pause}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  Root = "{runc_root}"
  SystemdCgroup = false

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{cni_bin}"]
  conf_dir = "{conf_dir}"
"#,
            root = d("root"),
            state = d("state"),
            sock = d("containerd.sock"),
            opt = d("opt"),
            pause = PAUSE_IMAGE,
            runc = self.bins.runc.display(),
            runc_root = d("runc"),
            cni_bin = CNI_BIN,
            conf_dir = self.dir.path().join("net.d").display(),
            certs_d = self.dir.path().join("certs.d").display(),
        )
    }

    /// The control plane.
    pub fn cp(&self) -> &ControlPlane {
        self.cp.as_ref().expect("the control plane runs")
    }

    /// `kubectl ARGS` as the admin.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        self.cp().kubectl(args)
    }

    /// `ctr` on the node's containerd, in the CRI's namespace `k8s.io`.
    pub fn ctr(&self) -> Command {
        let mut cmd = Command::new(&self.bins.ctr);
        cmd.arg("--address")
            .arg(self.dir.path().join("containerd/containerd.sock"))
            .args(["--namespace", "k8s.io"]);
        cmd
    }

    /// Imports `image` into containerd as `name:TAG` (its tag), where pods
    /// find it (`imagePullPolicy: Never` or `IfNotPresent`); returns the
    /// name with its tag.
    pub fn import_image(&self, image: &BuiltImage, name: &str) -> Result<String> {
        let archive = image.oci_archive()?;
        let tar = archive
            .trim_start_matches("oci-archive:")
            .rsplit_once(':')
            .map(|(p, _)| p.to_owned())
            .context("an oci-archive reference has a path")?;
        self.import_archive(Path::new(&tar), name, image.tag())
    }

    /// Imports the OCI archive `tar` (one image, tagged `tag` in its index)
    /// into containerd as `name:tag`; returns that.
    pub fn import_archive(&self, tar: &Path, name: &str, tag: &str) -> Result<String> {
        check_output(
            self.ctr()
                .args(["images", "import", "--base-name", name])
                .arg(tar),
        )
        .with_context(|| format!("cannot import {name}"))?;
        let reference = format!("{name}:{tag}");
        let listed = check_output(self.ctr().args(["images", "ls", "-q"]))?;
        if !listed.lines().any(|l| l.trim() == reference) {
            bail!("{reference} is not among containerd's images after the import:\n{listed}");
        }
        Ok(reference)
    }

    /// Lets containerd pull from the plain-HTTP registry at `addr`
    /// (`HOST:PORT`, such as a [`crate::registry::Registry`] on [`NODE_IP`]),
    /// as a cluster's containerd is told of a registry: a `hosts.toml` in its
    /// registry configuration directory (read at each pull).
    pub fn trust_registry(&self, addr: &str) -> Result<()> {
        let dir = self.dir.path().join("certs.d").join(addr);
        fs::create_dir_all(&dir)?;
        fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"http://{addr}\"\n\n[host.\"http://{addr}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )?;
        Ok(())
    }

    /// Creates in `namespace` what kube-controller-manager would: the
    /// `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap.
    pub fn prepare_namespace(&self, namespace: &str) -> Result<()> {
        let ca = fs::read_to_string(self.cp().ca_cert())?;
        let objects = serde_json::json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": "default", "namespace": namespace}},
                {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "kube-root-ca.crt", "namespace": namespace},
                 "data": {"ca.crt": ca}},
            ],
        });
        self.cp().apply(&serde_json::to_string(&objects)?)?;
        Ok(())
    }

    /// The node's temp dir (configuration, state, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The end of every log of the node and its control plane.
    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for name in [
            "containerd.log",
            "kubelet.log",
            "kube-proxy.log",
            "kube-controller-manager.log",
            "kube-scheduler.log",
        ] {
            let text = fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {name} ---\n{}\n",
                lines[lines.len().saturating_sub(40)..].join("\n")
            ));
        }
        if let Some(cp) = &self.cp {
            out.push_str(&cp.log_tails());
        }
        out
    }

    /// Waits until `ready` holds, failing if a program of the node exits.
    fn wait(&mut self, what: &str, ready: impl Fn(&Node) -> Result<bool>) -> Result<()> {
        let deadline = Instant::now() + STARTUP;
        loop {
            for (name, child) in [
                ("containerd", &mut self.containerd),
                ("kubelet", &mut self.kubelet),
                ("kube-proxy", &mut self.proxy),
            ] {
                if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                    bail!("{name} exited ({status}) while waiting for {what}");
                }
            }
            for child in &mut self.controllers {
                if let Some(status) = child.try_wait().ok().flatten() {
                    bail!("a controller exited ({status}) while waiting for {what}");
                }
            }
            if ready(self)? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("no {what} within {STARTUP:?}");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Stops everything and cleans up; returns what it could not undo (also
    /// what differs from the host as it was before the start), empty if
    /// nothing.
    pub fn stop(&mut self) -> Vec<String> {
        if self.stopped {
            return Vec::new();
        }
        self.stopped = true;
        let mut problems = Vec::new();
        let root = self.dir.path().to_path_buf();
        // The controllers first: a DaemonSet's would make its Pods again.
        for mut child in self.controllers.drain(..) {
            terminate(&mut child, Duration::from_secs(10));
        }
        // The pods, as a user deletes them: kubelet stops their containers
        // and tears down their network.
        if let (Some(cp), Some(kubelet)) = (&self.cp, &mut self.kubelet)
            && kubelet.try_wait().ok().flatten().is_none()
        {
            let out = run_capture(
                cp.kubectl_command().args([
                    "delete",
                    "pods",
                    "--all",
                    "--all-namespaces",
                    "--grace-period=5",
                    "--timeout=90s",
                ]),
                None,
                Duration::from_secs(100),
            );
            if out.code != Some(0) {
                problems.push(format!("the pods were not deleted: {out:?}"));
            }
        }
        for child in [self.proxy.take(), self.kubelet.take()]
            .into_iter()
            .flatten()
        {
            let mut child = child;
            terminate(&mut child, Duration::from_secs(10));
        }
        // What kube-proxy undoes itself.
        let _ = run_capture(
            Command::new(&self.bins.kube_proxy).arg("--cleanup"),
            None,
            Duration::from_secs(60),
        );
        if let Some(mut child) = self.containerd.take() {
            terminate(&mut child, Duration::from_secs(10));
        }
        // Whatever still runs: shims, containers, pause. A process in a
        // frozen cgroup (a freezer a runtime inside a pod left FROZEN, such
        // as a sandbox killed while frozen) cannot take a SIGKILL: thaw them.
        thaw_cgroups();
        for _ in 0..20 {
            let left = node_processes(Some(&root));
            if left.is_empty() {
                break;
            }
            for (pid, _) in left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        // Mounts under the node's dir (kubelet's, containerd's rootfs,
        // shm and network namespaces), deepest first.
        for _ in 0..3 {
            let mut mounts = node_mounts(Some(&root));
            if mounts.is_empty() {
                break;
            }
            mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
            for m in mounts {
                let _ = nix::mount::umount2(m.as_str(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
        remove_cgroups();
        // Links: the bridge (the pods' veths go with their namespaces).
        for link in links() {
            let name = link.split(' ').next().unwrap_or_default().to_owned();
            if !self.before.links.contains(&link) {
                let _ = check_output(Command::new("ip").args(["link", "del", &name]));
            }
        }
        if let Err(e) = remove_chains() {
            problems.push(format!("iptables: {e:#}"));
        }
        for (name, value) in &self.before.sysctls {
            let now = fs::read_to_string(Path::new("/proc/sys").join(name)).unwrap_or_default();
            if now.trim() != value
                && let Err(e) = fs::write(Path::new("/proc/sys").join(name), value)
            {
                problems.push(format!("cannot restore {name} to {value}: {e}"));
            }
        }
        for path in HARD_CODED_PATHS {
            if !self.before.paths.iter().any(|p| p == path)
                && Path::new(path).exists()
                && let Err(e) = fs::remove_dir_all(path)
            {
                problems.push(format!("cannot remove {path}: {e}"));
            }
        }
        drop(self.cp.take());
        let after = HostState::now();
        problems.extend(self.before.diff(&after));
        problems
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let problems = self.stop();
        if !problems.is_empty() {
            eprintln!("the node left this behind:\n{}", problems.join("\n"));
        }
    }
}

/// Starts `cmd` with its output in `log`, killed if the test's thread dies.
fn spawn(cmd: &mut Command, log: &Path) -> Result<Child> {
    let file = File::create(log)?;
    die_with_parent(cmd)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}"))
}

/// Processes of the node's programs or in its cgroups (`pid`, `comm`); with
/// `dir`, only those whose command line names it or that are in its cgroups.
fn node_processes(dir: Option<&Path>) -> Vec<(i32, String)> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return out;
    };
    let me = std::process::id();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if u32::try_from(pid) == Ok(me) {
            continue;
        }
        let proc_dir = entry.path();
        let comm = fs::read_to_string(proc_dir.join("comm"))
            .unwrap_or_default()
            .trim()
            .to_owned();
        let cgroup = fs::read_to_string(proc_dir.join("cgroup")).unwrap_or_default();
        let in_cgroup = cgroup.contains(&format!("/{CGROUP_ROOT}/"));
        let ours = match dir {
            Some(dir) => {
                let cmdline = fs::read(proc_dir.join("cmdline")).unwrap_or_default();
                let needle = dir.as_os_str().as_encoded_bytes();
                in_cgroup || cmdline.windows(needle.len()).any(|w| w == needle)
            }
            None => {
                // The tests' builds only: other tests run Debian's runc.
                let built = fs::read_link(proc_dir.join("exe"))
                    .is_ok_and(|exe| exe.starts_with(tool_cache::dir()));
                in_cgroup
                    || (built
                        && PROGRAMS
                            .iter()
                            .any(|p| comm == *p || comm.starts_with("containerd-shim")))
            }
        };
        if ours && !comm.is_empty() {
            out.push((pid, comm));
        }
    }
    out.sort();
    out
}

/// Mount points under `dir`, or (without it) of containerd, kubelet, CNI or a
/// node's dir.
fn node_mounts(dir: Option<&Path>) -> Vec<String> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut out: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| match dir {
            Some(dir) => Path::new(m).starts_with(dir),
            None => {
                m.contains("fnrun-node-")
                    || m.contains("containerd")
                    || m.contains("kubelet")
                    || m.contains("/run/netns")
                    || m.contains("/var/lib/cni")
            }
        })
        .map(str::to_owned)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// [`CGROUP_ROOT`] and what is under it, in every hierarchy.
fn node_cgroups() -> Vec<String> {
    let mut out = Vec::new();
    let Ok(hierarchies) = fs::read_dir("/sys/fs/cgroup") else {
        return out;
    };
    for h in hierarchies.flatten() {
        let top = h.path().join(CGROUP_ROOT);
        if top.is_dir() {
            collect_dirs(&top, &mut out);
        }
    }
    out.sort();
    out
}

fn collect_dirs(dir: &Path, out: &mut Vec<String>) {
    out.push(dir.display().to_string());
    if let Ok(entries) = fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

/// Thaws every frozen cgroup v1 freezer under [`CGROUP_ROOT`]; returns how
/// many it thawed.
fn thaw_cgroups() -> usize {
    let mut dirs = Vec::new();
    let top = Path::new("/sys/fs/cgroup/freezer").join(CGROUP_ROOT);
    if top.is_dir() {
        collect_dirs(&top, &mut dirs);
    }
    dirs.iter()
        .map(|d| Path::new(d).join("freezer.state"))
        .filter(|state| {
            fs::read_to_string(state).is_ok_and(|s| s.trim() != "THAWED")
                && fs::write(state, "THAWED").is_ok()
        })
        .count()
}

/// Removes the node's cgroups, deepest first (their processes are gone).
fn remove_cgroups() {
    for _ in 0..20 {
        let mut dirs = node_cgroups();
        if dirs.is_empty() {
            return;
        }
        dirs.sort_by_key(|d| std::cmp::Reverse(d.len()));
        for d in dirs {
            let _ = fs::remove_dir(&d);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The links a node makes, as `name kind`: [`BRIDGE`], its ports (the
/// pods' veths), and those kube-proxy's other modes and the CNI plugins'
/// defaults would make. Other tests' links on the machine are left out.
fn links() -> Vec<String> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir("/sys/class/net") else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let ours = name == BRIDGE
            || ["cni0", "kube-ipvs0", "kube-bridge", "nodelocaldns"].contains(&name.as_str())
            || fs::read_link(e.path().join("master")).is_ok_and(|m| m.ends_with(BRIDGE));
        if !ours {
            continue;
        }
        let kind = if e.path().join("bridge").exists() {
            "bridge"
        } else if fs::read_link(e.path().join("master")).is_ok() {
            "port"
        } else {
            "-"
        };
        out.push(format!("{name} {kind}"));
    }
    out.sort();
    out
}

/// The rules and chains of iptables and ip6tables that a node makes (those
/// naming `KUBE-`, `CNI-` or the pods' network), without counters.
fn iptables() -> Vec<String> {
    let mut out = Vec::new();
    for save in ["iptables-save", "ip6tables-save"] {
        let text = check_output(&mut Command::new(save)).unwrap_or_default();
        for line in text.lines() {
            if line.starts_with('#')
                || !(line.contains("KUBE-") || line.contains("CNI-") || line.contains("10.244."))
            {
                continue;
            }
            let line = match line.rfind(" [") {
                Some(i) if line.starts_with(':') => &line[..i],
                _ => line,
            };
            out.push(format!("{save}: {line}"));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Removes the chains named `KUBE-*` and `CNI-*` (kube-proxy's, kubelet's,
/// the CNI plugins') and the rules that jump to them, in every table of
/// iptables and ip6tables.
fn remove_chains() -> Result<()> {
    let ours = |chain: &str| chain.starts_with("KUBE-") || chain.starts_with("CNI-");
    for (save, restore) in [
        ("iptables-save", "iptables-restore"),
        ("ip6tables-save", "ip6tables-restore"),
    ] {
        let text = check_output(&mut Command::new(save))?;
        let mut script = String::new();
        let mut table = String::new();
        let mut deletes = Vec::new();
        let mut chains = Vec::new();
        let mut flush = |table: &str, deletes: &mut Vec<String>, chains: &mut Vec<String>| {
            if table.is_empty() || (deletes.is_empty() && chains.is_empty()) {
                return;
            }
            script.push_str(&format!("*{table}\n"));
            for d in deletes.drain(..) {
                script.push_str(&d);
                script.push('\n');
            }
            for c in chains.iter() {
                script.push_str(&format!("-F {c}\n"));
            }
            for c in chains.drain(..) {
                script.push_str(&format!("-X {c}\n"));
            }
            script.push_str("COMMIT\n");
        };
        for line in text.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = name.to_owned();
            } else if line == "COMMIT" {
                flush(&table, &mut deletes, &mut chains);
                table.clear();
            } else if let Some(decl) = line.strip_prefix(':') {
                let chain = decl.split(' ').next().unwrap_or_default();
                if ours(chain) {
                    chains.push(chain.to_owned());
                }
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let chain = rule.split(' ').next().unwrap_or_default();
                let target = rule
                    .split(' ')
                    .skip_while(|w| *w != "-j" && *w != "-g")
                    .nth(1)
                    .unwrap_or_default();
                if !ours(chain) && ours(target) {
                    deletes.push(format!("-D {rule}"));
                }
            }
        }
        if script.is_empty() {
            continue;
        }
        let out = run_capture(
            Command::new(restore).arg("--noflush"),
            Some(script.as_bytes()),
            Duration::from_secs(30),
        );
        if out.code != Some(0) {
            bail!("{restore} --noflush failed ({out:?}) on:\n{script}");
        }
    }
    Ok(())
}

/// [`SYSCTLS`] as they are (those that exist).
fn sysctls() -> BTreeMap<String, String> {
    SYSCTLS
        .iter()
        .filter_map(|name| {
            fs::read_to_string(Path::new("/proc/sys").join(name))
                .ok()
                .map(|v| ((*name).to_owned(), v.trim().to_owned()))
        })
        .collect()
}

/// fnrun's image as `scripts/build-image` makes it (the dev profile, as
/// tests/tests/deploy.rs builds it), tagged [`FNRUN_IMAGE`], written as an
/// OCI archive into `dir` (for [`Node::import_archive`]); returns the
/// archive.
pub fn fnrun_image_archive(dir: &Path) -> Result<PathBuf> {
    let repo = crate::workspace_root();
    let archive = dir.join("fnrun.tar");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("target"))
        .join("image");
    let out = run_capture(
        Command::new(repo.join("scripts/build-image"))
            .arg(FNRUN_IMAGE)
            .env("CARGO_TARGET_DIR", &target)
            .env("FNRUN_BUILDAH_ROOT", dir.join("root"))
            .env("FNRUN_BUILDAH_RUNROOT", dir.join("runroot"))
            .env("FNRUN_IMAGE_ARCHIVE", &archive)
            .env("BUILDAH_ISOLATION", "chroot")
            .env("CARGO_NET_OFFLINE", "true")
            .env("FNRUN_CARGO_PROFILE", "dev")
            .env("CARGO_INCREMENTAL", "0")
            .env_remove("RUSTFLAGS"),
        None,
        Duration::from_secs(3600),
    );
    if out.code != Some(0) {
        bail!("scripts/build-image failed: {out:?}");
    }
    Ok(archive)
}
