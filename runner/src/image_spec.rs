//! How a cached image becomes a sandbox [`RunSpec`]: the one routine for both
//! kinds of run, a per-call run of [`crate::runner::Runner`] and a function
//! server of the function host.
//!
//! The image's config is honoured as a container runtime honours it:
//! `Entrypoint` + `Cmd` (then the caller's extra arguments), `Env` (a default
//! `PATH` and `HOME` when it has none; the caller's variables override the
//! image's), `WorkingDir` (`/` when empty) and `User`, resolved in the image's
//! own root ([`crate::user`]). A rootless runner maps one id, so the function
//! then runs as 0:0 inside.

use fnrun_cache::Image;
use fnrun_sandbox::{IdMap, Limits, Network, RunSpec};

use crate::user::{self, UserError};

/// What the caller adds to the image's own config.
#[derive(Debug, Clone, Default)]
pub struct SpecOptions<'a> {
    /// Appended after `Entrypoint` + `Cmd`.
    pub extra_args: &'a [String],
    /// `(NAME, VALUE)`; a name the image sets too takes this value.
    pub extra_env: &'a [(String, String)],
    pub network: Network,
    pub limits: Limits,
}

/// The run spec of `image` under `id_map`.
pub fn run_spec(
    image: &Image,
    id_map: &IdMap,
    options: &SpecOptions<'_>,
) -> Result<RunSpec, UserError> {
    let exec_user = user::for_image(image)?;
    let (uid, gid, groups) = match id_map {
        IdMap::Range { .. } => (exec_user.uid, exec_user.gid, exec_user.groups),
        IdMap::Own { .. } => {
            if exec_user.uid != 0 || exec_user.gid != 0 {
                tracing::debug!(
                    image = image.reference,
                    user = image.config.user,
                    "rootless runner maps one id: running the function as 0:0"
                );
            }
            (0, 0, Vec::new())
        }
    };
    let mut argv = image.config.entrypoint.clone();
    argv.extend(image.config.cmd.iter().cloned());
    argv.extend(options.extra_args.iter().cloned());
    let mut env: Vec<String> = image
        .config
        .env
        .iter()
        .filter(|e| {
            let name = e.split_once('=').map_or(e.as_str(), |(n, _)| n);
            !options.extra_env.iter().any(|(n, _)| n == name)
        })
        .cloned()
        .collect();
    env.extend(options.extra_env.iter().map(|(n, v)| format!("{n}={v}")));
    if !env.iter().any(|e| e.starts_with("PATH=")) {
        env.push(format!("PATH={}", fnrun_sandbox::DEFAULT_PATH));
    }
    if !env.iter().any(|e| e.starts_with("HOME=")) {
        env.push(format!("HOME={}", exec_user.home));
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
        uid,
        gid,
        groups,
        network: options.network,
        limits: options.limits,
    })
}

#[cfg(test)]
mod tests {
    use fnrun_cache::ImageConfig;

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
        let env = [("B".to_owned(), "mine".to_owned())];
        let options = SpecOptions {
            extra_args: &args,
            extra_env: &env,
            network: Network::Runner,
            limits: Limits {
                memory_bytes: Some(1 << 20),
                cpu_millis: None,
                pids: Some(64),
            },
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
                "B=mine".to_owned(),
                format!("PATH={}", fnrun_sandbox::DEFAULT_PATH),
            ]
        );
        assert_eq!(spec.workdir, "/");
        assert_eq!((spec.uid, spec.gid), (0, 0));
        assert_eq!(spec.network, Network::Runner);
        assert_eq!(spec.limits.pids, Some(64));
        assert_eq!(spec.layers, [dir.path().to_path_buf()]);
    }
}
