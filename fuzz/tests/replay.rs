//! Every fuzz target's corpus (`fuzz/corpus/NAME/`) and every crash found so
//! far (`fuzz/artifacts/NAME/`) replayed through its body, so `cargo test`
//! checks them without libFuzzer or a nightly toolchain.

use std::path::Path;

#[test]
fn corpora_and_crashes_replay() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, body) in fnrun_fuzz::TARGETS {
        let mut seen = 0;
        for dir in ["corpus", "artifacts"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("a directory entry").path();
                if path.file_name().is_some_and(|n| n == ".gitkeep") {
                    continue;
                }
                let data = std::fs::read(&path).expect("a corpus file");
                if let Err(panic) = std::panic::catch_unwind(|| body(&data)) {
                    std::panic::resume_unwind(Box::new(format!(
                        "{name}: {} fails: {:?}",
                        path.display(),
                        panic
                            .downcast_ref::<String>()
                            .map(String::as_str)
                            .or_else(|| panic.downcast_ref::<&str>().copied())
                    )));
                }
                seen += 1;
            }
        }
        assert!(seen > 0, "{name} has no corpus in fuzz/corpus/{name}");
    }
}
