//! A composition function written with the real Crossplane Python SDK
//! (`tests/python/sdk-function/`), packaged as a self-contained Function
//! image: no busybox, no shell, nothing from the host at run time.
//!
//! The image holds, at the paths they have on the build host:
//! - the interpreter (`sys._base_executable`, resolved) and its stdlib,
//!   without tests, `__pycache__`, idlelib, tkinter, turtledemo, ensurepip,
//!   lib2to3, pydoc_data, distutils, venv, the static library's `config-*`,
//!   and the extension modules only tests and terminals use;
//! - every shared library the interpreter and the extension modules need,
//!   as `ldd` finds them, with the dynamic loader.
//!
//! At `/venv/fn` it holds a venv of that interpreter whose site-packages are
//! those of `tests/python/sdk-function/venv.sh`'s venv (the pinned SDK,
//! grpcio, protobuf, pydantic...) without pip and setuptools, plus the
//! function's package and `bin/function`, its entrypoint. Byte code is
//! compiled into the image (unchecked hash-based `.pyc`), so the function
//! starts in a fraction of a second although, as user 65532, it cannot write
//! `__pycache__`.
//!
//! Building takes a while (pip from PyPI on a cold venv, then umoci): the
//! layout is cached in [`tool_cache::dir`], keyed by the requirements, the
//! interpreter, the function's sources and the recipe below.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;

use super::go_function::FUNCTION_USER;
use crate::image::{BuiltImage, TestImage};
use crate::process::check_output;
use crate::tool_cache::{self, Key};

/// The function's name, in its result message.
pub const PYTHON_SDK_NAME: &str = "function-python-sdk";

/// The annotation it sets on the desired composite resource; its value is
/// the SDK's version.
pub const PYTHON_SDK_ANNOTATION: &str = "fnrun.dev/python-sdk";

/// The image's entrypoint (the SDK's standard flags follow: `--insecure`,
/// `--address` default `0.0.0.0:9443`, `--tls-certs-dir` or
/// `$TLS_SERVER_CERTS_DIR`, `--debug`).
pub const PYTHON_SDK_ENTRYPOINT: &str = "/venv/fn/bin/function";

/// The tag inside the cached layout.
pub const PYTHON_SDK_TAG: &str = "v1";

/// Where the venv is in the image.
const VENV: &str = "/venv/fn";

/// Changes to how the image is made that its inputs do not show: bump it.
const RECIPE: &str = "python-sdk-image 2";

/// Top-level stdlib entries left out.
const STDLIB_SKIP: &[&str] = &[
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "turtle.py",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "distutils",
    "venv",
    "site-packages",
    "dist-packages",
];

/// Extension modules (in `lib-dynload`) left out, by prefix: tests, and
/// terminal and database modules that pull in more shared libraries.
const DYNLOAD_SKIP: &[&str] = &[
    "_test",
    "_ctypes_test",
    "_xxtestfuzz",
    "_xxsubinterpreters",
    "xxlimited",
    "xxsubtype",
    "_curses",
    "readline",
    "_dbm",
    "_gdbm",
    "nis",
    "ossaudiodev",
    "_tkinter",
];

/// Top-level site-packages entries left out: the venv's installers.
const SITE_SKIP: &[&str] = &[
    "pip",
    "setuptools",
    "_distutils_hack",
    "pkg_resources",
    "distutils-precedence.pth",
];

/// `bin/function`, as the console script pip would write for the function.
const ENTRYPOINT_SCRIPT: &str = "#!/venv/fn/bin/python\n\
    # The function's entrypoint: the SDK's standard command line.\n\
    import sys\n\
    from function.main import cli\n\
    sys.exit(cli())\n";

/// `/etc/passwd` and `/etc/group`: distroless's users.
const PASSWD: &str = "root:x:0:0:root:/root:/sbin/nologin\n\
                      nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n\
                      nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n";

/// The Python SDK function's image, built once and cached (see the module
/// docs); the layout belongs to the cache: do not modify it.
pub fn python_sdk_image() -> Result<BuiltImage> {
    static LAYOUT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let layout = LAYOUT
        .get_or_init(|| cached_layout().map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("cannot build the Python SDK function's image: {e}"))?;
    BuiltImage::open(layout, PYTHON_SDK_TAG)
}

fn sdk_dir() -> PathBuf {
    crate::workspace_root().join("tests/python/sdk-function")
}

