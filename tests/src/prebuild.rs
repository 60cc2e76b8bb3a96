//! Everything the tests build or fetch into their tool cache, built ahead of
//! the tests that need it (`fnrun-prebuild`, which `scripts/test` starts in
//! the background once the workspace is built).
//!
//! On a fresh machine the Go programs alone take most of an hour of CPU
//! (kube-apiserver, Crossplane's core and CLI, etcd). Built inside the tests,
//! each build sits on the suite's critical path: the test that first needs it
//! waits, and nothing else runs meanwhile. Built here, they overlap the
//! compilation of the test binaries and the tests that are waiting on
//! processes and sockets rather than on the CPU. The tests still call the same
//! builders ([`tool_cache::entry`](crate::tool_cache::entry)): an entry that is being built here is
//! waited for under its lock, one that is built is used, one that failed here
//! is built again there and fails with its own error.
//!
//! Two lanes run at once: the large Go builds, in the order the tests need
//! them (alphabetically by test binary), and everything small (the tests' own
//! Go programs, grpc-java, kustomize, the Python stubs and the Python SDK
//! function's image). Each builder lowers its own priority.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::crossplane::{self, AUTO_READY, PATCH_AND_TRANSFORM};
use crate::tool_cache::Protos;

/// One thing to build: its name and its builder.
pub struct Item {
    pub name: &'static str,
    pub build: fn() -> Result<()>,
}

/// What one [`Item`] came to.
pub struct Built {
    pub name: &'static str,
    pub took: Duration,
    pub result: Result<()>,
}

/// The large Go builds, in the order the tests first need them
/// (`crossplane_controller`, `crossplane_kubernetes`, `crossplane_render`,
/// `kube_control_plane`, `node`, `node_crossplane`).
pub fn large() -> Vec<Item> {
    vec![
        Item {
            name: "etcd",
            build: || crate::kube::etcd_binary().map(drop),
        },
        Item {
            name: "kube-apiserver",
            build: || crate::kube::apiserver_binary().map(drop),
        },
        Item {
            name: "crossplane core",
            build: || crossplane::crossplane_binary().map(drop),
        },
        Item {
            name: "crossplane CRDs",
            build: || crossplane::crds_dir().map(drop),
        },
        Item {
            name: PATCH_AND_TRANSFORM.name,
            build: || PATCH_AND_TRANSFORM.image().map(drop),
        },
        Item {
            name: AUTO_READY.name,
            build: || AUTO_READY.image().map(drop),
        },
        Item {
            name: "crossplane CLI",
            build: || crossplane::render::crossplane_cli().map(drop),
        },
        Item {
            name: "kubernetes node (runc, containerd, kubelet, kube-proxy, pause, CoreDNS)",
            build: || crate::node::Binaries::build().map(drop),
        },
        Item {
            name: "crossplane v1.13 core",
            build: || crossplane::pod::v1_binary().map(drop),
        },
    ]
}

/// Everything else, quick on its own.
pub fn small() -> Vec<Item> {
    vec![
        Item {
            name: "tests/go/runfunction",
            build: || crate::grpc_clients::go_runfunction().map(drop),
        },
        Item {
            name: "tests/go/crossplaneclient",
            build: || crossplane::client_binary().map(drop),
        },
        Item {
            name: "tests/go/crossplanefn",
            build: || crossplane::function_binary().map(drop),
        },
        Item {
            name: "tests/go/evaluate",
            build: || {
                crate::go::Toolchain::find()?
                    .build("evaluate", &[Protos::fnrun_evaluator()])
                    .map(drop)
            },
        },
        Item {
            name: "tests/go/krmfn",
            build: || crate::go::krm_function_binary().map(drop),
        },
        Item {
            name: "tests/java (grpc-java)",
            build: || crate::java::grpc_java_client().map(drop),
        },
        Item {
            name: "kustomize",
            build: || crate::krm::kustomize().map(drop),
        },
        Item {
            name: "kustomize 5.5.0",
            build: || crate::krm::kustomize5(crate::krm::KUSTOMIZE_5[0]).map(drop),
        },
        Item {
            name: "kustomize 5.7.1",
            build: || crate::krm::kustomize5(crate::krm::KUSTOMIZE_5[1]).map(drop),
        },
        Item {
            name: "python stubs: v1alpha1",
            build: || python(Protos::fnrun_v1alpha1),
        },
        Item {
            name: "python stubs: evaluator",
            build: || python(Protos::fnrun_evaluator),
        },
        Item {
            name: "python stubs: crossplane v1",
            build: || python(Protos::crossplane_v1),
        },
        Item {
            name: "python SDK function image",
            build: || crossplane::python_sdk_image().map(drop),
        },
    ]
}

/// Python stubs for `protos`, in the tests' venv.
fn python(protos: fn() -> Protos) -> Result<()> {
    crate::python::Python::get()?.stubs(&[protos()]).map(drop)
}

/// Builds `items` one after the other, calling `report` after each.
pub fn run(items: Vec<Item>, report: impl Fn(&Built)) -> Vec<Built> {
    items
        .into_iter()
        .map(|item| {
            let start = Instant::now();
            let result = (item.build)();
            let built = Built {
                name: item.name,
                took: start.elapsed(),
                result,
            };
            report(&built);
            built
        })
        .collect()
}
