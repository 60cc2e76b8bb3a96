//! KRM input as kpt takes it: `fnrun run IMAGE DIR` reads a package
//! directory, and `fnrun run IMAGE FILE|-` a multi-document YAML stream,
//! wraps them into a ResourceList and writes the function's resources back
//! as `kpt fn eval` does (in place, `--output stdout|unwrap|DIR`).
//!
//! The real kpt (`/usr/bin/kpt`) is the oracle: the same Go KRM function
//! (`tests/go/krmfn`) runs under kpt as `--exec` (its host binary) and under
//! fnrun (its image, from a real registry), on two copies of one package,
//! and what the function saw and what was written must be the same: the
//! ResourceList items with their annotations (kpt's `seqindent` aside),
//! and the files, compared as parsed YAML (fnrun does not keep comments in
//! the files it rewrites; kpt does).

use std::path::PathBuf;

use fnrun_tests::cli::Cli;
use fnrun_tests::krm::{self, documents, items_without_seqindent, run_kpt, tree};
use fnrun_tests::process::Finished;
use fnrun_tests::user::rootless_user;
use serde_norway::Value;

/// What the test compares: kpt and the Go function's binary, its image, and
/// a directory for packages.
struct Oracle {
    kpt: PathBuf,
    krmfn: PathBuf,
    image: String,
    dir: tempfile::TempDir,
    _registry: fnrun_tests::registry::Registry,
}

impl Oracle {
    fn new(test: &str) -> Option<Oracle> {
        let kpt = krm::kpt(test)?;
        let (registry, image, dir) = krm::setup();
        let krmfn = fnrun_tests::go::krm_function_binary().expect("krmfn builds");
        Some(Oracle {
            kpt,
            krmfn,
            image,
            dir,
            _registry: registry,
        })
    }

    /// A fresh copy of the sample package at `name`.
    fn package(&self, name: &str) -> PathBuf {
        let root = self.dir.path().join(name);
        std::fs::create_dir(&root).expect("mkdir");
        krm::write_package(&root).expect("package");
        root
    }

    /// `kpt fn eval ARGS --exec KRMFN -- FN_ARGS`.
    fn kpt(&self, args: &[&str], fn_args: &[&str], stdin: Option<&[u8]>) -> Finished {
        let krmfn = self.krmfn.display().to_string();
        let mut all = vec!["fn", "eval"];
        all.extend(args);
        all.extend(["--exec", &krmfn, "--"]);
        all.extend(fn_args);
        run_kpt(&self.kpt, self.dir.path(), &all, stdin)
    }
}

/// `fnrun run IMAGE ARGS -- FN_ARGS` with `cli`.
fn fnrun(
    cli: &Cli,
    image: &str,
    args: &[&str],
    fn_args: &[&str],
    stdin: Option<&[u8]>,
) -> Finished {
    let mut all = vec!["run", image];
    all.extend(args);
    all.push("--");
    all.extend(fn_args);
    cli.run(&all, stdin)
}

#[track_caller]
fn ok(out: Finished) -> Finished {
    assert_eq!(out.code, Some(0), "{}", out.describe());
    out
}

/// The items of the ResourceList in `text`, kpt's `seqindent` aside.
fn items(text: &str) -> Vec<Value> {
    items_without_seqindent(&krm::parse(text))
}

/// Drops the Services, adds a ConfigMap in a namespace, moves one resource
/// by its legacy path annotation, labels everything.
const CHANGES: [&str; 5] = [
    "drop=Service",
    "add=prod/extra",
    "move=web-settings=settings/web.yaml",
    "key=app",
    "value=web",
];

