//! Test images: busybox (or nothing) plus caller files and host files, built
//! with umoci and pushed with skopeo, exactly as a user would build a small
//! function image.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use tempfile::TempDir;

use crate::process::check_output;
use crate::registry::Registry;
use crate::user::is_root;

/// The static busybox of Debian's `busybox-static` package.
pub const BUSYBOX: &str = "/bin/busybox";

/// Applets linked into `/bin` of every test image.
pub const APPLETS: &[&str] = &[
    "sh",
    "cat",
    "echo",
    "printf",
    "sleep",
    "ls",
    "ip",
    "wc",
    "head",
    "tail",
    "id",
    "env",
    "pwd",
    "hostname",
    "mount",
    "grep",
    "sed",
    "cut",
    "tr",
    "sort",
    "uniq",
    "nc",
    "wget",
    "mkdir",
    "rm",
    "touch",
    "test",
    "true",
    "false",
    "yes",
    "dd",
    "stat",
    "readlink",
    "kill",
    "ps",
    "uname",
    "whoami",
    "tee",
    "base64",
    "sha256sum",
    "timeout",
    "find",
    "chmod",
    "ln",
    "awk",
    "xargs",
];

/// `/etc/passwd` of the test images: root, a user 1000 and nobody.
const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                      fn:x:1000:1000:fn:/home/fn:/bin/sh\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n";
const GROUP: &str = "root:x:0:\nfn:x:1000:\nnobody:x:65534:\n";

/// A file to put into an image.
#[derive(Debug, Clone)]
struct ImageFile {
    path: String,
    contents: Vec<u8>,
    mode: u32,
}

/// A host file or tree to copy into an image.
#[derive(Debug, Clone)]
struct HostCopy {
    host: PathBuf,
    path: String,
    /// The mode of a copied file; `None` keeps the host's.
    mode: Option<u32>,
}

/// A busybox image being described; [`TestImage::build`] makes it.
#[derive(Debug, Clone)]
#[must_use]
pub struct TestImage {
    tag: String,
    /// Whether the rootfs starts with busybox and its applets.
    busybox: bool,
    files: Vec<ImageFile>,
    /// Host files and trees copied in, after `files`.
    copies: Vec<HostCopy>,
    dirs: Vec<(String, u32)>,
    /// (path, target), made last: each replaces whatever is at its path.
    symlinks: Vec<(String, String)>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    env: Vec<String>,
    workdir: Option<String>,
    user: Option<String>,
    /// Layers added on top of the busybox layer, bottom to top.
    layers: Vec<Vec<ImageFile>>,
    /// The annotations of each of `layers`' descriptors in the manifest.
    layer_annotations: Vec<Vec<(String, String)>>,
}

impl TestImage {
    /// busybox with its applets in `/bin`, a small `/etc/passwd`, `/tmp` and
    /// `PATH=/bin`; no entrypoint yet.
    pub fn busybox() -> TestImage {
        TestImage {
            tag: "latest".to_owned(),
            busybox: true,
            files: Vec::new(),
            copies: Vec::new(),
            dirs: Vec::new(),
            symlinks: Vec::new(),
            entrypoint: None,
            cmd: None,
            env: vec!["PATH=/usr/local/bin:/usr/bin:/bin".to_owned()],
            workdir: None,
            user: None,
            layers: Vec::new(),
            layer_annotations: Vec::new(),
        }
    }

    /// An image with only `/etc/passwd`, `/etc/group` and `/tmp` until files
    /// are added: as `FROM scratch` or a distroless base. `PATH` is set as for
    /// busybox images.
    pub fn scratch() -> TestImage {
        TestImage {
            busybox: false,
            ..TestImage::busybox()
        }
    }

    /// busybox whose entrypoint is `/bin/cat`: output = input.
    pub fn echo() -> TestImage {
        TestImage::busybox().entrypoint(["/bin/cat"])
    }

    /// busybox that runs `script` with `/bin/sh` as `/fn.sh`.
    pub fn script(script: &str) -> TestImage {
        TestImage::busybox()
            .file("/fn.sh", script, 0o755)
            .entrypoint(["/bin/sh", "/fn.sh"])
    }

