//! How a cached image becomes a sandbox [`RunSpec`]: the one routine for
//! every kind of run, a per-call run of [`crate::runner::Runner`] (FunctionIO
//! or KRM) and a function server of the function host.
//!
//! The image's config is honoured as a container runtime honours it:
//! `Entrypoint` + `Cmd` (then the caller's extra arguments), `Env` (a default
//! `PATH` and `HOME` when it has none; the caller's variables replace the
//! image's), `WorkingDir` (`/` when empty) and `User`, resolved in the image's
//! own root ([`crate::user`]), or whom the caller asks for ([`RunAs`]). A
//! rootless runner maps one id, its own, to 0: every function then runs as
//! 0:0 inside.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use fnrun_cache::Image;
use fnrun_sandbox::{BindMount, HostUser, IdMap, Limits, Network, RunSpec};

use crate::error::RunError;
use crate::user;

/// Whom the function runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunAs {
    /// The image's `User`, as container runtimes run it.
    #[default]
    Image,
    /// `nobody`, as kpt runs KRM functions: the image's own `nobody` if its
    /// `/etc/passwd` has one, else 65534:65534.
    Nobody,
    /// This host user, mapped into the run (see [`HostUser`]): kpt's
    /// `--as-current-user`.
    Host(HostUser),
}

/// What the caller adds to the image's own config.
#[derive(Debug, Clone, Default)]
pub struct SpecOptions<'a> {
    /// Appended after `Entrypoint` + `Cmd`.
    pub extra_args: &'a [String],
    /// `KEY=VALUE`; a key the image sets too takes this value.
    pub extra_env: &'a [String],
    pub network: Network,
    pub limits: Limits,
    pub run_as: RunAs,
    /// Host paths mounted into the run.
    pub mounts: &'a [BindMount],
}

/// The run spec of `image` under `id_map`.
pub fn run_spec(
    image: &Image,
    id_map: &IdMap,
    options: &SpecOptions<'_>,
) -> Result<RunSpec, RunError> {
    let ids = ids(image, id_map, options.run_as)?;
    let mut argv = image.config.entrypoint.clone();
    argv.extend(image.config.cmd.iter().cloned());
    argv.extend(options.extra_args.iter().cloned());
    let mut env = image.config.env.clone();
    if !env.iter().any(|e| e.starts_with("PATH=")) {
        env.push(format!("PATH={}", fnrun_sandbox::DEFAULT_PATH));
    }
    if !env.iter().any(|e| e.starts_with("HOME=")) {
        env.push(format!("HOME={}", ids.home));
    }
    let key = |pair: &str| pair.split_once('=').map_or(pair, |(k, _)| k).to_owned();
    for pair in options.extra_env {
        let k = key(pair);
        env.retain(|e| key(e) != k);
        env.push(pair.clone());
    }
    let workdir = if image.config.working_dir.is_empty() {
        "/".to_owned()
    } else {
        image.config.working_dir.clone()
    };
    Ok(RunSpec {
        layers: image.layers.clone(),
        argv,
        env,
        workdir,
        uid: ids.uid,
        gid: ids.gid,
        groups: ids.groups,
        network: options.network,
        limits: options.limits,
        mounts: options.mounts.to_vec(),
        caller: ids.caller,
    })
}

/// The ids a function runs with.
struct Ids {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    home: String,
    /// The host user mapped into the run, if any.
    caller: Option<HostUser>,
}