#[test]
fn a_function_sees_a_package_as_kpt_gives_it_and_it_is_written_back_alike() {
    let Some(o) = Oracle::new("a_function_sees_a_package_as_kpt_gives_it") else {
        return;
    };
    let seen = o.dir.path().join("seen");
    std::fs::create_dir(&seen).expect("mkdir");
    let kpt_pkg = o.package("kpt-pkg");
    let fnrun_pkg = o.package("fnrun-pkg");
    let kpt_seen = format!("seen={}", seen.join("kpt.yaml").display());
    ok(o.kpt(&["kpt-pkg"], &[&kpt_seen, "key=app", "value=web"], None));
    let cli = Cli::new().expect("cli");
    let mount = format!("type=bind,src={},dst=/seen,rw=true", seen.display());
    let out = ok(fnrun(
        &cli,
        &o.image,
        &[
            fnrun_pkg.to_str().unwrap(),
            "--as-current-user",
            "--mount",
            &mount,
        ],
        &["seen=/seen/fnrun.yaml", "key=app", "value=web"],
        None,
    ));
    // Nothing on stdout: the package was written in place.
    assert_eq!(out.stdout, "", "{}", out.describe());
    let read = |name: &str| std::fs::read_to_string(seen.join(name)).expect("seen");
    let (kpt_items, fnrun_items) = (items(&read("kpt.yaml")), items(&read("fnrun.yaml")));
    assert_eq!(kpt_items.len(), 9, "{}", read("kpt.yaml"));
    // kpt sets its ids in no fixed order: compared as YAML values.
    assert_eq!(fnrun_items, kpt_items);
    assert_eq!(tree(&fnrun_pkg), tree(&kpt_pkg));
    // What kpt leaves alone is there still; the labels are on every resource.
    let files = tree(&fnrun_pkg);
    assert_eq!(
        files["drafts/draft.yaml"][0]["metadata"]["labels"],
        Value::Null
    );
    assert_eq!(
        files["db/scratch.yaml"][0]["metadata"]["labels"],
        Value::Null
    );
    assert_eq!(
        files["service.yml"][0]["metadata"]["labels"]["app"].as_str(),
        Some("web")
    );
    assert_eq!(files["link.yaml"][0], Value::from("-> service.yml"));

    // Resources dropped, added and moved: in place, as kpt.
    let (kpt_pkg, fnrun_pkg) = (o.package("kpt-changed"), o.package("fnrun-changed"));
    ok(o.kpt(&["kpt-changed"], &CHANGES, None));
    ok(fnrun(
        &cli,
        &o.image,
        &[fnrun_pkg.to_str().unwrap()],
        &CHANGES,
        None,
    ));
    let files = tree(&fnrun_pkg);
    assert_eq!(files, tree(&kpt_pkg));
    assert!(files.contains_key("prod/configmap_extra.yaml"), "{files:?}");
    assert!(files.contains_key("settings/web.yaml"), "{files:?}");
    assert!(!files.contains_key("service.yml"), "{files:?}");

    // The same as an unprivileged user, on a package of its own.
    if let Some(user) = rootless_user("a_function_sees_a_package_as_kpt_gives_it (rootless)") {
        let cli = Cli::as_user(user.clone()).expect("cli");
        let pkg = cli.scratch().join("pkg");
        std::fs::create_dir(&pkg).expect("mkdir");
        krm::write_package(&pkg).expect("package");
        user.chown_recursive(&pkg).expect("chown");
        ok(fnrun(&cli, &o.image, &["pkg"], &CHANGES, None));
        assert_eq!(tree(&pkg), tree(&kpt_pkg));
    }
}

#[test]
fn output_stdout_unwrap_and_dir_are_kpts() {
    let Some(o) = Oracle::new("output_stdout_unwrap_and_dir_are_kpts") else {
        return;
    };
    let cli = Cli::new().expect("cli");
    let pkg = o.package("pkg");
    let untouched = tree(&pkg);
    let pkg_arg = pkg.to_str().unwrap();
    // --output stdout: a ResourceList.
    let kpt = ok(o.kpt(&["pkg", "-o", "stdout"], &CHANGES, None));
    let fnrun_out = ok(fnrun(
        &cli,
        &o.image,
        &[pkg_arg, "-o", "stdout"],
        &CHANGES,
        None,
    ));
    assert_eq!(items(&fnrun_out.stdout), items(&kpt.stdout));
    // --output unwrap: the resources, without kpt's annotations.
    let kpt = ok(o.kpt(&["pkg", "-o", "unwrap"], &CHANGES, None));
    let fnrun_out = ok(fnrun(
        &cli,
        &o.image,
        &[pkg_arg, "--output", "unwrap"],
        &CHANGES,
        None,
    ));
    assert_eq!(documents(&fnrun_out.stdout), documents(&kpt.stdout));
    for kpts in [
        "config.kubernetes.io/path",
        "config.kubernetes.io/index",
        "id:",
    ] {
        assert!(!fnrun_out.stdout.contains(kpts), "{}", fnrun_out.stdout);
    }
    // --output DIR: a new directory.
    let (kpt_out, fnrun_dir) = (o.dir.path().join("kpt-out"), o.dir.path().join("fnrun-out"));
    ok(o.kpt(&["pkg", "-o", kpt_out.to_str().unwrap()], &CHANGES, None));
    ok(fnrun(
        &cli,
        &o.image,
        &[pkg_arg, "--output", fnrun_dir.to_str().unwrap()],
        &CHANGES,
        None,
    ));
    assert_eq!(tree(&fnrun_dir), tree(&kpt_out));
    // None of these touched the package.
    assert_eq!(tree(&pkg), untouched);

    // A stream on stdin, as `kpt fn eval -`: a ResourceList by default
    // (fnrun tells KRM resources from a FunctionIO by itself), or unwrapped.
    let stream = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n# empty\n---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: b\n  annotations:\n    config.kubernetes.io/path: x/b.yaml\n";
    let kpt = ok(o.kpt(&["-"], &["key=app", "value=web"], Some(stream.as_bytes())));
    let fnrun_out = ok(fnrun(
        &cli,
        &o.image,
        &[],
        &["key=app", "value=web"],
        Some(stream.as_bytes()),
    ));
    assert_eq!(items(&fnrun_out.stdout), items(&kpt.stdout));
    let kpt = ok(o.kpt(&["-", "-o", "unwrap"], &CHANGES, Some(stream.as_bytes())));
    let file = cli.write_file("stream.yaml", stream).expect("stream");
    let fnrun_out = ok(fnrun(
        &cli,
        &o.image,
        &[&file, "-o", "unwrap"],
        &CHANGES,
        None,
    ));
    assert_eq!(documents(&fnrun_out.stdout), documents(&kpt.stdout));
}

