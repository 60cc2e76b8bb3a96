//! Builds everything the tests need into their tool cache, ahead of them
//! (`fnrun_tests::prebuild`). Prints a line per item; exits 1 if any failed,
//! after trying every one.

use std::process::ExitCode;
use std::time::Instant;

use fnrun_tests::prebuild::{self, Built};

fn report(built: &Built) {
    match &built.result {
        Ok(()) => println!(
            "prebuild: {} in {:.1} s",
            built.name,
            built.took.as_secs_f64()
        ),
        Err(e) => println!(
            "prebuild: {} FAILED after {:.1} s: {e:#}",
            built.name,
            built.took.as_secs_f64()
        ),
    }
}

fn main() -> ExitCode {
    let start = Instant::now();
    let large = std::thread::spawn(|| prebuild::run(prebuild::large(), report));
    let small = prebuild::run(prebuild::small(), report);
    let large = large.join().expect("the large lane does not panic");
    let failed = small
        .iter()
        .chain(&large)
        .filter(|b| b.result.is_err())
        .count();
    println!(
        "prebuild: {} items, {failed} failed, {:.1} s",
        small.len() + large.len(),
        start.elapsed().as_secs_f64()
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