    /// The tag inside the OCI layout (default `latest`).
    pub fn tag(mut self, tag: &str) -> Self {
        tag.clone_into(&mut self.tag);
        self
    }

    /// Adds a file (absolute path inside the image) with `mode`.
    pub fn file(mut self, path: &str, contents: impl AsRef<[u8]>, mode: u32) -> Self {
        self.files.push(ImageFile {
            path: path.to_owned(),
            contents: contents.as_ref().to_vec(),
            mode,
        });
        self
    }

    /// Copies the host file `host` to `path` (absolute, inside the image)
    /// with mode 0755, when the image is built: a program such as a static Go
    /// binary.
    pub fn binary(mut self, host: impl Into<PathBuf>, path: &str) -> Self {
        self.copies.push(HostCopy {
            host: host.into(),
            path: path.to_owned(),
            mode: Some(0o755),
        });
        self
    }

    /// Copies the host file or directory tree `host` to `path` (absolute,
    /// inside the image) when the image is built, with `cp -a`: modes,
    /// symlinks and timestamps as they are. `path` `/` copies a tree's
    /// contents into the root. Copies are made after [`TestImage::file`]s.
    pub fn host_copy(mut self, host: impl Into<PathBuf>, path: &str) -> Self {
        self.copies.push(HostCopy {
            host: host.into(),
            path: path.to_owned(),
            mode: None,
        });
        self
    }

    /// Adds a directory (absolute path inside the image) with `mode`.
    pub fn dir(mut self, path: &str, mode: u32) -> Self {
        self.dirs.push((path.to_owned(), mode));
        self
    }

