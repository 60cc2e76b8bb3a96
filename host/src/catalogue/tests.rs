use super::*;

fn parse_str(doc: &str) -> Result<Vec<FunctionDef>, CatalogueError> {
    parse(Path::new("functions.yaml"), doc.as_bytes())
}

fn error(doc: &str) -> String {
    parse_str(doc).unwrap_err().to_string()
}

#[test]
fn every_field_is_read() {
    let defs = parse_str(
        r#"
functions:
- name: function-example
  image: registry.example.org/fns/function-example:v1.2.3
  mode: functionio
  imagePullPolicy: Always
  pullSecret: /etc/fnrun/pull/.dockerconfigjson
  resources: {memory: 256Mi, cpu: 500m, pids: 128}
  network: Runner
  idleTimeout: 0
  startTimeout: 1m
  timeout: 90s
  maxConcurrency: 8
  args: [--debug, "--x=1"]
  env: {B: two, A: one}
- name: f2
  image: f2:v1
"#,
    )
    .unwrap();
    assert_eq!(
        defs[0],
        FunctionDef {
            name: "function-example".into(),
            image: "registry.example.org/fns/function-example:v1.2.3".into(),
            mode: Mode::FunctionIo,
            pull_policy: PullPolicy::Always,
            credentials: CredentialSource::PullSecret("/etc/fnrun/pull/.dockerconfigjson".into()),
            limits: Limits {
                memory_bytes: Some(256 << 20),
                cpu_millis: Some(500),
                pids: Some(128),
            },
            network: Network::Runner,
            idle_timeout: None,
            start_timeout: Duration::from_secs(60),
            timeout: Duration::from_secs(90),
            max_concurrency: 8,
            args: vec!["--debug".into(), "--x=1".into()],
            env: vec![("A".into(), "one".into()), ("B".into(), "two".into())],
        }
    );
    // Defaults (SPEC.md).
    assert_eq!(defs[1], FunctionDef::new("f2", "f2:v1").unwrap());
    assert_eq!(defs[1].mode, Mode::Server);
    assert_eq!(defs[1].idle_timeout, Some(Duration::from_secs(300)));
    assert_eq!(defs[1].start_timeout, Duration::from_secs(30));
    assert_eq!(defs[1].network, Network::Isolated);
    assert_eq!(defs[1].credentials, CredentialSource::DaemonDockerConfig);
    assert_eq!(defs[1].max_concurrency, 64);
}

#[test]
fn relative_credential_paths_are_the_files_neighbours() {
    let doc = "functions:\n- {name: a, image: a, pullSecret: pull/.dockerconfigjson}\n\
               - {name: b, image: b, dockerConfig: ../docker/config.json}\n\
               - {name: c, image: c, dockerConfig: /abs/config.json}\n";
    let defs = parse(Path::new("/etc/fnrun/functions.yaml"), doc.as_bytes()).unwrap();
    let sources: Vec<_> = defs.into_iter().map(|d| d.credentials).collect();
    assert_eq!(
        sources,
        [
            CredentialSource::PullSecret("/etc/fnrun/pull/.dockerconfigjson".into()),
            CredentialSource::DockerConfig("/etc/fnrun/../docker/config.json".into()),
            CredentialSource::DockerConfig("/abs/config.json".into()),
        ]
    );
}

#[test]
fn numbers_and_strings_both_make_quantities_and_durations() {
    let defs = parse_str(
        "functions:\n- {name: a, image: a, resources: {memory: 16777216, cpu: 0.5}, idleTimeout: '90', timeout: 2}\n",
    )
    .unwrap();
    assert_eq!(defs[0].limits.memory_bytes, Some(16 << 20));
    assert_eq!(defs[0].limits.cpu_millis, Some(500));
    assert_eq!(defs[0].idle_timeout, Some(Duration::from_secs(90)));
    assert_eq!(defs[0].timeout, Duration::from_secs(2));
}

#[test]
fn unknown_keys_are_refused_with_where_they_are() {
    let e = error("functions:\n- name: a\n  image: a\n  imagePullpolicy: Always\n");
    assert!(e.contains("unknown field `imagePullpolicy`"), "{e}");
    assert!(e.contains("functions[0]"), "{e}");
    assert!(e.contains("line 4"), "{e}");
    let e = error("functions: []\nfunction: []\n");
    assert!(e.contains("unknown field `function`"), "{e}");
    let e = error("functions:\n- {name: a, image: a, resources: {memory: 1Gi, disk: 1Gi}}\n");
    assert!(e.contains("unknown field `disk`"), "{e}");
}

