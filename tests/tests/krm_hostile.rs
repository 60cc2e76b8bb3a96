//! Hostile ResourceLists: refused before any container starts, at once, with
//! one clear error line of at most 4 KiB; and hostile function output,
//! refused before it is printed.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use fnrun_tests::cli::Cli;
use fnrun_tests::image::TestImage;
use fnrun_tests::krm::RESOURCE_LIST;
use fnrun_tests::registry::Registry;

/// The most bytes of fnrun's one error line (with its newline and prefix).
const LINE_MAX: usize = 4 << 10;

/// `apiVersion` and `kind` of a ResourceList, then `rest`.
fn rl(rest: &str) -> String {
    format!("apiVersion: config.kubernetes.io/v1\nkind: ResourceList\n{rest}")
}

/// Eleven levels of aliases, each ten of the one below: 10^11 scalars once
/// expanded.
fn alias_bomb() -> String {
    let mut doc = rl("items: []\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let refs = vec![format!("*a{}", i - 1); 10].join(", ");
        doc.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
    }
    doc
}

#[test]
fn hostile_resourcelists_are_refused_before_the_function_starts() {
    let registry = Registry::start().expect("registry starts");
    // It leaves a mark on the host if it ever starts.
    let image = TestImage::script("#!/bin/sh\ntouch /out/started\ncat\n")
        .push_to(&registry, "fns/marker:v1");
    let cli = Cli::new().expect("cli");
    std::fs::set_permissions(cli.scratch(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out_dir = cli.scratch().join("out");
    std::fs::create_dir(&out_dir).expect("mkdir");
    std::fs::set_permissions(&out_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let mount = format!("type=bind,src={},dst=/out,rw=true", out_dir.display());
    let run = |input: &[u8]| cli.run(&["run", "--krm", "--mount", &mount, &image], Some(input));
    // The image is pulled, and the marker works.
    let out = run(RESOURCE_LIST.as_bytes());
    assert_eq!(out.code, Some(0), "{}", out.describe());
    std::fs::remove_file(out_dir.join("started")).expect("the function left its mark");

    let huge = "x".repeat(16 << 20);
    let cases: Vec<(String, Vec<u8>, &str)> = vec![
        ("empty".into(), Vec::new(), "document is empty"),
        (
            "a sequence".into(),
            b"- a\n- b\n".to_vec(),
            "not a YAML mapping but a sequence",
        ),
        (
            "a scalar".into(),
            b"hello\n".to_vec(),
            "not a YAML mapping but a string",
        ),
        (
            "the wrong kind".into(),
            b"apiVersion: v1\nkind: List\nitems: []\n".to_vec(),
            "kind is \"List\", expected \"ResourceList\"",
        ),
        (
            "the wrong apiVersion".into(),
            b"apiVersion: v1\nkind: ResourceList\nitems: []\n".to_vec(),
            "apiVersion is \"v1\"",
        ),
        ("no items".into(), rl("").into_bytes(), "items is missing"),
        (
            "items not a list".into(),
            rl("items: {a: b}\n").into_bytes(),
            "items is a mapping, expected a sequence",
        ),
        (
            "an item that is no KRM object".into(),
            rl("items:\n- kind: ConfigMap\n  metadata: {name: x}\n").into_bytes(),
            "items[0]: resource must have `apiVersion`",
        ),
        (
            "a functionConfig that is a list".into(),
            rl("items: []\nfunctionConfig: [a]\n").into_bytes(),
            "functionConfig is a sequence",
        ),
        (
            "a huge kind".into(),
            format!("apiVersion: config.kubernetes.io/v1\nkind: {huge}\nitems: []\n").into_bytes(),
            "bytes elided",
        ),
        (
            "a huge broken document".into(),
            format!("{}items: [\"{huge}", rl("")).into_bytes(),
            "",
        ),
        (
            "an alias bomb".into(),
            alias_bomb().into_bytes(),
            "YAML aliases expand the document by more than",
        ),
        (
            "deep flow nesting (libyaml takes quadratic time on it)".into(),
            rl(&format!(
                "items: {}{}\n",
                "[".repeat(100_000),
                "]".repeat(100_000)
            ))
            .into_bytes(),
            "nested more than 128 deep",
        ),
        (
            "two documents".into(),
            format!("{RESOURCE_LIST}---\n{RESOURCE_LIST}").into_bytes(),
            "more than one document",
        ),
        (
            "not UTF-8".into(),
            b"kind: \xff\xfe\n".to_vec(),
            "input is not a ResourceList",
        ),
    ];
    for (what, input, want) in cases {
        let out = run(&input);
        assert_eq!(out.code, Some(2), "{what}: {}", out.describe());
        assert!(out.stdout.is_empty(), "{what}: {}", out.describe());
        assert!(
            out.stderr
                .starts_with("fnrun: input is not a ResourceList: "),
            "{what}: {}",
            out.describe()
        );
        assert!(out.stderr.contains(want), "{what}: {}", out.describe());
        assert_eq!(out.stderr.lines().count(), 1, "{what}: {}", out.describe());
        assert!(
            out.stderr.len() <= LINE_MAX + 8,
            "{what}: {} bytes",
            out.stderr.len()
        );
        assert!(
            out.elapsed < Duration::from_secs(20),
            "{what}: {}",
            out.describe()
        );
        assert!(
            !out_dir.join("started").exists(),
            "{what}: the function started"
        );
    }
}

#[test]
fn hostile_output_is_refused_before_it_is_printed() {
    let registry = Registry::start().expect("registry starts");
    let cli = Cli::new().expect("cli");
    for (case, (script, want)) in [
        (
            "#!/bin/sh\ncat >/dev/null\necho 'apiVersion: config.kubernetes.io/v1'\necho 'kind: ResourceList'\necho 'items: [{kind: Secret}]'\n",
            "function output is not a ResourceList: items[0]: resource must have `apiVersion`",
        ),
        (
            "#!/bin/sh\ncat\necho 'results: [{message: m, severity: fatal}]'\n",
            "results[0]: severity is \"fatal\"",
        ),
        (
            "#!/bin/sh\ncat >/dev/null\necho 'apiVersion: config.kubernetes.io/v1'\necho 'kind: ResourceList'\nprintf 'items: [\"'\nhead -c 8000000 /dev/zero | tr '\\0' y\necho\n",
            "function output is not a ResourceList",
        ),
        // An alias bomb: 1 MiB and 1,000 aliases to it, never expanded.
        (
            "#!/bin/sh\ncat >/dev/null\necho 'apiVersion: config.kubernetes.io/v1'\necho 'kind: ResourceList'\nprintf 'items: []\\nbomb:\\n  s: &s \"'\nhead -c 1048576 /dev/zero | tr '\\0' a\nprintf '\"\\n  l: ['\ni=0; while [ $i -lt 1000 ]; do printf '*s,'; i=$((i+1)); done\nprintf '*s]\\n'\n",
            "YAML aliases expand the document by more than",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let image = TestImage::script(script).push_to(&registry, &format!("fns/hostile:v{case}"));
        let out = cli.run(&["run", "--krm", &image], Some(RESOURCE_LIST.as_bytes()));
        assert_eq!(out.code, Some(1), "{}", out.describe());
        assert!(out.stdout.is_empty(), "{}", out.describe());
        assert!(out.stderr.contains(want), "{}", out.describe());
        // The function exited 0: no exit code is reported for it.
        assert!(!out.stderr.contains("Exit code"), "{}", out.describe());
        let line = out.stderr.lines().last().unwrap_or_default();
        assert!(line.len() <= LINE_MAX, "{} bytes", line.len());
    }
}
