//! KRM input as kpt takes it, and output as `kpt fn eval` writes it back.
//!
//! Besides a ResourceList, `fnrun run --krm` takes:
//!
//! - a stream of YAML documents separated by `---` (a file, or stdin), which
//!   is wrapped into a ResourceList as `kpt fn eval -` wraps its stdin: each
//!   resource gets the index annotations (`config.kubernetes.io/index` and
//!   `internal.config.kubernetes.io/index`), a path annotation it carries in
//!   one form is copied to the other, and every resource gets kpt's ids;
//! - a package directory, read as kpt reads one ([`read_package`]): every
//!   `*.yaml`, `*.yml` and `*.json` file and every `Kptfile`, in lexical
//!   order, the directories below included (hidden ones too) except what a
//!   `.krmignore` excludes; links to files are followed, links to
//!   directories are not. Each resource gets its file's path and its index
//!   in the file, in both forms, and kpt's ids.
//!
//! The ids (`internal.config.kubernetes.io/id`, `config.k8s.io/id`, and
//! `internal.config.kubernetes.io/annotations-migration-resource-id`) are
//! what kpt gives an exec function too: they tell which input a resource of
//! the output was, so that a path annotation changed in one form only is
//! taken from the form that changed.
//!
//! [`write()`] writes the function's output as `kpt fn eval --output` does:
//! `stdout`, a ResourceList of the resources with their path and index
//! annotations (kpt's ids removed; a resource without a path gets kpt's
//! default, `[NAMESPACE/]KIND_NAME.yaml`); `unwrap`, the resources as
//! multi-document YAML without any of kpt's annotations; `DIR`, a new
//! directory with one file per path, the resources in index order, without
//! the annotations. With no `--output`, a package is written back in place:
//! a file whose resources changed is replaced (atomically, keeping its mode),
//! a new path is created, a file whose resources are all gone is removed,
//! and a file whose resources did not change is left as it is.
//!
//! fnrun writes YAML with serde: a file it rewrites loses its comments and
//! formatting (kpt keeps them); the files it does not need to rewrite keep
//! theirs. A path that leaves the package (absolute, `..`) is refused
//! before anything is written; so is one through a link to a directory, or
//! to a file outside the package (kpt writes through those too).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use fnrun_api::Quoted;
use fnrun_api::resourcelist::{self, ResourceList};
use serde_norway::{Mapping, Value};

/// kpt's path annotation.
pub const PATH: &str = "internal.config.kubernetes.io/path";
/// kpt's index annotation: the resource's place among its file's resources.
pub const INDEX: &str = "internal.config.kubernetes.io/index";
/// The path annotation of kpt before v1.0.0-beta.x, still written beside [`PATH`].
pub const LEGACY_PATH: &str = "config.kubernetes.io/path";
/// The index annotation of kpt before v1.0.0-beta.x, still written beside [`INDEX`].
pub const LEGACY_INDEX: &str = "config.kubernetes.io/index";
/// kpt's id of a resource within one function call.
pub const ID: &str = "internal.config.kubernetes.io/id";
/// The same id, in its legacy form.
pub const LEGACY_ID: &str = "config.k8s.io/id";
/// kpt's id for reconciling legacy and internal annotations.
pub const MIGRATION_ID: &str = "internal.config.kubernetes.io/annotations-migration-resource-id";
/// Every annotation with this prefix is kpt's own, never written to a file.
const INTERNAL_PREFIX: &str = "internal.config.kubernetes.io/";

/// The most bytes of YAML read from a package directory.
pub const MAX_PACKAGE_BYTES: u64 = 128 << 20;
/// The most files read from a package directory.
pub const MAX_PACKAGE_FILES: usize = 10_000;

/// Where `fnrun run --krm`'s resources came from.
#[derive(Debug)]
pub enum Source {
    /// A ResourceList, passed to the function as it is.
    ResourceList,
    /// A stream of YAML documents, wrapped.
    Stream(Inputs),
    /// A package directory, read.
    Package(Package),
}

/// The path and index annotations of each input resource, by its kpt id.
pub type Inputs = HashMap<String, (Option<String>, Option<String>)>;

/// A package directory as read: its path and what each of its files held.
#[derive(Debug)]
pub struct Package {
    root: PathBuf,
    inputs: Inputs,
    /// Each file that held resources, by its path in the package (`/`
    /// separated), with its resources as read, in order, without kpt's
    /// annotations.
    files: BTreeMap<String, Vec<Mapping>>,
}

/// `--output`, `--output-dir` and `-o`: where the function's resources go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A ResourceList on stdout (YAML).
    Stdout,
    /// A ResourceList on stdout, as JSON.
    Json,
    /// The resources as multi-document YAML on stdout.
    Unwrap,
    /// A new directory, one file per path.
    Dir(PathBuf),
}

impl Output {
    /// `--output` as kpt's: `stdout`, `unwrap`, or a directory.
    pub fn parse(s: &str) -> Result<Output, String> {
        match s {
            "stdout" => Ok(Output::Stdout),
            "unwrap" => Ok(Output::Unwrap),
            "" => Err("expected stdout, unwrap or a directory".into()),
            dir => Ok(Output::Dir(PathBuf::from(dir))),
        }
    }