#[test]
fn bad_values_name_the_function_and_the_field() {
    for (doc, wanted) in [
        (
            "functions:\n- {name: Fn_A, image: a}\n",
            "functions[0] (\"Fn_A\"): name: \"Fn_A\" is not a DNS label",
        ),
        (
            "functions:\n- {name: a, image: ' '}\n",
            "functions[0] (\"a\"): image: is empty",
        ),
        (
            "functions:\n- {name: a, image: a, resources: {memory: lots}}\n",
            "resources.memory: \"lots\" is not a valid quantity",
        ),
        (
            "functions:\n- {name: a, image: a, resources: {cpu: '0'}}\n",
            "resources.cpu: \"0\" is no cpu at all: a cpu limit must be more than 0",
        ),
        (
            "functions:\n- {name: a, image: a, resources: {memory: 128m}}\n",
            "resources.memory: \"128m\" is 128 thousandths of a byte (in a Kubernetes quantity, m is milli), below the smallest memory limit, 4Mi: did you mean 128Mi?",
        ),
        (
            "functions:\n- {name: a, image: a, resources: {memory: '0'}}\n",
            "resources.memory: \"0\" is 0 bytes, below the smallest memory limit",
        ),
        (
            "functions:\n- {name: a, image: a, idleTimeout: soon}\n",
            "idleTimeout: \"soon\" is not a duration",
        ),
        (
            "functions:\n- {name: a, image: a, maxConcurrency: 0}\n",
            "maxConcurrency: 0 is out of range (1 to 4096)",
        ),
        (
            "functions:\n- {name: a, image: a, startTimeout: 0s}\n",
            "startTimeout: must be more than 0",
        ),
        (
            "functions:\n- {name: a, image: a, env: {'A=B': c}}\n",
            "env: \"A=B\" is not an environment variable name",
        ),
        (
            "functions:\n- {name: a, image: a, dockerConfig: /a, pullSecret: /b}\n",
            "dockerConfig and pullSecret are both set",
        ),
        (
            "functions:\n- {name: a, image: a, mode: container}\n",
            "unknown variant `container`, expected `server` or `functionio`",
        ),
        (
            "functions:\n- {name: a, image: a, network: Host}\n",
            "unknown variant `Host`, expected `Isolated` or `Runner`",
        ),
        (
            "functions:\n- {name: a, image: a, env: [A]}\n",
            "invalid type",
        ),
        ("functions:\n- {name: a}\n", "missing field `image`"),
        ("functions: {}\n", "invalid type"),
        ("- a\n", "invalid type"),
        ("", "missing field `functions`"),
    ] {
        let e = error(doc);
        assert!(e.contains(wanted), "{doc:?}: {e}");
        assert!(e.starts_with("the functions file functions.yaml"), "{e}");
    }
}

#[test]
fn names_are_unique_across_the_file_and_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("functions.yaml");
    std::fs::write(
        &file,
        "functions:\n- {name: a, image: a}\n- {name: b, image: b}\n",
    )
    .unwrap();
    let catalogue = Catalogue::load(Some(&file), &["c=img:c".to_owned()]).unwrap();
    assert_eq!(catalogue.names().collect::<Vec<_>>(), ["a", "b", "c"]);
    let e = Catalogue::load(Some(&file), &["b=other".to_owned()]).unwrap_err();
    assert_eq!(e.to_string(), "function \"b\" is defined twice");
    std::fs::write(
        &file,
        "functions:\n- {name: a, image: a}\n- {name: a, image: b}\n",
    )
    .unwrap();
    let e = Catalogue::load(Some(&file), &[]).unwrap_err();
    assert_eq!(e.to_string(), "function \"a\" is defined twice");
    // Duplicate keys are refused by the parser.
    std::fs::write(&file, "functions:\n- {name: a, image: a, image: b}\n").unwrap();
    let e = Catalogue::load(Some(&file), &[]).unwrap_err().to_string();
    assert!(e.contains("duplicate"), "{e}");
}

#[test]
fn flags_are_name_equals_image() {
    let c = Catalogue::load(None, &["fn-a=registry.example.org/a:v1".to_owned()]).unwrap();
    assert_eq!(c.get("fn-a").unwrap().image, "registry.example.org/a:v1");
    for (flag, wanted) in [
        ("fn-a", "--function \"fn-a\": is not NAME=IMAGE"),
        ("FN=a", "name: \"FN\" is not a DNS label"),
        ("fn-a=", "image: is empty"),
    ] {
        let e = Catalogue::load(None, &[flag.to_owned()])
            .unwrap_err()
            .to_string();
        assert!(e.contains(wanted), "{flag}: {e}");
    }
}

#[test]
fn dns_labels() {
    for ok in ["a", "function-patch-and-transform", "f1", &"a".repeat(63)] {
        assert!(check_dns_label(ok).is_ok(), "{ok}");
    }
    for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64), "ä"] {
        assert!(check_dns_label(bad).is_err(), "{bad}");
    }
}

#[test]
fn errors_are_bounded_and_files_are_bounded() {
    let long = "x".repeat(1 << 20);
    let e = error(&format!("functions:\n- {{name: {long}, image: a}}\n"));
    assert!(e.len() < 1024, "{}", e.len());
    let e = error(&format!("{long}: 1\n"));
    assert!(e.len() < 2048, "{}", e.len());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("big.yaml");
    std::fs::write(
        &file,
        vec![b' '; usize::try_from(MAX_FILE_BYTES + 1).unwrap()],
    )
    .unwrap();
    let e = Catalogue::load(Some(&file), &[]).unwrap_err();
    assert!(matches!(e, CatalogueError::TooLarge { .. }), "{e}");
    let e = Catalogue::load(Some(&dir.path().join("missing.yaml")), &[]).unwrap_err();
    assert!(
        e.to_string().starts_with("cannot read the functions file"),
        "{e}"
    );
}

#[test]
fn nesting_and_alias_bombs_are_refused_before_parsing() {
    let bomb = format!(
        "x: &a \"{}\"\ny: [{}]\nfunctions: []\n",
        "a".repeat(64 << 10),
        vec!["*a"; 64].join(",")
    );
    let e = error(&bomb);
    assert!(e.contains("YAML aliases expand the document"), "{e}");
    let deep = format!("functions: {}{}\n", "[".repeat(200), "]".repeat(200));
    let e = error(&deep);
    assert!(e.contains("nested more than 128 deep"), "{e}");
    let e = error("functions: []\n---\nfunctions: []\n");
    assert!(e.contains("more than one document"), "{e}");
}

#[test]
fn at_most_so_many_functions() {
    let mut doc = String::from("functions:\n");
    for i in 0..=MAX_FUNCTIONS {
        doc.push_str(&format!("- {{name: f{i}, image: a}}\n"));
    }
    let e = error(&doc);
    assert_eq!(e, format!("more than {MAX_FUNCTIONS} functions"));
}
