//! Python programs of the tests, under `tests/python/`: gRPC clients on the
//! real `grpcio` (grpc-core, the C core of the Python, C++ and Ruby
//! libraries), `grpcio-tools` and `grpcio-reflection` from PyPI.
//!
//! They run in a venv at [`tool_cache::dir`]`/venv`, which
//! `tests/python/venv.sh` creates, or updates when `tests/python/requirements.txt`
//! changes (`scripts/test` runs it first; the harness runs it again, once per
//! test process, and it does nothing when the venv is current). Stubs are
//! generated from `.proto` files with `grpc_tools.protoc` into the cache, keyed
//! by a hash of the protos and the requirements.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};

use crate::process::{Finished, check_output, run_capture};
use crate::tool_cache::{self, Key, Protos};

/// The longest a Python program may run before the harness kills it.
pub const GUARD: Duration = Duration::from_secs(180);

/// The venv, ready to run the programs.
#[derive(Debug)]
pub struct Python {
    venv: PathBuf,
}

impl Python {
    /// The venv, created or brought up to date first (once per process).
    pub fn get() -> Result<&'static Python> {
        static PYTHON: OnceLock<Result<Python, String>> = OnceLock::new();
        PYTHON
            .get_or_init(|| Python::ensure().map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow!("{e}"))
    }

    fn ensure() -> Result<Python> {
        let venv = tool_cache::dir().join("venv");
        let script = python_dir().join("venv.sh");
        check_output(Command::new("bash").arg(&script).arg(&venv)).with_context(|| {
            "cannot set up the Python venv (needs python3 with venv, e.g. Debian's \
             python3-venv, and PyPI)"
        })?;
        Ok(Python { venv })
    }

    /// The venv's interpreter.
    pub fn interpreter(&self) -> PathBuf {
        self.venv.join("bin/python")
    }

    /// Python stubs (`*_pb2.py`, `*_pb2_grpc.py`) for `protos`, generated once;
    /// returns the directory to put on `PYTHONPATH`.
    pub fn stubs(&self, protos: &[Protos]) -> Result<PathBuf> {
        let mut key = Key::new();
        let stamp = self.venv.join(".fnrun-requirements");
        key.part(
            "requirements",
            std::fs::read(&stamp).with_context(|| format!("cannot read {}", stamp.display()))?,
        );
        for set in protos {
            set.hash_into(&mut key)?;
        }
        let entry = tool_cache::dir().join(format!("python-stubs-{}", key.short()));
        tool_cache::entry(&entry, |work| {
            for set in protos {
                check_output(
                    Command::new(self.interpreter())
                        .args(["-m", "grpc_tools.protoc", "-I"])
                        .arg(&set.root)
                        .arg(format!("--python_out={}", work.display()))
                        .arg(format!("--grpc_python_out={}", work.display()))
                        .args(&set.files),
                )
                .context("cannot generate the Python stubs")?;
            }
            Ok(())
        })
    }

    /// Runs `tests/python/<script> ARGS...` with `stubs` on `PYTHONPATH` and
    /// `stdin` written to it.
    pub fn run(&self, script: &str, args: &[&str], stubs: &Path, stdin: Option<&[u8]>) -> Finished {
        let mut cmd = Command::new(self.interpreter());
        cmd.arg(python_dir().join(script))
            .args(args)
            .env("PYTHONPATH", stubs)
            // Nothing from the user's environment changes what grpcio does.
            .env_remove("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")
            .env_remove("http_proxy")
            .env_remove("https_proxy")
            .env_remove("grpc_proxy");
        run_capture(&mut cmd, stdin, GUARD)
    }

    /// Runs a script (see [`Python::run`]) that prints one JSON object, and
    /// returns it; fails with its output if it did not exit 0.
    pub fn run_json(
        &self,
        script: &str,
        args: &[&str],
        stubs: &Path,
        stdin: Option<&[u8]>,
    ) -> Result<serde_json::Value> {
        let out = self.run(script, args, stubs, stdin);
        if out.code != Some(0) {
            bail!("{script} {args:?} failed: {}", out.describe());
        }
        serde_json::from_str(&out.stdout)
            .with_context(|| format!("{script} printed no JSON object: {}", out.describe()))
    }
}

/// `tests/python/`.
pub fn python_dir() -> PathBuf {
    crate::workspace_root().join("tests/python")
}