#[test]
fn what_kpt_refuses_fnrun_refuses_and_writes_nothing() {
    let Some(o) = Oracle::new("what_kpt_refuses_fnrun_refuses") else {
        return;
    };
    let cli = Cli::new().expect("cli");
    let pkg = o.package("pkg");
    let pkg_arg = pkg.to_str().unwrap();
    let untouched = tree(&pkg);
    let refused = |out: &Finished, code: i32, want: &str| {
        assert_eq!(out.code, Some(code), "{}", out.describe());
        assert!(out.stderr.contains(want), "{}", out.describe());
        assert_eq!(out.stdout, "", "{}", out.describe());
        assert_eq!(tree(&pkg), untouched);
    };
    // A function that fails: nothing written, its results shown.
    let out = fnrun(
        &cli,
        &o.image,
        &[pkg_arg],
        &["key=a", "value=b", "fail=exit"],
        None,
    );
    refused(&out, 1, ": value is not allowed");
    let out = fnrun(
        &cli,
        &o.image,
        &[pkg_arg, "-o", "unwrap"],
        &["fail=result"],
        None,
    );
    refused(&out, 1, "the function reported 1 error result");
    // A resource moved out of the package: kpt and fnrun refuse it.
    let out = o.kpt(&["pkg"], &["move=web=../evil.yaml"], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    let out = fnrun(&cli, &o.image, &[pkg_arg], &["move=web=../evil.yaml"], None);
    refused(&out, 1, "has path \"../evil.yaml\": outside the package");
    assert!(!o.dir.path().join("evil.yaml").exists());
    // --output DIR names a directory that exists: refused before the run.
    let out = fnrun(&cli, &o.image, &[pkg_arg, "--output", pkg_arg], &[], None);
    refused(&out, 2, "the directory already exists");
    let out = fnrun(
        &cli,
        &o.image,
        &[pkg_arg, "--output-dir", pkg_arg],
        &[],
        None,
    );
    refused(&out, 2, "the directory already exists");
    // -o is a format, never a directory.
    let out = fnrun(&cli, &o.image, &[pkg_arg, "-o", "out"], &[], None);
    refused(
        &out,
        2,
        "write the resources to a directory with --output DIR",
    );
    // A file that is not KRM: kpt refuses the package, so does fnrun, by
    // the file's name.
    std::fs::write(pkg.join("values.yaml"), "replicas: 3\n").expect("write");
    let out = o.kpt(&["pkg"], &[], None);
    assert_eq!(out.code, Some(1), "{}", out.describe());
    assert!(out.stderr.contains("values.yaml"), "{}", out.describe());
    let out = fnrun(&cli, &o.image, &[pkg_arg], &[], None);
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stderr
            .contains("\"values.yaml\": document 0: resource must have `apiVersion`"),
        "{}",
        out.describe()
    );
    // --krm on YAML that is no KRM object.
    let out = cli.run(&["run", "--krm", &o.image], Some(b"replicas: 3\n"));
    assert_eq!(out.code, Some(2), "{}", out.describe());
    assert!(
        out.stderr
            .contains("input is not a ResourceList: kind is missing"),
        "{}",
        out.describe()
    );
}