    /// `-o`, a format as everywhere else in fnrun: `json` or `yaml` (a
    /// ResourceList), and kpt's `stdout` and `unwrap`; never a directory.
    pub fn parse_format(s: &str) -> Result<Output, String> {
        match s {
            "json" => Ok(Output::Json),
            "yaml" | "stdout" => Ok(Output::Stdout),
            "unwrap" => Ok(Output::Unwrap),
            _ => Err(
                "-o is a format: json, yaml, stdout or unwrap; write the resources to a \
                 directory with --output DIR (or --output-dir DIR)"
                    .into(),
            ),
        }
    }
}

/// Why the input cannot be read as resources.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("input is neither a ResourceList nor KRM resources: {0}")]
    Stream(#[source] resourcelist::StreamError),
    #[error("{dir}: {err}")]
    Walk {
        dir: Quoted,
        #[source]
        err: walkdir::Error,
    },
    #[error("{path}: {err}")]
    Read {
        path: Quoted,
        #[source]
        err: std::io::Error,
    },
    #[error("{path}: {err}")]
    Resource {
        path: Quoted,
        #[source]
        err: resourcelist::StreamError,
    },
    #[error("{path}: {err}")]
    Ignore {
        path: Quoted,
        #[source]
        err: ignore::Error,
    },
    #[error("package {dir} holds more than 128 MiB of YAML or {MAX_PACKAGE_FILES} files")]
    TooLarge { dir: Quoted },
    #[error(transparent)]
    Yaml(#[from] fnrun_api::YamlError),
}

/// Why the output cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("resource {resource} has path {path}: {problem}")]
    Path {
        resource: String,
        path: Quoted,
        problem: &'static str,
    },
    #[error("directory {0} already exists; --output DIR must name a new directory")]
    Exists(Quoted),
    #[error("cannot write {path}: {err}")]
    Write {
        path: Quoted,
        #[source]
        err: std::io::Error,
    },
    #[error("cannot write {path}: {err}")]
    Render {
        path: Quoted,
        #[source]
        err: fnrun_api::YamlError,
    },
    #[error("cannot write the ResourceList as JSON: {0}")]
    Json(String),
}

/// Wraps a stream of YAML documents into a ResourceList as `kpt fn eval -`
/// does: the resources with their index annotations and kpt's ids (a path
/// annotation given in one form is copied to the other).
pub fn wrap_stream(stream: &[u8]) -> Result<(Vec<u8>, Inputs), InputError> {
    let mut items = resourcelist::resources(stream).map_err(InputError::Stream)?;
    for (index, item) in items.iter_mut().enumerate() {
        let annotations = annotations_mut(item);
        let path = string(annotations, PATH).or_else(|| string(annotations, LEGACY_PATH));
        if let Some(path) = path {
            annotations.insert(LEGACY_PATH.into(), path.clone().into());
            annotations.insert(PATH.into(), path.into());
        }
        annotations.insert(LEGACY_INDEX.into(), index.to_string().into());
        annotations.insert(INDEX.into(), index.to_string().into());
    }
    let inputs = add_ids(&mut items);
    Ok((ResourceList::new(items).to_yaml()?.into_bytes(), inputs))
}

/// Reads the package directory `dir` as kpt does and wraps its resources
/// into a ResourceList (see the module's documentation).
pub fn read_package(dir: &Path) -> Result<(Vec<u8>, Package), InputError> {
    let root = std::path::absolute(dir).map_err(|err| InputError::Read {
        path: quoted(dir),
        err,
    })?;
    let mut files = BTreeMap::new();
    let mut items = Vec::new();
    let (mut bytes, mut count) = (0u64, 0usize);
    // `.krmignore` files: the package's own and each subpackage's (a
    // directory with a Kptfile), applying below it.
    let mut ignores: Vec<(PathBuf, ignore::gitignore::Gitignore)> = Vec::new();
    let mut walk = walkdir::WalkDir::new(&root)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter();
    while let Some(entry) = walk.next() {
        let entry = entry.map_err(|err| InputError::Walk {
            dir: quoted(&root),
            err,
        })?;
        let path = entry.path();
        let is_dir = entry.file_type().is_dir();
        if path != root
            && ignores.iter().any(|(base, matcher)| {
                path.starts_with(base) && matcher.matched(path, is_dir).is_ignore()
            })
        {
            if is_dir {
                walk.skip_current_dir();
            }
            continue;
        }
        if is_dir {
            let krmignore = path.join(".krmignore");
            if (path == root || path.join("Kptfile").is_file()) && krmignore.is_file() {
                let (matcher, err) = ignore::gitignore::Gitignore::new(&krmignore);
                if let Some(err) = err {
                    return Err(InputError::Ignore {
                        path: quoted(&krmignore),
                        err,
                    });
                }
                ignores.push((path.to_owned(), matcher));
            }
            continue;
        }
        let name = entry.file_name().to_string_lossy();
        let wanted = name == "Kptfile"
            || [".yaml", ".yml", ".json"]
                .iter()
                .any(|ext| name.ends_with(ext));
        // A link is read if it leads to a file.
        if !wanted || !path.is_file() {
            continue;
        }
        let relative = relative_name(&root, path);
        let content = std::fs::read(path).map_err(|err| InputError::Read {
            path: quoted(path),
            err,
        })?;
        bytes += content.len() as u64;
        count += 1;
        if bytes > MAX_PACKAGE_BYTES || count > MAX_PACKAGE_FILES {
            return Err(InputError::TooLarge { dir: quoted(&root) });
        }
        let resources = resourcelist::resources(&content).map_err(|err| InputError::Resource {
            path: Quoted::new(&relative),
            err,
        })?;
        if resources.is_empty() {
            continue;
        }
        for (index, mut item) in resources.iter().cloned().enumerate() {
            let annotations = annotations_mut(&mut item);
            annotations.insert(LEGACY_INDEX.into(), index.to_string().into());
            annotations.insert(LEGACY_PATH.into(), relative.clone().into());
            annotations.insert(INDEX.into(), index.to_string().into());
            annotations.insert(PATH.into(), relative.clone().into());
            items.push(item);
        }
        files.insert(
            relative,
            resources.into_iter().map(|mut r| strip(&mut r)).collect(),
        );
    }
    let inputs = add_ids(&mut items);
    let list = ResourceList::new(items).to_yaml()?.into_bytes();
    Ok((
        list,
        Package {
            root,
            inputs,
            files,
        },
    ))
}