    /// Adds a symlink (absolute path inside the image) to `target`, as given. It is
    /// made after every file and directory and replaces whatever is at `path`, even
    /// the image's own `/etc`.
    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        self.symlinks.push((path.to_owned(), target.to_owned()));
        self
    }

    /// Sets `config.Entrypoint`.
    pub fn entrypoint<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.entrypoint = Some(args.into_iter().map(Into::into).collect());
        self
    }

    /// Sets `config.Cmd`.
    pub fn cmd<S: Into<String>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.cmd = Some(args.into_iter().map(Into::into).collect());
        self
    }

    /// Adds `NAME=VALUE` to `config.Env`.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push(format!("{name}={value}"));
        self
    }

    /// Sets `config.WorkingDir` (the directory is not created; add it with
    /// [`TestImage::dir`] if the image should have it).
    pub fn workdir(mut self, dir: &str) -> Self {
        self.workdir = Some(dir.to_owned());
        self
    }

    /// Sets `config.User`, e.g. `1000:1000` or `fn`.
    pub fn user(mut self, user: &str) -> Self {
        self.user = Some(user.to_owned());
        self
    }

    /// Adds a layer on top of the others with `files` (absolute path,
    /// contents; mode 0644, owned by root): each call is one more layer.
    pub fn layer<P: AsRef<str>, C: AsRef<[u8]>>(
        self,
        files: impl IntoIterator<Item = (P, C)>,
    ) -> Self {
        self.annotated_layer(files, &[])
    }

    /// As [`TestImage::layer`], with `annotations` on the layer's descriptor
    /// in the manifest (`io.crossplane.xpkg: base` marks a Crossplane
    /// package's `package.yaml` layer).
    pub fn annotated_layer<P: AsRef<str>, C: AsRef<[u8]>>(
        mut self,
        files: impl IntoIterator<Item = (P, C)>,
        annotations: &[(&str, &str)],
    ) -> Self {
        self.layer_annotations.push(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        self.layers.push(
            files
                .into_iter()
                .map(|(path, contents)| ImageFile {
                    path: path.as_ref().to_owned(),
                    contents: contents.as_ref().to_vec(),
                    mode: 0o644,
                })
                .collect(),
        );
        self
    }

    /// Builds the image into a fresh OCI layout with umoci.
    pub fn build(self) -> Result<BuiltImage> {
        let dir = tempfile::Builder::new()
            .prefix("fnrun-image-")
            .tempdir()
            .context("cannot create the image's temp dir")?;
        let layout = dir.path().join("layout");
        let bundle = dir.path().join("bundle");
        let image = format!("{}:{}", layout.display(), self.tag);

        umoci(["init", "--layout"], [layout.as_os_str()])?;
        umoci(["new", "--image", &image], [])?;
        let mut unpack = Command::new("umoci");
        unpack.arg("unpack");
        if !is_root() {
            unpack.arg("--rootless");
        }
        check_output(unpack.args(["--image", &image]).arg(&bundle))?;

        let rootfs = bundle.join("rootfs");
        self.populate(&rootfs)?;

        check_output(
            Command::new("umoci")
                .args(["repack", "--image", &image])
                .arg(&bundle),
        )?;

        let mut config = Command::new("umoci");
        config.args(["config", "--image", &image]);
        // `umoci new` gives an empty config; make sure nothing is inherited.
        config.args([
            "--clear=config.env",
            "--clear=config.entrypoint",
            "--clear=config.cmd",
        ]);
        for e in &self.env {
            config.arg(format!("--config.env={e}"));
        }
        for arg in self.entrypoint.iter().flatten() {
            config.arg(format!("--config.entrypoint={arg}"));
        }
        for arg in self.cmd.iter().flatten() {
            config.arg(format!("--config.cmd={arg}"));
        }
        if let Some(dir) = &self.workdir {
            config.arg(format!("--config.workingdir={dir}"));
        }
        if let Some(user) = &self.user {
            config.arg(format!("--config.user={user}"));
        }
        check_output(&mut config)?;
        for (i, files) in self.layers.iter().enumerate() {
            let tree = dir.path().join(format!("layer-{i}"));
            for file in files {
                let path = inside(&tree, &file.path);
                fs::create_dir_all(path.parent().unwrap_or(&tree))?;
                write_mode(&path, &file.contents, file.mode)?;
            }
            let tar = dir.path().join(format!("layer-{i}.tar"));
            check_output(
                Command::new("tar")
                    .args(["--numeric-owner", "--owner=0", "--group=0", "-C"])
                    .arg(&tree)
                    .arg("-cf")
                    .arg(&tar)
                    .arg("."),
            )?;
            check_output(
                Command::new("umoci")
                    .args(["raw", "add-layer", "--image", &image])
                    .arg(&tar),
            )?;
            remove_tree(&tree)?;
            fs::remove_file(&tar)?;
        }
        if self.layer_annotations.iter().any(|a| !a.is_empty()) {
            annotate_layers(&layout, &self.tag, &self.layer_annotations)?;
        }
        check_output(Command::new("umoci").args(["gc", "--layout"]).arg(&layout))?;
        // The bundle is only a staging area.
        remove_tree(&bundle)?;

        Ok(BuiltImage {
            dir,
            layout,
            tag: self.tag,
        })
    }

    /// Builds the image and pushes it to `registry` as `repo` (`name:tag`);
    /// returns the full reference `ADDR/name:tag`. Panics on failure: a test
    /// cannot go on without its image.
    pub fn push_to(self, registry: &Registry, repo: &str) -> String {
        let image = self
            .build()
            .unwrap_or_else(|e| panic!("cannot build the image for {repo}: {e:#}"));
        image
            .push(registry, repo)
            .unwrap_or_else(|e| panic!("cannot push {repo}: {e:#}"))
    }

    fn populate(&self, rootfs: &Path) -> Result<()> {
        if self.busybox {
            let bin = rootfs.join("bin");
            fs::create_dir_all(&bin)?;
            fs::copy(BUSYBOX, bin.join("busybox")).with_context(|| {
                format!("cannot copy {BUSYBOX} (install the busybox-static package)")
            })?;
            fs::set_permissions(bin.join("busybox"), fs::Permissions::from_mode(0o755))?;
            for applet in APPLETS {
                symlink("busybox", bin.join(applet))?;
            }
        }
        let etc = rootfs.join("etc");
        fs::create_dir_all(&etc)?;
        write_mode(&etc.join("passwd"), PASSWD.as_bytes(), 0o644)?;
        write_mode(&etc.join("group"), GROUP.as_bytes(), 0o644)?;
        let tmp = rootfs.join("tmp");
        fs::create_dir_all(&tmp)?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777))?;
        for (dir, mode) in &self.dirs {
            let path = inside(rootfs, dir);
            fs::create_dir_all(&path)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(*mode))?;
        }
        for file in &self.files {
            let path = inside(rootfs, &file.path);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            write_mode(&path, &file.contents, file.mode)?;
        }
        for copy in &self.copies {
            copy_in(rootfs, copy)?;
        }
        for (path, target) in &self.symlinks {
            let path = inside(rootfs, path);
            match fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => fs::remove_dir_all(&path)?,
                Ok(_) => fs::remove_file(&path)?,
                Err(_) => {}
            }
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent)?;
            }
            symlink(target, &path)
                .with_context(|| format!("cannot make the symlink {}", path.display()))?;
        }
        Ok(())
    }
}