fn cached_layout() -> Result<PathBuf> {
    let venv = tool_cache::dir().join("sdk-venv");
    check_output(
        Command::new("bash")
            .arg(sdk_dir().join("venv.sh"))
            .arg(&venv),
    )
    .context(
        "cannot set up the SDK's venv (needs Python 3.11+ with venv, e.g. Debian 12's \
         python3-venv, and PyPI)",
    )?;
    let python = Interpreter::inspect(&venv)?;
    let mut key = Key::new();
    key.part("recipe", RECIPE)
        .part(
            "image",
            format!("{VENV} {PYTHON_SDK_ENTRYPOINT} {FUNCTION_USER}"),
        )
        .part(
            "skip",
            format!("{STDLIB_SKIP:?} {DYNLOAD_SKIP:?} {SITE_SKIP:?}"),
        )
        .part("entrypoint", ENTRYPOINT_SCRIPT)
        .part("passwd", format!("{PASSWD}{GROUP}"))
        .part("interpreter", &python.described)
        .part(
            "requirements",
            std::fs::read(venv.join(".fnrun-requirements"))?,
        )
        .tree(&sdk_dir().join("function"))?;
    let entry = tool_cache::dir().join(format!("python-sdk-image-{}", key.short()));
    let entry = tool_cache::entry(&entry, |work| build(work, &python))?;
    Ok(entry.join("layout"))
}

/// What the image needs to know of the SDK venv's interpreter.
#[derive(Debug, Deserialize)]
struct Interpreter {
    /// The venv's interpreter.
    #[serde(skip)]
    venv_python: PathBuf,
    /// All of the below, as printed: part of the cache key.
    #[serde(skip)]
    described: String,
    /// `3.11`
    version: String,
    /// `3.11.2 (main, ...) [GCC ...]`
    full_version: String,
    /// The base interpreter, symlinks resolved: `/usr/bin/python3.11`.
    executable: PathBuf,
    /// `/usr/lib/python3.11`
    stdlib: PathBuf,
    /// The same, or where the platform-specific stdlib is.
    platstdlib: PathBuf,
    /// The venv's site-packages.
    site_packages: PathBuf,
}

impl Interpreter {
    fn inspect(venv: &Path) -> Result<Interpreter> {
        const SCRIPT: &str = "import json, os, sys, sysconfig\n\
            print(json.dumps({\n\
                'version': '%d.%d' % sys.version_info[:2],\n\
                'full_version': sys.version,\n\
                'executable': os.path.realpath(sys._base_executable),\n\
                'stdlib': sysconfig.get_path('stdlib', vars={\n\
                    'installed_base': sys.base_prefix, 'base': sys.base_prefix}),\n\
                'platstdlib': sysconfig.get_path('platstdlib', vars={\n\
                    'base': sys.base_prefix, 'platbase': sys.base_exec_prefix}),\n\
                'site_packages': sysconfig.get_path('purelib'),\n\
            }))";
        let venv_python = venv.join("bin/python");
        let described = check_output(Command::new(&venv_python).args(["-I", "-c", SCRIPT]))?;
        let mut python: Interpreter = serde_json::from_str(&described)
            .with_context(|| format!("unexpected interpreter description {described:?}"))?;
        python.venv_python = venv_python;
        python.described = described;
        Ok(python)
    }
}

/// Builds the image into `work/layout`.
fn build(work: &Path, python: &Interpreter) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // The entry is readable by all, for a daemon that runs as another user.
    std::fs::set_permissions(work, std::fs::Permissions::from_mode(0o755))?;
    let rootfs = work.join("rootfs");
    stage(&rootfs, python)?;
    let image = TestImage::scratch()
        .tag(PYTHON_SDK_TAG)
        .host_copy(&rootfs, "/")
        .file("/etc/passwd", PASSWD, 0o644)
        .file("/etc/group", GROUP, 0o644)
        .dir("/home/nonroot", 0o755)
        .env("PYTHONUNBUFFERED", "1")
        .entrypoint([PYTHON_SDK_ENTRYPOINT])
        .user(FUNCTION_USER)
        .build()?;
    std::fs::remove_dir_all(&rootfs)
        .with_context(|| format!("cannot remove {}", rootfs.display()))?;
    image.copy_layout_to(&work.join("layout"))
}