/// The ids and home the function of `image` runs with for `run_as`, on
/// `id_map`. A rootless runner maps one id, its own, to 0: every function
/// runs as that (the image's `User` and `nobody` cannot be, no other id
/// exists), which is also the caller (`RunAs::Host`).
fn ids(image: &Image, id_map: &IdMap, run_as: RunAs) -> Result<Ids, RunError> {
    let (uid, gid, groups, home, caller) = match run_as {
        RunAs::Image => {
            let u = user::for_image(image)?;
            (u.uid, u.gid, u.groups, u.home, None)
        }
        RunAs::Nobody => {
            let u = user::nobody(image)?;
            (u.uid, u.gid, u.groups, u.home, None)
        }
        RunAs::Host(host) => {
            let (uid, gid) = id_map
                .inside_ids(host)
                .map_err(|e| RunError::Sandbox(e.into()))?;
            (uid, gid, Vec::new(), "/".to_owned(), Some(host))
        }
    };
    match id_map {
        IdMap::Range { .. } => Ok(Ids {
            uid,
            gid,
            groups,
            home,
            caller,
        }),
        IdMap::Own { .. } => {
            if uid != 0 || gid != 0 {
                tracing::debug!(
                    image = image.reference,
                    uid,
                    gid,
                    "rootless runner maps one id: running the function as 0:0"
                );
            }
            Ok(Ids {
                uid: 0,
                gid: 0,
                groups: Vec::new(),
                home,
                caller,
            })
        }
    }
}

/// The most of a `package.yaml` read to tell a Function package.
const PACKAGE_YAML_MAX: u64 = 1 << 20;

/// The name of the Crossplane Function package `layers` (an image's, bottom
/// to top) are, if they are one: the topmost layer with a `package.yaml` at
/// its root has a first document of kind `Function` in
/// `meta.pkg.crossplane.io`. Such an image is a gRPC server, for `fnrun
/// function call`, not a FunctionIO or KRM function.
///
/// The layers are the image's, so `package.yaml` is hostile input: it is
/// opened without following a symlink, read only if it is a regular file,
/// and at most 1 MiB of it, within the YAML bounds.
pub fn function_package(layers: &[PathBuf]) -> Option<String> {
    let text = layers.iter().rev().find_map(|l| read_package_yaml(l))?;
    fnrun_api::yaml_bounds::check_stream(&text).ok()?;
    let first = serde_norway::Deserializer::from_slice(&text).next()?;
    let doc: serde_norway::Value = serde::Deserialize::deserialize(first).ok()?;
    let api_version = doc.get("apiVersion")?.as_str()?;
    let is_function = api_version.starts_with("meta.pkg.crossplane.io/")
        && doc.get("kind")?.as_str()? == "Function";
    is_function.then(|| {
        doc.get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(serde_norway::Value::as_str)
            .map(|n| fnrun_api::text::bounded(n, 253).into_owned())
            .unwrap_or_default()
    })
}