/// `path` relative to `root`, `/` separated.
fn relative_name(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

fn quoted(path: &Path) -> Quoted {
    Quoted::new(&path.to_string_lossy())
}

/// Adds kpt's ids, 1-based, and the 0-based migration id, in kpt's order;
/// returns each resource's path and index by its id.
fn add_ids(items: &mut [Mapping]) -> Inputs {
    let mut inputs = Inputs::new();
    for (n, item) in items.iter_mut().enumerate() {
        let annotations = annotations_mut(item);
        inputs.insert(
            (n + 1).to_string(),
            (string(annotations, PATH), string(annotations, INDEX)),
        );
        annotations.insert(MIGRATION_ID.into(), n.to_string().into());
        annotations.insert(ID.into(), (n + 1).to_string().into());
        annotations.insert(LEGACY_ID.into(), (n + 1).to_string().into());
    }
    inputs
}

/// `metadata.annotations` of `item`, created if missing.
fn annotations_mut(item: &mut Mapping) -> &mut Mapping {
    let metadata = item
        .entry("metadata".into())
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if !metadata.is_mapping() {
        *metadata = Value::Mapping(Mapping::new());
    }
    let Value::Mapping(metadata) = metadata else {
        unreachable!("made a mapping above")
    };
    let annotations = metadata
        .entry("annotations".into())
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if !annotations.is_mapping() {
        *annotations = Value::Mapping(Mapping::new());
    }
    let Value::Mapping(annotations) = annotations else {
        unreachable!("made a mapping above")
    };
    annotations
}

fn annotations(item: &Mapping) -> Option<&Mapping> {
    item.get("metadata")?.get("annotations")?.as_mapping()
}

/// An annotation's value as a string (a number is taken as its text).
fn string(annotations: &Mapping, key: &str) -> Option<String> {
    match annotations.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Removes kpt's annotations (and an `annotations` left empty) from `item`;
/// returns it.
fn strip(item: &mut Mapping) -> Mapping {
    if let Some(Value::Mapping(metadata)) = item.get_mut("metadata")
        && let Some(Value::Mapping(annotations)) = metadata.get_mut("annotations")
    {
        annotations.retain(|key, _| {
            key.as_str().is_none_or(|k| {
                !(k.starts_with(INTERNAL_PREFIX)
                    || k == LEGACY_PATH
                    || k == LEGACY_INDEX
                    || k == LEGACY_ID)
            })
        });
        if annotations.is_empty() {
            metadata.remove("annotations");
        }
    }
    item.clone()
}

/// A resource's `apiVersion/kind/[namespace/]name`, for messages.
fn describe(item: &Mapping) -> String {
    let field = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_owned();
    let metadata = item.get("metadata");
    let namespace = field(metadata.and_then(|m| m.get("namespace")));
    let name = field(metadata.and_then(|m| m.get("name")));
    let text = format!(
        "{}/{}/{}{}",
        field(item.get("apiVersion")),
        field(item.get("kind")),
        if namespace.is_empty() {
            String::new()
        } else {
            format!("{namespace}/")
        },
        name
    );
    fnrun_api::text::bounded(&text, fnrun_api::MAX_QUOTED).into_owned()
}

/// One output resource and where it goes.
struct Placed {
    path: String,
    index: Option<i64>,
    item: Mapping,
}

/// The path and index of each output resource (see the module's
/// documentation), checked to stay in the package.
fn place(list: &ResourceList, inputs: &Inputs) -> Result<Vec<Placed>, OutputError> {
    list.items
        .iter()
        .map(|item| {
            let empty = Mapping::new();
            let a = annotations(item).unwrap_or(&empty);
            let original = string(a, ID).and_then(|id| inputs.get(&id));
            let path = reconcile(
                string(a, PATH),
                string(a, LEGACY_PATH),
                original.and_then(|o| o.0.as_ref()),
            )
            .unwrap_or_else(|| default_path(item));
            let index = reconcile(
                string(a, INDEX),
                string(a, LEGACY_INDEX),
                original.and_then(|o| o.1.as_ref()),
            )
            .and_then(|i| i.trim().parse().ok());
            if let Err(problem) = check_path(&path) {
                return Err(OutputError::Path {
                    resource: describe(item),
                    path: Quoted::new(&path),
                    problem,
                });
            }
            Ok(Placed {
                path,
                index,
                item: item.clone(),
            })
        })
        .collect()
}

/// The value of an annotation given in two forms: when they differ, the one
/// the function changed (the other still has the input's value), else the
/// internal one.
fn reconcile(
    internal: Option<String>,
    legacy: Option<String>,
    input: Option<&String>,
) -> Option<String> {
    match (internal, legacy) {
        (Some(internal), Some(legacy)) if internal != legacy => Some(if Some(&internal) == input {
            legacy
        } else {
            internal
        }),
        (internal, legacy) => internal.or(legacy),
    }
}

/// kpt's path for a resource without one: `[NAMESPACE/]KIND_NAME.yaml`, the
/// kind in lower case.
fn default_path(item: &Mapping) -> String {
    let field = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_owned();
    let metadata = item.get("metadata");
    let namespace = field(metadata.and_then(|m| m.get("namespace")));
    let file = format!(
        "{}_{}.yaml",
        field(item.get("kind")).to_lowercase(),
        field(metadata.and_then(|m| m.get("name")))
    );
    if namespace.is_empty() {
        file
    } else {
        format!("{namespace}/{file}")
    }
}

/// A path must name a file in the package.
fn check_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("an empty path");
    }
    if path.contains('\0') {
        return Err("a NUL byte in it");
    }
    let p = Path::new(path);
    if p.is_absolute() {
        return Err("an absolute path, outside the package");
    }
    if p.components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err("outside the package");
    }
    if path.ends_with('/') || p.file_name().is_none() {
        return Err("not a file name");
    }
    Ok(())
}