/// Fills `rootfs` with the interpreter, its stdlib, the venv, the function
/// and the shared libraries, and compiles the byte code.
fn stage(rootfs: &Path, python: &Interpreter) -> Result<()> {
    let inside = |path: &Path| rootfs.join(path.strip_prefix("/").unwrap_or(path));
    copy_file(&python.executable, &inside(&python.executable))?;
    let mut stdlibs = vec![&python.stdlib];
    if python.platstdlib != python.stdlib {
        stdlibs.push(&python.platstdlib);
    }
    for stdlib in &stdlibs {
        copy_tree(stdlib, &inside(stdlib), &|rel, is_dir| {
            skip_stdlib(rel, is_dir)
        })?;
    }

    let venv = rootfs.join(VENV.trim_start_matches('/'));
    let bin = venv.join("bin");
    std::fs::create_dir_all(&bin)?;
    std::fs::write(
        venv.join("pyvenv.cfg"),
        format!(
            "home = {}\ninclude-system-site-packages = false\nversion = {}\n",
            python
                .executable
                .parent()
                .context("the interpreter is in a directory")?
                .display(),
            python
                .full_version
                .split_whitespace()
                .next()
                .unwrap_or(&python.version),
        ),
    )?;
    std::os::unix::fs::symlink(&python.executable, bin.join("python"))?;
    for alias in ["python3".to_owned(), format!("python{}", python.version)] {
        std::os::unix::fs::symlink("python", bin.join(alias))?;
    }
    write_executable(&bin.join("function"), ENTRYPOINT_SCRIPT)?;
    let site = venv.join(format!("lib/python{}/site-packages", python.version));
    copy_tree(&python.site_packages, &site, &skip_site)?;
    copy_tree(
        &sdk_dir().join("function"),
        &site.join("function"),
        &|rel, _| rel.file_name().is_some_and(|n| n == "__pycache__"),
    )?;

    copy_shared_libraries(rootfs)?;

    let mut compile = Command::new(&python.venv_python);
    compile
        .args(["-I", "-m", "compileall", "-q", "-j", "0"])
        .args(["--invalidation-mode", "unchecked-hash", "-s"])
        .arg(rootfs)
        .args(["-p", "/"])
        .args(stdlibs.iter().map(|s| inside(s)))
        .arg(&site);
    check_output(&mut compile).context("cannot compile the byte code")?;
    Ok(())
}

/// Whether the stdlib entry `rel` (relative to the stdlib) stays out.
fn skip_stdlib(rel: &Path, is_dir: bool) -> bool {
    let Some(name) = rel.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    if name == "__pycache__"
        || (is_dir && (name == "test" || name == "tests" || name == "idle_test"))
    {
        return true;
    }
    let top = rel.components().count() == 1;
    if top && (STDLIB_SKIP.contains(&name) || name.starts_with("config-")) {
        return true;
    }
    let in_dynload = rel.parent().is_some_and(|p| p.ends_with("lib-dynload"));
    in_dynload && DYNLOAD_SKIP.iter().any(|prefix| name.starts_with(prefix))
}

/// Whether the site-packages entry `rel` stays out.
fn skip_site(rel: &Path, is_dir: bool) -> bool {
    let Some(name) = rel.file_name().and_then(|n| n.to_str()) else {
        return false;
    };
    if name == "__pycache__" || (is_dir && (name == "tests" || name == "test")) {
        return true;
    }
    let top = rel.components().count() == 1;
    top && (SITE_SKIP.contains(&name)
        || name.starts_with("pip-")
        || name.starts_with("setuptools-"))
}

/// Copies the tree `from` to `to`: directories, regular files (with their
/// modes) and relative symlinks, except the entries `skip` (given the
/// path relative to `from` and whether it is a directory) rejects.
fn copy_tree(from: &Path, to: &Path, skip: &dyn Fn(&Path, bool) -> bool) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        let dir = from.join(&rel);
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?
        {
            let entry = entry?;
            let rel = rel.join(entry.file_name());
            let kind = entry.file_type()?;
            if skip(&rel, kind.is_dir()) {
                continue;
            }
            let dest = to.join(&rel);
            if kind.is_dir() {
                std::fs::create_dir_all(&dest)?;
                dirs.push(rel);
            } else if kind.is_symlink() {
                // A relative link stays one; an absolute one points out of
                // the tree (Debian's sitecustomize.py into /etc): its file
                // is copied instead, if there is one.
                let target = std::fs::read_link(entry.path())?;
                if target.is_relative() {
                    std::os::unix::fs::symlink(target, &dest)?;
                } else if entry.path().is_file() {
                    copy_file(&entry.path(), &dest)?;
                }
            } else if kind.is_file() {
                copy_file(&entry.path(), &dest)?;
            }
        }
    }
    Ok(())
}

/// Copies a file (following symlinks) with its mode, making its directory.
fn copy_file(from: &Path, to: &Path) -> Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::copy(from, to)
        .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    Ok(())
}

