//! A real Kubernetes node (`fnrun_tests::node`: containerd, runc, kubelet,
//! kube-proxy, CoreDNS, the CNI bridge plugin, built from their modules)
//! runs a Pod: a busybox image built by the tests, imported into
//! containerd, runs to completion, its log is what it printed (including
//! the cluster DNS's answer); with the controller manager and scheduler, a
//! DaemonSet's Pod; a Pod reaches the API server through the `kubernetes`
//! Service with its ServiceAccount's token (in-cluster configuration); and
//! fnrun's own DaemonSet (`deploy/`) serving a
//! v1alpha1 call through its hostPath socket. Once each is deleted and the
//! node stopped, nothing of the node is left on the host: no process,
//! mount, cgroup, link, iptables rule or changed sysctl.

use std::time::{Duration, Instant};

use std::sync::Mutex;

use fnrun_tests::image::TestImage;
use fnrun_tests::node::{
    FNRUN_IMAGE, HostState, NODE_IP, NODE_NAME, Node, Options, fnrun_image_archive,
};

/// One test at a time: each compares the host before and after its node.
static ONE_NODE: Mutex<()> = Mutex::new(());

#[test]
fn a_pod_runs_to_completion_on_a_real_node_and_the_node_leaves_nothing_behind() {
    if !fnrun_tests::user::is_root() {
        eprintln!("skipped: a Kubernetes node needs root");
        return;
    }
    let _one = ONE_NODE.lock().unwrap_or_else(|e| e.into_inner());
    let before = HostState::now();
    let mut node = Node::start().expect("the node starts and is Ready");

    // The node is what it says: registered with its address, and it made
    // what the check after the stop looks for (so that check can fail).
    let addresses = node
        .kubectl(&[
            "get",
            "node",
            NODE_NAME,
            "-o",
            "jsonpath={.status.addresses[?(@.type==\"InternalIP\")].address}",
        ])
        .unwrap();
    assert_eq!(addresses.trim(), NODE_IP);

    let image = TestImage::busybox()
        .tag("node")
        .cmd([
            "/bin/sh",
            "-c",
            "echo hello from the node; grep -c fnrun-node /proc/self/cgroup; \
             nslookup kubernetes.default.svc.cluster.local",
        ])
        .build()
        .unwrap();
    let reference = node.import_image(&image, "fnrun.test/busybox").unwrap();
    let pod = format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: hello, namespace: default}}
spec:
  nodeName: {NODE_NAME}
  restartPolicy: Never
  automountServiceAccountToken: false
  containers:
  - name: hello
    image: {reference}
    imagePullPolicy: Never
"#
    );
    node.cp().apply(&pod).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let phase = loop {
        let phase = node
            .kubectl(&["get", "pod", "hello", "-o", "jsonpath={.status.phase}"])
            .unwrap();
        if phase == "Succeeded" || phase == "Failed" || Instant::now() > deadline {
            break phase;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let describe = || {
        format!(
            "{}\n{}",
            node.kubectl(&["get", "pod", "hello", "-o", "yaml"])
                .unwrap_or_default(),
            node.log_tails()
        )
    };
    assert_eq!(phase, "Succeeded", "{}", describe());
    // The log, through the API server and kubelet, as a user reads it.
    let log = node.kubectl(&["logs", "hello"]).unwrap();
    let mut lines = log.lines();
    assert_eq!(lines.next(), Some("hello from the node"), "{log}");
    // Its cgroups are under the node's.
    assert_ne!(lines.next(), Some("0"), "{log}");
    // The cluster's DNS (CoreDNS behind the Service kube-dns, through
    // kube-proxy's rules) answers with the API server's Service address.
    assert!(
        log.contains("Address: 10.96.0.1\n") || log.contains("Address: 10.96.0.1 "),
        "{log}"
    );
    // A pod's IP from the node's network.
    let ip = node
        .kubectl(&["get", "pod", "hello", "-o", "jsonpath={.status.podIP}"])
        .unwrap();
    assert!(ip.starts_with("10.244.0."), "{ip}: {}", describe());

    // In-cluster configuration, as a client library finds it: the
    // `kubernetes` Service's address in the environment, the token kubelet
    // projects for the pod's ServiceAccount and the CA of `kube-root-ca.crt`.
    // kubectl (a static binary) in a pod reaches the API server through the
    // Service, by its address and by its name, and is who its ServiceAccount
    // is: what RBAC grants it is allowed, nothing more.
    let kubectl = std::fs::canonicalize(fnrun_tests::kube::KUBECTL).unwrap();
    let image = TestImage::busybox()
        .tag("api")
        .binary(kubectl, "/bin/kubectl")
        .cmd([
            "/bin/sh",
            "-c",
            "echo $KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT; \
             kubectl auth whoami -o jsonpath='{.status.userInfo.username}'; echo; \
             kubectl get configmap kube-root-ca.crt -o name; \
             kubectl get secrets 2>&1 | grep -o 'cannot list resource \"secrets\"'; \
             sa=/var/run/secrets/kubernetes.io/serviceaccount; \
             kubectl --server=https://kubernetes.default.svc --certificate-authority=$sa/ca.crt \
               --token=\"$(cat $sa/token)\" get --raw /readyz; echo",
        ])
        .build()
        .unwrap();
    let reference = node.import_image(&image, "fnrun.test/busybox").unwrap();
    node.cp()
        .apply(&format!(
            r#"apiVersion: v1
kind: ServiceAccount
metadata: {{name: reader, namespace: default}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: reader, namespace: default}}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: reader, namespace: default}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: reader}}
subjects: [{{kind: ServiceAccount, name: reader, namespace: default}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: api, namespace: default}}
spec:
  nodeName: {NODE_NAME}
  restartPolicy: Never
  serviceAccountName: reader
  containers:
  - name: api
    image: {reference}
    imagePullPolicy: Never
    env: [{{name: HOME, value: /tmp}}]
