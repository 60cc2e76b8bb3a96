//! FunctionIO documents for tests, and reading them back.

use serde_norway::Value;

/// A FunctionIO as Crossplane's composition controller sends it
/// (`examples/functionio.yaml`).
pub const SAMPLE: &str = include_str!("../../examples/functionio.yaml");

/// A minimal valid FunctionIO.
pub const MINIMAL: &str = "observed: {}\ndesired: {}\n";

/// Parses YAML, panicking with the document on failure.
pub fn parse(yaml: &str) -> Value {
    serde_norway::from_str(yaml).unwrap_or_else(|e| panic!("not YAML ({e}):\n{yaml}"))
}

/// Asserts two YAML documents are equal as data (formatting may differ).
pub fn assert_same_yaml(actual: &str, expected: &str) {
    assert_eq!(
        parse(actual),
        parse(expected),
        "YAML differs:\n--- actual ---\n{actual}\n--- expected ---\n{expected}"
    );
}

/// The `(severity, message)` pairs of `results`.
pub fn results(yaml: &str) -> Vec<(String, String)> {
    let doc = parse(yaml);
    doc.get("results")
        .and_then(Value::as_sequence)
        .map(|results| {
            results
                .iter()
                .map(|r| {
                    let field = |k: &str| {
                        r.get(k)
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned()
                    };
                    (field("severity"), field("message"))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The message of the last result.
pub fn last_message(yaml: &str) -> String {
    results(yaml)
        .pop()
        .map(|(_, message)| message)
        .unwrap_or_else(|| panic!("no results in:\n{yaml}"))
}

/// A shell function script that reads (and drops) its input, runs `setup`,
/// then prints a FunctionIO with one Normal result whose message is the shell
/// expansion of `message` (inside double quotes: `$X` and `$(cmd)` work; the
/// result must not contain `"` or `\`).
pub fn report_script(setup: &str, message: &str) -> String {
    format!(
        "#!/bin/sh\n\
         cat >/dev/null\n\
         {setup}\n\
         msg=\"{message}\"\n\
         printf 'results:\\n- severity: Normal\\n  message: \"%s\"\\n' \"$msg\"\n"
    )
}

/// A function's script (`/bin/sh`) that reads its input and writes
/// [`MINIMAL`] followed by a YAML alias bomb: one anchored 1 MiB scalar and
/// 1,001 aliases to it, a GiB once expanded.
pub fn alias_bomb_function() -> String {
    format!(
        "#!/bin/sh\ncat >/dev/null\nprintf '{}'\nprintf 'bomb:\\n  s: &s \"'\n\
         head -c 1048576 /dev/zero | tr '\\000' a\nprintf '\"\\n  l: ['\n\
         i=0; while [ $i -lt 1000 ]; do printf '*s,'; i=$((i+1)); done\nprintf '*s]\\n'\n",
        MINIMAL.replace('\n', "\\n")
    )
}