/// The resources of each path, in index order (a resource without an index
/// after those with one, in output order).
fn by_path(placed: Vec<Placed>) -> BTreeMap<String, Vec<Mapping>> {
    let mut files: BTreeMap<String, Vec<(Option<i64>, Mapping)>> = BTreeMap::new();
    for p in placed {
        // `a/./b.yaml` and `a/b.yaml` are one file.
        let path = Path::new(&p.path)
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        let mut item = p.item;
        files
            .entry(path)
            .or_default()
            .push((p.index, strip(&mut item)));
    }
    files
        .into_iter()
        .map(|(path, mut items)| {
            items.sort_by_key(|(index, _)| index.unwrap_or(i64::MAX));
            (path, items.into_iter().map(|(_, item)| item).collect())
        })
        .collect()
}

/// A file's text: one JSON object for a `.json` file holding one resource,
/// else YAML documents separated by `---`.
fn render(path: &str, items: &[Mapping]) -> Result<Vec<u8>, OutputError> {
    if path.ends_with(".json")
        && let [item] = items
        && let Ok(mut json) = serde_json::to_vec_pretty(item)
    {
        json.push(b'\n');
        return Ok(json);
    }
    documents(items).map_err(|err| OutputError::Render {
        path: Quoted::new(path),
        err,
    })
}

/// `items` as YAML documents separated by `---`.
fn documents(items: &[Mapping]) -> Result<Vec<u8>, fnrun_api::YamlError> {
    let mut out = String::new();
    for (n, item) in items.iter().enumerate() {
        if n > 0 {
            out.push_str("---\n");
        }
        out.push_str(&serde_norway::to_string(item).map_err(fnrun_api::YamlError::from)?);
    }
    Ok(out.into_bytes())
}