/// Sets `annotations[i]` on the descriptor of the `i`th of the manifest's
/// last `annotations.len()` layers, in the OCI layout `layout` at `tag`: a new
/// manifest blob, and the index pointing at it (umoci has no flag for layer
/// annotations; `umoci gc` then drops the old blob).
fn annotate_layers(layout: &Path, tag: &str, annotations: &[Vec<(String, String)>]) -> Result<()> {
    use sha2::{Digest, Sha256};
    let read_json = |path: &Path| -> Result<serde_json::Value> {
        serde_json::from_slice(
            &fs::read(path).with_context(|| format!("cannot read {}", path.display()))?,
        )
        .with_context(|| format!("{} is not JSON", path.display()))
    };
    let blob = |digest: &str| -> Result<PathBuf> {
        let hex = digest
            .strip_prefix("sha256:")
            .with_context(|| format!("{digest} is not a sha256 digest"))?;
        Ok(layout.join("blobs/sha256").join(hex))
    };
    let index_path = layout.join("index.json");
    let mut index = read_json(&index_path)?;
    let descriptor = index["manifests"]
        .as_array_mut()
        .into_iter()
        .flatten()
        .find(|d| d["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .with_context(|| format!("no manifest tagged {tag} in {}", layout.display()))?;
    let mut manifest = read_json(&blob(descriptor["digest"].as_str().unwrap_or_default())?)?;
    let layers = manifest["layers"]
        .as_array_mut()
        .context("the manifest has no layers")?;
    let first = layers
        .len()
        .checked_sub(annotations.len())
        .context("fewer layers than annotated layers")?;
    for (layer, wanted) in layers[first..].iter_mut().zip(annotations) {
        for (key, value) in wanted {
            layer["annotations"][key] = serde_json::Value::from(value.as_str());
        }
    }
    let bytes = serde_json::to_vec(&manifest)?;
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    fs::write(blob(&digest)?, &bytes)?;
    descriptor["digest"] = digest.into();
    descriptor["size"] = bytes.len().into();
    fs::write(&index_path, serde_json::to_vec(&index)?)
        .with_context(|| format!("cannot write {}", index_path.display()))
}

fn umoci<'a>(
    args: impl IntoIterator<Item = &'a str>,
    paths: impl IntoIterator<Item = &'a std::ffi::OsStr>,
) -> Result<String> {
    check_output(Command::new("umoci").args(args).args(paths))
}

/// `cp -a` of the host file or tree `host` to `path` inside `rootfs`; a
/// directory onto an existing one merges into it.
fn copy_in(rootfs: &Path, copy: &HostCopy) -> Result<()> {
    let host = &copy.host;
    let to = inside(rootfs, &copy.path);
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent)?;
    }
    let meta = fs::metadata(host).with_context(|| format!("cannot copy {}", host.display()))?;
    let mut cp = Command::new("cp");
    cp.arg("-a");
    if meta.is_dir() {
        fs::create_dir_all(&to)?;
        cp.arg(format!("{}/.", host.display())).arg(&to);
    } else {
        cp.arg("--no-target-directory").arg(host).arg(&to);
    }
    check_output(&mut cp)
        .with_context(|| format!("cannot copy {} into the image", host.display()))?;
    if let Some(mode) = copy.mode.filter(|_| !meta.is_dir()) {
        fs::set_permissions(&to, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

fn inside(rootfs: &Path, path: &str) -> PathBuf {
    rootfs.join(path.trim_start_matches('/'))
}

fn write_mode(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", path.display()))
}

/// Removes a tree, making read-only directories writable first (rootless
/// unpacks can leave them so).
fn remove_tree(path: &Path) -> Result<()> {
    if fs::remove_dir_all(path).is_ok() {
        return Ok(());
    }
    check_output(Command::new("chmod").arg("-R").arg("u+rwX").arg(path))?;
    fs::remove_dir_all(path).with_context(|| format!("cannot remove {}", path.display()))
}

/// An image in an OCI layout on disk. A layout built by [`TestImage::build`]
/// is removed on drop; one opened with [`BuiltImage::open`] (a cached image)
/// is left as it is.
#[derive(Debug)]
pub struct BuiltImage {
    /// The built layout's temp dir, or scratch space for an opened one.
    dir: TempDir,
    layout: PathBuf,
    tag: String,
}

impl BuiltImage {
    /// The existing OCI layout `layout`, tag `tag`, which this value does not
    /// own.
    pub fn open(layout: &Path, tag: &str) -> Result<BuiltImage> {
        if !layout.join("index.json").is_file() {
            anyhow::bail!("{} is not an OCI image layout", layout.display());
        }
        let dir = tempfile::Builder::new()
            .prefix("fnrun-image-")
            .tempdir()
            .context("cannot create the image's temp dir")?;
        Ok(BuiltImage {
            dir,
            layout: layout.to_path_buf(),
            tag: tag.to_owned(),
        })
    }

    /// Copies the layout to `dest` (which must not exist), e.g. into a cache.
    pub fn copy_layout_to(&self, dest: &Path) -> Result<()> {
        check_output(
            Command::new("cp")
                .arg("-a")
                .arg("--no-target-directory")
                .arg(&self.layout)
                .arg(dest),
        )?;
        Ok(())
    }

    /// Unpacks the image with umoci into the bundle `dest` (which must not
    /// exist); returns its root filesystem, `dest/rootfs`.
    pub fn unpack(&self, dest: &Path) -> Result<PathBuf> {
        let mut unpack = Command::new("umoci");
        unpack.arg("unpack");
        if !is_root() {
            unpack.arg("--rootless");
        }
        check_output(
            unpack
                .args([
                    "--image",
                    &format!("{}:{}", self.layout.display(), self.tag),
                ])
                .arg(dest),
        )?;
        Ok(dest.join("rootfs"))
    }

    /// The OCI image layout directory.
    pub fn layout(&self) -> &Path {
        &self.layout
    }

    /// The tag inside the layout.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The `oci:PATH:TAG` reference of this image, for `fnrun run`.
    pub fn oci_ref(&self) -> String {
        format!("oci:{}:{}", self.layout.display(), self.tag)
    }

    /// Writes the layout as a tar (an `oci-archive:`) and returns the
    /// `oci-archive:PATH:TAG` reference.
    pub fn oci_archive(&self) -> Result<String> {
        let archive = self.dir.path().join("image.tar");
        if !archive.exists() {
            check_output(
                Command::new("tar")
                    .arg("-C")
                    .arg(&self.layout)
                    .arg("-cf")
                    .arg(&archive)
                    .arg("."),
            )?;
        }
        Ok(format!("oci-archive:{}:{}", archive.display(), self.tag))
    }

    /// Makes the layout readable by everyone (for a daemon running as another
    /// user). The temp dir itself is 0700 by default.
    pub fn share(&self) -> Result<()> {
        check_output(
            Command::new("chmod")
                .arg("-R")
                .arg("a+rX")
                .arg(self.dir.path())
                .arg(&self.layout),
        )?;
        Ok(())
    }

    /// Pushes the image to `registry` as `repo` (`name:tag`) and returns the full
    /// reference `ADDR/name:tag`.
    pub fn push(&self, registry: &Registry, repo: &str) -> Result<String> {
        let reference = registry.reference(repo);
        let mut cmd = Command::new("skopeo");
        cmd.args([
            "--insecure-policy",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
        ]);
        if let Some((user, password)) = registry.credentials() {
            cmd.arg(format!("--dest-creds={user}:{password}"));
        }
        cmd.arg(format!("oci:{}:{}", self.layout.display(), self.tag))
            .arg(format!("docker://{reference}"));
        check_output(&mut cmd).with_context(|| format!("cannot push {reference}"))?;
        Ok(reference)
    }
}