/// `package.yaml` at the root of one unpacked layer: `None` if it is not
/// there or not a regular file.
fn read_package_yaml(layer: &Path) -> Option<Vec<u8>> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(layer.join("package.yaml"))
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = Vec::new();
    file.take(PACKAGE_YAML_MAX).read_to_end(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use fnrun_registry::ImageConfig;

    use super::*;

    fn image(dir: &std::path::Path, config: ImageConfig) -> Image {
        Image {
            reference: "example.org/fn:v1".into(),
            digest: "sha256:00".into(),
            layers: vec![dir.to_path_buf()],
            config,
            pulled: false,
        }
    }

    #[test]
    fn the_image_config_then_the_callers_additions() {
        let dir = tempfile::tempdir().unwrap();
        let img = image(
            dir.path(),
            ImageConfig {
                entrypoint: vec!["/function".into()],
                cmd: vec!["--debug".into()],
                env: vec!["A=image".into(), "B=image".into(), "HOME=/home/fn".into()],
                working_dir: String::new(),
                user: String::new(),
            },
        );
        let args = ["--insecure".to_owned(), "--x".to_owned()];
        let env = ["B=mine".to_owned()];
        let options = SpecOptions {
            extra_args: &args,
            extra_env: &env,
            network: Network::Runner,
            limits: Limits {
                memory_bytes: Some(1 << 20),
                cpu_millis: None,
                pids: Some(64),
            },
            ..SpecOptions::default()
        };
        let own = IdMap::Own {
            host_uid: 1000,
            host_gid: 1000,
        };
        let spec = run_spec(&img, &own, &options).unwrap();
        assert_eq!(spec.argv, ["/function", "--debug", "--insecure", "--x"]);
        assert_eq!(
            spec.env,
            [
                "A=image".to_owned(),
                "HOME=/home/fn".to_owned(),
                format!("PATH={}", fnrun_sandbox::DEFAULT_PATH),
                "B=mine".to_owned(),
            ]
        );
        assert_eq!(spec.workdir, "/");
        assert_eq!((spec.uid, spec.gid), (0, 0));
        assert_eq!(spec.network, Network::Runner);
        assert_eq!(spec.limits.pids, Some(64));
        assert_eq!(spec.layers, [dir.path().to_path_buf()]);
        assert!(spec.mounts.is_empty() && spec.caller.is_none());
    }

    /// Layers, bottom to top, each a directory under `root` with the
    /// `package.yaml` given, if any.
    fn layers(root: &Path, packages: &[Option<&str>]) -> Vec<PathBuf> {
        packages
            .iter()
            .enumerate()
            .map(|(i, package)| {
                let layer = root.join(format!("layer{i}"));
                std::fs::create_dir(&layer).unwrap();
                if let Some(text) = package {
                    std::fs::write(layer.join("package.yaml"), text).unwrap();
                }
                layer
            })
            .collect()
    }

    const FUNCTION: &str = "apiVersion: meta.pkg.crossplane.io/v1beta1\nkind: Function\n\
                            metadata:\n  name: function-auto-ready\n---\n\
                            apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n";
    const PROVIDER: &str =
        "apiVersion: meta.pkg.crossplane.io/v1\nkind: Provider\nmetadata:\n  name: p\n";

    /// A Function package is told by its `package.yaml` (the topmost one),
    /// not by a Provider's or a file of another group; an image without one
    /// is none.
    #[test]
    fn a_function_package_is_told_by_its_package_yaml() {
        let dir = tempfile::tempdir().unwrap();
        let of = |name: &str, packages: &[Option<&str>]| {
            let root = dir.path().join(name);
            std::fs::create_dir(&root).unwrap();
            function_package(&layers(&root, packages))
        };
        assert_eq!(
            of("function", &[None, Some(FUNCTION), None]).as_deref(),
            Some("function-auto-ready")
        );
        assert_eq!(of("provider", &[Some(PROVIDER)]), None);
        assert_eq!(of("none", &[None, None]), None);
        assert_eq!(of("over", &[Some(FUNCTION), Some(PROVIDER)]), None);
        assert_eq!(
            of("other-group", &[Some("apiVersion: v1\nkind: Function\n")]),
            None
        );
        assert_eq!(of("not-yaml", &[Some("{{{ [")]), None);
        assert_eq!(of("empty", &[Some("")]), None);
    }

    /// `package.yaml` is the image's: a symlink (to a file of the host or
    /// of another layer), a directory or a FIFO is not read, so a hostile
    /// image neither reads a host file through it nor blocks the runner.
    #[test]
    fn a_package_yaml_that_is_not_a_regular_file_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside.yaml");
        std::fs::write(&outside, FUNCTION).unwrap();
        let link = dir.path().join("link");
        std::fs::create_dir(&link).unwrap();
        std::os::unix::fs::symlink(&outside, link.join("package.yaml")).unwrap();
        assert_eq!(function_package(&[link]), None);

        let fifo = dir.path().join("fifo");
        std::fs::create_dir(&fifo).unwrap();
        nix::unistd::mkfifo(&fifo.join("package.yaml"), nix::sys::stat::Mode::S_IRUSR).unwrap();
        assert_eq!(function_package(&[fifo]), None);

        let subdir = dir.path().join("subdir");
        std::fs::create_dir_all(subdir.join("package.yaml")).unwrap();
        assert_eq!(function_package(&[subdir]), None);
    }
}