/// Writes the function's output `list` as `output` says, or back into the
/// package `source` was read from when there is no `output`; returns what
/// goes to stdout.
pub fn write(
    list: &ResourceList,
    source: &Source,
    output: Option<&Output>,
) -> Result<Vec<u8>, OutputError> {
    let none = Inputs::new();
    let (package, inputs) = match source {
        Source::Package(package) => (Some(package), &package.inputs),
        Source::Stream(inputs) => (None, inputs),
        Source::ResourceList => (None, &none),
    };
    let placed = place(list, inputs)?;
    match (output, package) {
        (Some(Output::Unwrap), _) => {
            let items: Vec<Mapping> = placed.into_iter().map(|mut p| strip(&mut p.item)).collect();
            documents(&items).map_err(|err| OutputError::Render {
                path: Quoted::new("stdout"),
                err,
            })
        }
        (Some(Output::Stdout | Output::Json), _) | (None, None) => {
            let items = placed
                .into_iter()
                .map(|p| {
                    let mut item = p.item;
                    let index = p.index.map(|i| i.to_string());
                    let annotations = annotations_mut(&mut item);
                    annotations.retain(|key, _| {
                        key.as_str()
                            .is_none_or(|k| k != ID && k != LEGACY_ID && k != MIGRATION_ID)
                    });
                    for key in [LEGACY_PATH, PATH] {
                        annotations.insert(key.into(), p.path.clone().into());
                    }
                    if let Some(index) = index {
                        for key in [LEGACY_INDEX, INDEX] {
                            annotations.insert(key.into(), index.clone().into());
                        }
                    }
                    item
                })
                .collect();
            let yaml = ResourceList::new(items)
                .to_yaml()
                .map_err(|err| OutputError::Render {
                    path: Quoted::new("stdout"),
                    err,
                })?;
            if output != Some(&Output::Json) {
                return Ok(yaml.into_bytes());
            }
            let value: serde_json::Value = serde_norway::from_str(&yaml)
                .map_err(|e| OutputError::Json(fnrun_runner::error::bounded(&e, 1024)))?;
            let mut json = serde_json::to_vec_pretty(&value)
                .map_err(|e| OutputError::Json(fnrun_runner::error::bounded(&e, 1024)))?;
            json.push(b'\n');
            Ok(json)
        }
        (Some(Output::Dir(dir)), _) => {
            if std::fs::symlink_metadata(dir).is_ok() {
                return Err(OutputError::Exists(quoted(dir)));
            }
            std::fs::create_dir_all(dir).map_err(|err| OutputError::Write {
                path: quoted(dir),
                err,
            })?;
            let files = by_path(placed)
                .into_iter()
                .map(|(path, items)| Ok((render(&path, &items)?, path)))
                .collect::<Result<Vec<_>, OutputError>>()?;
            for (bytes, path) in files {
                write_file(dir, &path, &bytes)?;
            }
            Ok(Vec::new())
        }
        (None, Some(package)) => {
            let files = by_path(placed);
            // Render and check everything first: nothing is written unless
            // all can be.
            let mut changed = Vec::new();
            for (path, items) in &files {
                if package.files.get(path) != Some(items) {
                    target(&package.root, path, false)?;
                    changed.push((path, render(path, items)?));
                }
            }
            for (path, bytes) in changed {
                write_file(&package.root, path, &bytes)?;
            }
            for path in package.files.keys() {
                if !files.contains_key(path) {
                    let file = package.root.join(path);
                    std::fs::remove_file(&file).map_err(|err| OutputError::Write {
                        path: quoted(&file),
                        err,
                    })?;
                }
            }
            Ok(Vec::new())
        }
    }
}

/// Where `root/relative` is written, checked before anything is: no
/// directory on the way may be a symbolic link or something else than a
/// directory, and the file must be a regular file, or a link to one in the
/// package (written through, as kpt does; a link out of it is refused).
/// Directories that do not exist yet are created when `create` is set.
fn target(root: &Path, relative: &str, create: bool) -> Result<PathBuf, OutputError> {
    let target = root.join(relative);
    let fail = |err: std::io::Error| OutputError::Write {
        path: quoted(&target),
        err,
    };
    let mut dir = root.to_path_buf();
    let parts: Vec<_> = Path::new(relative).components().collect();
    for part in &parts[..parts.len().saturating_sub(1)] {
        dir.push(part);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(fail(std::io::Error::other(format!(
                    "{} is a symbolic link; fnrun does not write through one",
                    dir.display()
                ))));
            }
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(fail(std::io::Error::other(format!(
                    "{} is not a directory",
                    dir.display()
                ))));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if !create {
                    // Nothing below it exists: nothing to check.
                    return Ok(target.clone());
                }
                std::fs::create_dir(&dir).map_err(fail)?;
            }
            Err(e) => return Err(fail(e)),
        }
    }
    match std::fs::symlink_metadata(&target) {
        Ok(m) if m.file_type().is_symlink() => {
            let resolved = std::fs::canonicalize(&target).map_err(fail)?;
            let inside = std::fs::canonicalize(root).is_ok_and(|root| resolved.starts_with(root));
            if !inside || !resolved.is_file() {
                return Err(fail(std::io::Error::other(format!(
                    "{} is a symbolic link to {}, outside the package or not a file",
                    target.display(),
                    resolved.display()
                ))));
            }
            Ok(resolved)
        }
        Ok(m) if !m.is_file() => Err(fail(std::io::Error::other("not a regular file"))),
        _ => Ok(target.clone()),
    }
}