"#
        ))
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let phase = loop {
        let phase = node
            .kubectl(&["get", "pod", "api", "-o", "jsonpath={.status.phase}"])
            .unwrap();
        if phase == "Succeeded" || phase == "Failed" || Instant::now() > deadline {
            break phase;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let log = node.kubectl(&["logs", "api"]).unwrap_or_default();
    assert_eq!(phase, "Succeeded", "{log}\n{}", node.log_tails());
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        [
            "10.96.0.1:443",
            "system:serviceaccount:default:reader",
            "configmap/kube-root-ca.crt",
            "cannot list resource \"secrets\"",
            "ok",
        ],
        "{log}"
    );
    node.kubectl(&["delete", "pod", "api", "--timeout=60s"])
        .unwrap();

    let during = HostState::now();
    let made = before.diff(&during);
    for what in ["link new", "iptables new", "cgroup new", "process new"] {
        assert!(
            made.iter().any(|d| d.starts_with(what)),
            "the node made no {what}: {made:#?}"
        );
    }
    assert!(
        made.iter().any(|d| d.starts_with("sysctl")),
        "kubelet and the bridge plugin set no sysctl: {made:#?}"
    );

    node.kubectl(&["delete", "pod", "hello", "--timeout=60s"])
        .unwrap();
    let gone = node.kubectl(&["get", "pods", "-o", "name"]).unwrap();
    assert_eq!(gone.trim(), "", "{}", describe());

    let problems = node.stop();
    assert!(problems.is_empty(), "left behind: {problems:#?}");
    let after = HostState::now();
    assert_eq!(before.diff(&after), Vec::<String>::new());
}

