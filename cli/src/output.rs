//! `-o json|yaml`: the structured output of the commands a script may parse
//! (`version`, `pull`, `cache list`, `cache inspect`, `cache rm`, `cache
//! prune`, `function call`). Text (a table) stays the default.

use std::io::Write;
use std::process::ExitCode;

use serde::Serialize;

use crate::config::OutputFormat;

/// `value` as JSON (pretty, one trailing newline) or YAML; text is the
/// caller's own.
pub fn render<T: Serialize + ?Sized>(value: &T, format: OutputFormat) -> String {
    // Serializing plain structs of strings and numbers cannot fail.
    match format {
        OutputFormat::Json | OutputFormat::Text => {
            let mut s = serde_json::to_string_pretty(value).unwrap_or_default();
            s.push('\n');
            s
        }
        OutputFormat::Yaml => serde_norway::to_string(value).unwrap_or_default(),
    }
}

/// Prints `text` on stdout; a closed stdout is exit code 1.
pub fn print(text: impl AsRef<[u8]>) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_ref())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(crate::support::EXIT_FAILED),
    }
}