/// Writes `bytes` to `root/relative` (see [`target`]), replacing the file
/// atomically and keeping an existing file's mode.
fn write_file(root: &Path, relative: &str, bytes: &[u8]) -> Result<(), OutputError> {
    let target = target(root, relative, true)?;
    let fail = |err: std::io::Error| OutputError::Write {
        path: quoted(&root.join(relative)),
        err,
    };
    let mode = std::fs::metadata(&target)
        .ok()
        .map(|m| m.permissions().mode() & 0o7777);
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir = target.parent().unwrap_or(root);
    let temp = dir.join(format!(".{name}.fnrun-{}", std::process::id()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&temp)?;
        file.write_all(bytes)?;
        if let Some(mode) = mode {
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        file.sync_all()?;
        std::fs::rename(&temp, &target)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written.map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(s: &str) -> Mapping {
        serde_norway::from_str(s).unwrap()
    }

    fn items(list: &[u8]) -> Vec<Mapping> {
        resourcelist::validate_input(list).unwrap().items
    }

    fn annotation(item: &Mapping, key: &str) -> Option<String> {
        annotations(item).and_then(|a| string(a, key))
    }

    #[test]
    fn wraps_a_stream_as_kpt_fn_eval_does() {
        let stream = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n# nothing\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n  annotations:\n    config.kubernetes.io/path: x/y.yaml\n";
        let (list, inputs) = wrap_stream(stream).unwrap();
        let items = items(&list);
        let keys = |item: &Mapping| -> Vec<String> {
            annotations(item)
                .unwrap()
                .keys()
                .map(|k| k.as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            keys(&items[0]),
            [LEGACY_INDEX, INDEX, MIGRATION_ID, ID, LEGACY_ID]
        );
        assert_eq!(
            keys(&items[1]),
            [
                LEGACY_PATH,
                PATH,
                LEGACY_INDEX,
                INDEX,
                MIGRATION_ID,
                ID,
                LEGACY_ID
            ]
        );
        assert_eq!(annotation(&items[1], PATH).as_deref(), Some("x/y.yaml"));
        assert_eq!(annotation(&items[1], INDEX).as_deref(), Some("1"));
        assert_eq!(annotation(&items[1], ID).as_deref(), Some("2"));
        assert_eq!(inputs["2"], (Some("x/y.yaml".into()), Some("1".into())));
        let err = wrap_stream(b"a: 1\n").unwrap_err().to_string();
        assert_eq!(
            err,
            "input is neither a ResourceList nor KRM resources: document 0: resource must have `apiVersion`"
        );
    }

    /// A package as kpt reads one, with what it leaves out.
    fn package() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let cm =
            |name: &str| format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n");
        let files: &[(&str, String)] = &[
            (
                "Kptfile",
                "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: app\n".into(),
            ),
            (
                "b.yaml",
                format!("# kept\n{}---\n---\n{}", cm("b0"), cm("b1")),
            ),
            ("a.yml", cm("a")),
            (
                "j.json",
                "{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"metadata\":{\"name\":\"j\"}}"
                    .into(),
            ),
            (".hidden/h.yaml", cm("h")),
            ("upper.YAML", cm("upper")),
            ("notes.txt", cm("txt")),
            ("empty.yaml", "# nothing\n".into()),
            ("skipped/s.yaml", cm("s")),
            ("skip.yaml", cm("skip")),
            (".krmignore", "skipped/\nskip.yaml\n".into()),
            (
                "sub/Kptfile",
                "apiVersion: kpt.dev/v1\nkind: Kptfile\nmetadata:\n  name: sub\n".into(),
            ),
            ("sub/.krmignore", "x.yaml\n".into()),
            ("sub/x.yaml", cm("x")),
            ("sub/y.yaml", cm("y")),
            ("plain/.krmignore", "z.yaml\n".into()),
            ("plain/z.yaml", cm("z")),
        ];
        for (path, text) in files {
            let path = root.join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let outside = root.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("o.yaml"), cm("o")).unwrap();
        std::os::unix::fs::symlink("outside", root.join("zdir")).unwrap();
        std::os::unix::fs::symlink("a.yml", root.join("link.yaml")).unwrap();
        std::fs::write(root.join(".krmignore"), "skipped/\nskip.yaml\noutside/\n").unwrap();
        dir
    }

    fn names(list: &[u8]) -> Vec<(String, String, String)> {
        items(list)
            .iter()
            .map(|i| {
                (
                    i["metadata"]["name"].as_str().unwrap().to_owned(),
                    annotation(i, PATH).unwrap(),
                    annotation(i, INDEX).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn reads_a_package_as_kpt_does() {
        let dir = package();
        let (list, package) = read_package(dir.path()).unwrap();
        let s = |a: &str, b: &str, c: &str| (a.to_owned(), b.to_owned(), c.to_owned());
        assert_eq!(
            names(&list),
            [
                s("h", ".hidden/h.yaml", "0"),
                s("app", "Kptfile", "0"),
                s("a", "a.yml", "0"),
                s("b0", "b.yaml", "0"),
                s("b1", "b.yaml", "1"),
                s("j", "j.json", "0"),
                s("a", "link.yaml", "0"),
                s("z", "plain/z.yaml", "0"),
                s("sub", "sub/Kptfile", "0"),
                s("y", "sub/y.yaml", "0"),
            ]
        );
        let first = &items(&list)[0];
        assert_eq!(
            annotation(first, LEGACY_PATH).as_deref(),
            Some(".hidden/h.yaml")
        );
        assert_eq!(annotation(first, ID).as_deref(), Some("1"));
        assert_eq!(package.files["b.yaml"].len(), 2);
        assert!(annotations(&package.files["b.yaml"][0]).is_none());

        // A file that is not KRM is refused, by its path.
        std::fs::write(dir.path().join("bad.yaml"), "a: 1\n---\nfoo: bar\n").unwrap();
        let err = read_package(dir.path()).unwrap_err().to_string();
        assert_eq!(
            err,
            "\"bad.yaml\": document 0: resource must have `apiVersion`"
        );
        std::fs::write(dir.path().join("bad.yaml"), "a: [\n").unwrap();
        let err = read_package(dir.path()).unwrap_err().to_string();
        assert!(err.starts_with("\"bad.yaml\": document 0: "), "{err}");
    }

    /// The package's items as the function got them.
    fn read(dir: &Path) -> (Vec<Mapping>, Source) {
        let (list, package) = read_package(dir).unwrap();
        (items(&list), Source::Package(package))
    }

    #[test]
    fn writes_a_package_back_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("keep.yaml"), "# a comment kpt would keep\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: keep\n").unwrap();
        std::fs::write(root.join("two.yaml"), "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: one\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: two\n").unwrap();
        std::fs::write(
            root.join("gone.yaml"),
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: gone\n",
        )
        .unwrap();
        std::fs::write(root.join("readme.md"), "not a resource\n").unwrap();
        std::fs::set_permissions(
            root.join("two.yaml"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let (mut items, source) = read(root);
        // The function drops `gone`, changes `two` (placed first in the
        // output, its index keeps it second), moves `one` by its legacy path
        // only, and adds two resources without a path.
        items.retain(|i| i["metadata"]["name"] != "gone");
        for item in &mut items {
            match item["metadata"]["name"].as_str().unwrap() {
                "two" => {
                    item.insert("data".into(), yaml("{a: b}").into());
                }
                "one" => {
                    annotations_mut(item).insert(LEGACY_PATH.into(), "moved/one.yaml".into());
                }
                _ => {}
            }
        }
        items.rotate_right(1);
        items.push(yaml(
            "{apiVersion: v1, kind: ConfigMap, metadata: {name: New, namespace: ns}}",
        ));
        items.push(yaml(
            "{apiVersion: v1, kind: Secret, metadata: {name: s, annotations: {team: a}}}",
        ));
        let list = ResourceList::new(items);
        assert_eq!(write(&list, &source, None).unwrap(), b"");
        let read_file = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
        assert!(
            read_file("keep.yaml").starts_with("# a comment"),
            "unchanged: left alone"
        );
        assert_eq!(
            read_file("two.yaml"),
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: two\ndata:\n  a: b\n"
        );
        let mode = std::fs::metadata(root.join("two.yaml"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            read_file("moved/one.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: one\n"
        );
        assert_eq!(
            read_file("ns/configmap_New.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: New\n  namespace: ns\n"
        );
        assert_eq!(
            read_file("secret_s.yaml"),
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  annotations:\n    team: a\n"
        );
        assert!(!root.join("gone.yaml").exists());
        assert_eq!(read_file("readme.md"), "not a resource\n");
        let mut files: Vec<_> = walkdir::WalkDir::new(root)
            .into_iter()
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_file())
            .map(|e| relative_name(root, e.path()))
            .collect();
        files.sort();
        assert_eq!(
            files,
            [
                "keep.yaml",
                "moved/one.yaml",
                "ns/configmap_New.yaml",
                "readme.md",
                "secret_s.yaml",
                "two.yaml"
            ]
        );
    }

    #[test]
    fn refuses_paths_out_of_the_package_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("pkg");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(
            root.join("a.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n",
        )
        .unwrap();
        for (path, want) in [
            (
                "../evil.yaml",
                "resource v1/Secret/e has path \"../evil.yaml\": outside the package",
            ),
            (
                "/etc/evil.yaml",
                "resource v1/Secret/e has path \"/etc/evil.yaml\": an absolute path, outside the package",
            ),
            ("", "resource v1/Secret/e has path \"\": an empty path"),
        ] {
            let (mut items, source) = read(&root);
            items[0].insert("data".into(), yaml("{changed: x}").into());
            let mut evil = yaml("{apiVersion: v1, kind: Secret, metadata: {name: e}}");
            annotations_mut(&mut evil).insert(PATH.into(), path.into());
            items.push(evil);
            let err = write(&ResourceList::new(items), &source, None).unwrap_err();
            assert_eq!(err.to_string(), want);
            assert!(
                !std::fs::read_to_string(root.join("a.yaml"))
                    .unwrap()
                    .contains("changed")
            );
            assert!(!dir.path().join("evil.yaml").exists());
        }
        // Never through a link.
        std::fs::create_dir(dir.path().join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), root.join("link")).unwrap();
        let (mut items, source) = read(&root);
        let mut item = yaml("{apiVersion: v1, kind: Secret, metadata: {name: e}}");
        annotations_mut(&mut item).insert(PATH.into(), "link/x.yaml".into());
        items.push(item);
        let err = write(&ResourceList::new(items), &source, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is a symbolic link; fnrun does not write through one"),
            "{err}"
        );
        assert!(!dir.path().join("elsewhere/x.yaml").exists());
        std::fs::remove_file(root.join("link")).unwrap();

        // A link to a file: written through when the file is in the
        // package, refused when it is not.
        let outside = dir.path().join("elsewhere/o.yaml");
        std::fs::write(
            &outside,
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: o\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("a.yaml", root.join("in.yaml")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("out.yaml")).unwrap();
        let label = |items: &mut Vec<Mapping>, skip: &str| {
            for item in items.iter_mut() {
                if annotation(item, PATH).as_deref() != Some(skip) {
                    item.insert("data".into(), yaml("{labelled: x}").into());
                }
            }
        };
        let (mut items, source) = read(&root);
        label(&mut items, "out.yaml");
        write(&ResourceList::new(items), &source, None).unwrap();
        assert!(
            std::fs::read_to_string(root.join("a.yaml"))
                .unwrap()
                .contains("labelled")
        );
        assert!(
            std::fs::symlink_metadata(root.join("in.yaml"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let (mut items, source) = read(&root);
        label(&mut items, "");
        let err = write(&ResourceList::new(items), &source, None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("is a symbolic link to")
                && err.ends_with("outside the package or not a file"),
            "{err}"
        );
        assert!(
            !std::fs::read_to_string(&outside)
                .unwrap()
                .contains("labelled")
        );
    }

    #[test]
    fn writes_stdout_unwrap_and_a_new_directory_as_kpt() {
        let stream = b"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  annotations:\n    team: x\n---\n{\"apiVersion\": \"v1\", \"kind\": \"Secret\", \"metadata\": {\"name\": \"j\", \"annotations\": {\"config.kubernetes.io/path\": \"j.json\"}}}\n";
        let (list, inputs) = wrap_stream(stream).unwrap();
        let list = resourcelist::validate_output(&list).unwrap();
        let source = Source::Stream(inputs);
        let unwrapped = write(&list, &source, Some(&Output::Unwrap)).unwrap();
        assert_eq!(
            String::from_utf8(unwrapped).unwrap(),
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  annotations:\n    team: x\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: j\n"
        );
        let stdout = write(&list, &source, Some(&Output::Stdout)).unwrap();
        let items = items(&stdout);
        assert_eq!(
            annotation(&items[0], PATH).as_deref(),
            Some("configmap_a.yaml")
        );
        assert_eq!(
            annotation(&items[0], LEGACY_PATH).as_deref(),
            Some("configmap_a.yaml")
        );
        assert_eq!(annotation(&items[1], INDEX).as_deref(), Some("1"));
        assert_eq!(annotation(&items[1], ID), None);
        assert_eq!(annotation(&items[1], LEGACY_ID), None);
        assert_eq!(annotation(&items[1], MIGRATION_ID), None);
        // Unchanged, without --output: the same ResourceList.
        assert_eq!(write(&list, &source, None).unwrap(), stdout);

        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        assert_eq!(
            write(&list, &source, Some(&Output::Dir(out.clone()))).unwrap(),
            b""
        );
        assert_eq!(
            std::fs::read_to_string(out.join("j.json")).unwrap(),
            "{\n  \"apiVersion\": \"v1\",\n  \"kind\": \"Secret\",\n  \"metadata\": {\n    \"name\": \"j\"\n  }\n}\n"
        );
        assert!(out.join("configmap_a.yaml").is_file());
        let err = write(&list, &source, Some(&Output::Dir(out.clone()))).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("already exists; --output DIR must name a new directory"),
            "{err}"
        );
        assert_eq!(Output::parse("stdout"), Ok(Output::Stdout));
        assert_eq!(Output::parse("unwrap"), Ok(Output::Unwrap));
        assert_eq!(Output::parse("o"), Ok(Output::Dir("o".into())));
        assert!(Output::parse("").is_err());
        // `-o` is a format: json, yaml (kpt's stdout and unwrap too).
        assert_eq!(Output::parse_format("json"), Ok(Output::Json));
        assert_eq!(Output::parse_format("yaml"), Ok(Output::Stdout));
        assert_eq!(Output::parse_format("unwrap"), Ok(Output::Unwrap));
        let e = Output::parse_format("out").unwrap_err();
        assert!(e.contains("--output DIR"), "{e}");
        let json = write(&list, &source, Some(&Output::Json)).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value["kind"], "ResourceList");
        let yaml: serde_json::Value = serde_norway::from_slice(&stdout).unwrap();
        assert_eq!(value, yaml);
    }

    #[test]
    fn a_package_too_large_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        for n in 0..=MAX_PACKAGE_FILES {
            std::fs::write(dir.path().join(format!("{n}.yaml")), "").unwrap();
        }
        let err = read_package(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("holds more than 128 MiB of YAML or 10000 files"),
            "{err}"
        );
    }
}