fn write_executable(path: &Path, contents: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, contents)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// Copies into `rootfs`, at their host paths, the shared libraries and the
/// dynamic loader that `ldd` finds for every ELF file in it.
fn copy_shared_libraries(rootfs: &Path) -> Result<()> {
    let mut needed = std::collections::BTreeSet::new();
    for file in tool_cache::files_under(rootfs)? {
        if is_elf(&file)? {
            needed.extend(
                ldd(&file).with_context(|| format!("cannot list what {} needs", file.display()))?,
            );
        }
    }
    for library in needed {
        let dest = rootfs.join(library.strip_prefix("/").unwrap_or(&library));
        if !dest.exists() {
            copy_file(&library, &dest)?;
        }
    }
    Ok(())
}

fn is_elf(path: &Path) -> Result<bool> {
    use std::io::Read;
    let mut magic = [0u8; 4];
    let mut file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(file.read(&mut magic)? == 4 && magic == *b"\x7fELF")
}

/// The absolute paths `ldd` resolves for `file`: its libraries, their
/// libraries, and the dynamic loader. None for a static file.
fn ldd(file: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(file)
        .output()
        .context("cannot run ldd")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        if stdout.contains("not a dynamic executable")
            || String::from_utf8_lossy(&out.stderr).contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        bail!(
            "ldd failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    parse_ldd(&stdout)
}

/// The absolute paths in `ldd`'s output; an error for a library not found.
fn parse_ldd(stdout: &str) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for line in stdout.lines() {
        let line = line.trim();
        if line.contains("not found") {
            bail!("a library is missing: {line}");
        }
        // `libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x...)` or
        // `/lib64/ld-linux-x86-64.so.2 (0x...)`; the vDSO has no path.
        let path = line.split(" => ").last().unwrap_or(line);
        let path = path.split(" (").next().unwrap_or(path);
        if path.starts_with('/') {
            paths.push(PathBuf::from(path));
        }
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_gives_libraries_and_the_loader() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x00007f2b)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2a)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f2c)\n";
        assert_eq!(
            parse_ldd(out).unwrap(),
            [
                "/lib/x86_64-linux-gnu/libm.so.6",
                "/lib/x86_64-linux-gnu/libc.so.6",
                "/lib64/ld-linux-x86-64.so.2"
            ]
            .map(PathBuf::from)
        );
        let err = parse_ldd("\tlibfoo.so.1 => not found\n").unwrap_err();
        assert!(err.to_string().contains("libfoo.so.1"), "{err}");
    }

    #[test]
    fn the_stdlib_loses_tests_tools_and_caches() {
        for gone in [
            "test",
            "idlelib",
            "tkinter",
            "ensurepip",
            "lib2to3",
            "config-3.11-x86_64-linux-gnu",
            "__pycache__",
            "unittest/test",
            "ctypes/test",
            "json/__pycache__",
            "lib-dynload/_testcapi.cpython-311-x86_64-linux-gnu.so",
            "lib-dynload/_curses.cpython-311-x86_64-linux-gnu.so",
            "lib-dynload/readline.cpython-311-x86_64-linux-gnu.so",
        ] {
            let is_dir = !gone.ends_with(".so");
            assert!(skip_stdlib(Path::new(gone), is_dir), "{gone}");
        }
        for kept in [
            "os.py",
            "asyncio",
            "json",
            "unittest",
            "encodings/utf_8.py",
            "lib-dynload",
            "lib-dynload/_asyncio.cpython-311-x86_64-linux-gnu.so",
            "lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so",
            // Only directories named test go, and only top-level names are
            // held against the list.
            "test_support.py",
            "email/venv",
        ] {
            let is_dir = !kept.contains('.');
            assert!(!skip_stdlib(Path::new(kept), is_dir), "{kept}");
        }
    }

    #[test]
    fn site_packages_lose_the_installers() {
        for gone in [
            "pip",
            "pip-24.0.dist-info",
            "setuptools",
            "setuptools-65.5.0.dist-info",
            "_distutils_hack",
            "pkg_resources",
            "distutils-precedence.pth",
            "grpc/__pycache__",
        ] {
            assert!(
                skip_site(Path::new(gone), !gone.ends_with(".pth")),
                "{gone}"
            );
        }
        for kept in [
            "grpc",
            "crossplane",
            "pydantic_core",
            "typing_extensions.py",
            "google/protobuf",
        ] {
            assert!(
                !skip_site(Path::new(kept), !kept.ends_with(".py")),
                "{kept}"
            );
        }
    }
}