/// With the controller manager and the scheduler, a DaemonSet applied as a
/// user applies one makes its Pod, which is scheduled onto the node and
/// turns Ready; deleting the DaemonSet deletes the Pod (garbage collection).
#[test]
fn a_daemonsets_pod_is_scheduled_onto_the_node_and_turns_ready() {
    if !fnrun_tests::user::is_root() {
        eprintln!("skipped: a Kubernetes node needs root");
        return;
    }
    let _one = ONE_NODE.lock().unwrap_or_else(|e| e.into_inner());
    let before = HostState::now();
    let mut node =
        Node::start_with(Options { controllers: true }).expect("the node starts and is Ready");
    let image = TestImage::busybox()
        .tag("daemon")
        .cmd(["/bin/sh", "-c", "echo serving; exec sleep 3600"])
        .build()
        .unwrap();
    let reference = node.import_image(&image, "fnrun.test/busybox").unwrap();
    node.cp()
        .apply(&format!(
            r#"apiVersion: apps/v1
kind: DaemonSet
metadata: {{name: daemon, namespace: default}}
spec:
  selector: {{matchLabels: {{app: daemon}}}}
  template:
    metadata: {{labels: {{app: daemon}}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: daemon
        image: {reference}
        imagePullPolicy: Never
        readinessProbe:
          exec: {{command: [/bin/true]}}
          periodSeconds: 1
"#
        ))
        .unwrap();
    let out = node.kubectl(&["rollout", "status", "daemonset/daemon", "--timeout=120s"]);
    assert!(out.is_ok(), "{out:?}\n{}", node.log_tails());
    let pods = node
        .kubectl(&[
            "get",
            "pods",
            "-l",
            "app=daemon",
            "-o",
            "jsonpath={range .items[*]}{.spec.nodeName} {.status.phase}{\"\\n\"}{end}",
        ])
        .unwrap();
    assert_eq!(pods.trim(), format!("{NODE_NAME} Running"));
    // Its log, through the API server and kubelet.
    let log = node.kubectl(&["logs", "daemonset/daemon"]).unwrap();
    assert_eq!(log.trim(), "serving");

    node.kubectl(&[
        "delete",
        "daemonset",
        "daemon",
        "--cascade=foreground",
        "--timeout=60s",
    ])
    .unwrap();
    let pods = node.kubectl(&["get", "pods", "-o", "name"]).unwrap();
    assert_eq!(pods.trim(), "", "{}", node.log_tails());

    let problems = node.stop();
    assert!(problems.is_empty(), "left behind: {problems:#?}");
    assert_eq!(before.diff(&HostState::now()), Vec::<String>::new());
}

/// The directories `deploy/daemonset.yaml` mounts from the host
/// (`hostPath`, `DirectoryOrCreate`: kubelet makes them).
const HOST_PATHS: [&str; 2] = ["/var/cache/fnrun", "/var/run/fnrun"];

/// Removes those of [`HOST_PATHS`] that were not there when it was made.
struct HostPaths(Vec<&'static str>);

impl HostPaths {
    fn new() -> HostPaths {
        HostPaths(
            HOST_PATHS
                .into_iter()
                .filter(|p| !std::path::Path::new(p).exists())
                .collect(),
        )
    }
}

impl Drop for HostPaths {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// `deploy/daemonset.yaml` applied as a user applies it (its namespace and
/// ServiceAccount first), with fnrun's image as `scripts/build-image` makes
/// it and the tests' registry (on the node's bridge, plain HTTP) named
/// insecure: the Pod turns Ready (its gRPC probe), and a v1alpha1 call
/// through the socket on the hostPath runs a function in its sandbox inside
/// the Pod.
#[test]
fn fnruns_daemonset_runs_a_function_through_its_hostpath_socket() {
    fnrun_daemonset_serves("daemonset.yaml", "fnrun", Limits::Enforced, |_, _| {});
}

/// The rootless variant, `deploy/rootless/daemonset.yaml`, installed as
/// docs/deployment.md says: its Localhost seccomp profile in kubelet's
/// `seccomp/fnrun/fnrun.json`, its `chown` init container's busybox
/// imported too. A Pod in its own user namespace (`hostUsers: false`), as
/// uid 65532 without a capability, its /proc unmasked: it turns Ready and
/// runs the function.
#[test]
fn fnruns_rootless_daemonset_runs_a_function_through_its_hostpath_socket() {
    fnrun_daemonset_serves(
        "rootless/daemonset.yaml",
        "fnrun-rootless",
        Limits::Refused,
        |node, daemonset| {
            let profile = node.dir().join("kubelet/seccomp/fnrun/fnrun.json");
            std::fs::create_dir_all(profile.parent().unwrap()).unwrap();
            std::fs::copy(
                fnrun_tests::workspace_root().join("deploy/seccomp/fnrun.json"),
                &profile,
            )
            .unwrap();
            let busybox = TestImage::busybox()
                .tag("init")
                .symlink("/bin/chown", "busybox")
                .build()
                .unwrap();
            let reference = node.import_image(&busybox, "fnrun.test/busybox").unwrap();
            daemonset["spec"]["template"]["spec"]["initContainers"][0]["image"] = reference.into();
        },
    );
}

/// What a DaemonSet variant does with a call's memory limit on this node
/// (cgroup v1): the root one enforces it; the rootless one may write no
/// cgroup and refuses the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limits {
    Enforced,
    Refused,
}

/// `deploy/MANIFEST` (the DaemonSet `name`) applied as a user applies it
/// (its namespace and ServiceAccount first), after `prepare` (which may
/// install what its docs say and adjust it), with fnrun's image as
/// `scripts/build-image` makes it and the tests' registry (on the node's
/// bridge, plain HTTP) named insecure: the Pod turns Ready (its gRPC probe),
/// and a v1alpha1 call through the socket on the hostPath runs a function in
/// its sandbox inside the Pod; a 32Mi memory limit is enforced or refused
/// (`limits`), a timeout ends a run, an isolated run cannot reach the
/// node's address, `deploy/service.yaml` carries a call over TCP, and
/// Porch's evaluator answers on the socket (grpc-go). Nothing is left on the host once it is deleted.
fn fnrun_daemonset_serves(
    manifest: &str,
    name: &str,
    limits: Limits,
    prepare: impl Fn(&Node, &mut serde_json::Value),
) {
    if !fnrun_tests::user::is_root() {
        eprintln!("skipped: a Kubernetes node needs root");
        return;
    }
    let _one = ONE_NODE.lock().unwrap_or_else(|e| e.into_inner());
    let build = tempfile::tempdir().unwrap();
    let archive = fnrun_image_archive(build.path()).unwrap();
    let host_paths = HostPaths::new();
    let before = HostState::now();
    let mut node =
        Node::start_with(Options { controllers: true }).expect("the node starts and is Ready");
    let (image_name, tag) = FNRUN_IMAGE.rsplit_once(':').unwrap();
    let image = node.import_archive(&archive, image_name, tag).unwrap();
    let registry = fnrun_tests::registry::Registry::start_on(NODE_IP).unwrap();
    let function = TestImage::echo().push_to(&registry, "fns/echo:v1");
    // The shell keeps 200 MB of command output in memory.
    let hungry = TestImage::script(
        "#!/bin/sh\ncat >/dev/null\nx=$(head -c 200000000 /dev/zero | tr '\\0' a)\necho ${#x} >&2\n",
    )
    .push_to(&registry, "fns/hungry:v1");
    let sleepy = TestImage::script("#!/bin/sh\nsleep 60\n").push_to(&registry, "fns/sleepy:v1");
    // Reaches for the registry on the node's address: an isolated run has
    // no route there, and echoes its input only then.
    let reaching = TestImage::script(&format!(
        "#!/bin/sh\nif wget -q -T 3 -O /dev/null http://{}/v2/; then echo reached >&2; exit 3; fi\ncat\n",
        registry.addr()
    ))
    .push_to(&registry, "fns/reaching:v1");

    let deploy = fnrun_tests::workspace_root().join("deploy");
    for file in ["namespace.yaml", "serviceaccount.yaml"] {
        node.kubectl(&["apply", "-f", &deploy.join(file).display().to_string()])
            .unwrap();
    }
    let text = std::fs::read_to_string(deploy.join(manifest)).unwrap();
    let mut daemonset: serde_json::Value = serde_norway::from_str(&text).unwrap();
    prepare(&node, &mut daemonset);
    let container = &mut daemonset["spec"]["template"]["spec"]["containers"][0];
    container["image"] = image.clone().into();
    container["args"]
        .as_array_mut()
        .unwrap()
        .push(format!("--insecure-registry={}", registry.addr()).into());
    node.cp()
        .apply(&serde_json::to_string(&daemonset).unwrap())
        .unwrap();
    let daemonset = format!("daemonset/{name}");
    let out = node.kubectl(&[
        "rollout",
        "status",
        &daemonset,
        "-n",
        "fnrun-system",
        "--timeout=180s",
    ]);
    let describe = || {
        format!(
            "{}\n{}\n{}",
            node.kubectl(&["get", "pods", "-n", "fnrun-system", "-o", "yaml"])
                .unwrap_or_default(),
            node.kubectl(&["logs", &daemonset, "-n", "fnrun-system", "--all-containers"])
                .unwrap_or_default(),
            node.log_tails()
        )
    };
    assert!(out.is_ok(), "{out:?}\n{}", describe());

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let response = runtime.block_on(async {
        let channel =
            fnrun_tests::client::channel_unix(std::path::Path::new("/var/run/fnrun/fn.sock"))
                .await
                .expect("the hostPath socket answers");
        let mut client = fnrun_tests::client::Client::new(channel);
        fnrun_tests::client::run_function(
            &mut client,
            fnrun_tests::client::Run::new(&function, fnrun_tests::functionio::SAMPLE).build(),
        )
        .await
    });
    let response = response.unwrap_or_else(|e| panic!("{e:?}\n{}", describe()));
    // The echo function's output is its input.
    fnrun_tests::functionio::assert_same_yaml(
        &String::from_utf8_lossy(&response.output),
        fnrun_tests::functionio::SAMPLE,
    );

    // Its sandbox inside the Pod: a memory limit (enforced or refused, as
    // the variant can), a timeout, no network.
    use fnrun_tests::client::Run;
    let call = |run: Run| {
        runtime.block_on(async {
            let channel =
                fnrun_tests::client::channel_unix(std::path::Path::new("/var/run/fnrun/fn.sock"))
                    .await
                    .expect("the hostPath socket answers");
            let mut client = fnrun_tests::client::Client::new(channel);
            fnrun_tests::client::run_function(&mut client, run.build()).await
        })
    };
    let limited = call(
        Run::new(&hungry, fnrun_tests::functionio::SAMPLE)
            .memory("32Mi")
            .timeout(std::time::Duration::from_secs(60)),
    )
    .expect_err("200 MB in 32Mi");
    match limits {
        Limits::Enforced => assert_eq!(
            limited.code(),
            tonic::Code::ResourceExhausted,
            "{limited:?}\n{}",
            describe()
        ),
        Limits::Refused => {
            assert_eq!(
                limited.code(),
                tonic::Code::FailedPrecondition,
                "{limited:?}"
            );
            assert!(
                limited
                    .message()
                    .contains("memory limit cannot be enforced"),
                "{limited:?}"
            );
        }
    }
    let timed_out = call(
        Run::new(&sleepy, fnrun_tests::functionio::SAMPLE)
            .timeout(std::time::Duration::from_secs(2)),
    )
    .expect_err("60 s in 2 s");
    assert_eq!(
        timed_out.code(),
        tonic::Code::DeadlineExceeded,
        "{timed_out:?}"
    );
    let isolated = call(Run::new(&reaching, fnrun_tests::functionio::SAMPLE))
        .unwrap_or_else(|e| panic!("an isolated run reached the registry: {e:?}"));
    fnrun_tests::functionio::assert_same_yaml(
        &String::from_utf8_lossy(&isolated.output),
        fnrun_tests::functionio::SAMPLE,
    );

    // The node-local Service (deploy/service.yaml, internalTrafficPolicy
    // Local): the same runner over TCP, through kube-proxy.
    node.kubectl(&[
        "apply",
        "-f",
        &deploy.join("service.yaml").display().to_string(),
    ])
    .unwrap();
    let cluster_ip = node
        .kubectl(&[
            "get",
            "service",
            "fnrun",
            "-n",
            "fnrun-system",
            "-o",
            "jsonpath={.spec.clusterIP}",
        ])
        .unwrap();
    let addr = format!("{}:9443", cluster_ip.trim());
    let over_tcp = fnrun_tests::wait_for(std::time::Duration::from_secs(60), || {
        runtime.block_on(async {
            let channel = fnrun_tests::client::channel_tcp(&addr, None).await.ok()?;
            let mut client = fnrun_tests::client::Client::new(channel);
            fnrun_tests::client::run_function(
                &mut client,
                Run::new(&function, fnrun_tests::functionio::SAMPLE).build(),
            )
            .await
            .ok()
        })
    })
    .unwrap_or_else(|| {
        panic!(
            "no call through the node-local Service at {addr}\n{}",
            describe()
        )
    });
    fnrun_tests::functionio::assert_same_yaml(
        &String::from_utf8_lossy(&over_tcp.output),
        fnrun_tests::functionio::SAMPLE,
    );

    // Porch's evaluator on the same socket, through grpc-go.
    let evaluated = fnrun_tests::krm::go_evaluate(
        "unix:/var/run/fnrun/fn.sock",
        false,
        &[&function],
        "",
        fnrun_tests::krm::RESOURCE_LIST.as_bytes(),
    )
    .unwrap_or_else(|e| panic!("{e:?}\n{}", describe()));
    assert_eq!(evaluated.len(), 1);
    assert_eq!(evaluated[0].code, "OK", "{evaluated:?}");
    fnrun_tests::functionio::assert_same_yaml(
        &evaluated[0].resource_list,
        fnrun_tests::krm::RESOURCE_LIST,
    );

    node.kubectl(&[
        "delete",
        &daemonset,
        "-n",
        "fnrun-system",
        "--cascade=foreground",
        "--timeout=90s",
    ])
    .unwrap();
    let problems = node.stop();
    assert!(problems.is_empty(), "left behind: {problems:#?}");
    drop(host_paths);
    assert_eq!(before.diff(&HostState::now()), Vec::<String>::new());
}
