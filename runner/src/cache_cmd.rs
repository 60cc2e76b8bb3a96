//! `fnrun cache list | prune [--max-size SIZE] | verify`.
//!
//! Exit codes: 0 success; 1 failure. `verify` exits 0 when it found the cache sound
//! (crash leftovers such as dead tmp/ sessions are swept and are not damage) and 1
//! when it found damage, which it removed so that the next run fetches or unpacks it
//! again (a second `verify` then exits 0), or when it could not finish.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::SystemTime;

use clap::{Args, Subcommand};
use fnrun_cache::{Cache, CacheConfig, CachedImage};

/// `fnrun cache` flags.
#[derive(Debug, Args)]
pub struct CacheCmdArgs {
    /// Cache directory [default: $FNRUN_CACHE_DIR, else /var/cache/fnrun as
    /// root, else $XDG_CACHE_HOME/fnrun].
    #[arg(long, env = "FNRUN_CACHE_DIR", global = true, value_parser = crate::config::parse_path)]
    pub cache_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub action: CacheAction,
}

#[derive(Debug, Subcommand)]
pub enum CacheAction {
    /// List cached images with their size and last use.
    List,
    /// Remove unused blobs and layers; with --max-size, also the least recently
    /// used images until the cache fits. Images in use are never removed.
    Prune {
        /// Largest size the cache may keep (e.g. 10Gi, 0 for everything not in use).
        #[arg(long, value_name = "SIZE", value_parser = crate::config::parse_size)]
        max_size: Option<u64>,
    },
    /// Rehash every blob, check every layer and reference, remove what is damaged.
    /// Exit 0: sound; 1: damage was found and removed (or verify failed).
    Verify,
}

pub fn main(args: CacheCmdArgs) -> ExitCode {
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fnrun: {}", crate::error_line(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}

fn run(args: CacheCmdArgs) -> anyhow::Result<ExitCode> {
    let root = match args.cache_dir {
        Some(dir) => dir,
        None => {
            let dir = crate::config::default_cache_dir()?;
            // The default cache before anything was pulled: nothing to list,
            // verify or prune, and nothing is created to say so.
            if !dir.exists() {
                if let CacheAction::List = args.action {
                    print!("{}", table(&[], SystemTime::now()));
                } else {
                    println!("no cache at {} yet: nothing was pulled", dir.display());
                }
                return Ok(ExitCode::SUCCESS);
            }
            dir
        }
    };
    // These commands read or tidy a cache: a directory that is not one is an
    // error, and is left as it was.
    let cache = Cache::open_existing(CacheConfig::new(&root)).map_err(|e| match e.kind() {
        fnrun_cache::ErrorKind::NotFound => {
            anyhow::anyhow!("{e} (give the cache directory with --cache-dir or $FNRUN_CACHE_DIR)")
        }
        _ => anyhow::anyhow!("cannot open the cache at {}: {e}", root.display()),
    })?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match args.action {
        CacheAction::List => {
            let images = rt.block_on(cache.list())?;
            print!("{}", table(&images, SystemTime::now()));
            Ok(ExitCode::SUCCESS)
        }
        CacheAction::Prune { max_size } => {
            let r = match max_size {
                Some(max) => rt.block_on(cache.prune(max))?,
                None => rt.block_on(cache.prune_unused())?,
            };
            for reference in &r.removed_refs {
                println!("removed {reference}");
            }
            for reference in &r.kept_in_use {
                println!("kept {reference} (in use)");
            }
            println!(
                "freed {} ({} blobs, {} layers); the cache holds {}",
                human(r.freed_bytes),
                r.removed_blobs,
                r.removed_layers,
                human(r.total_bytes)
            );
            Ok(ExitCode::SUCCESS)
        }
        CacheAction::Verify => {
            let r = rt.block_on(cache.verify())?;
            println!(
                "checked {} blobs, {} layers, {} references",
                r.blobs_checked, r.layers_checked, r.refs_checked
            );
            for d in &r.corrupt_blobs {
                println!("removed corrupt blob {d}");
            }
            for l in &r.broken_layers {
                println!("removed broken layer {l} (it is unpacked again on next use)");
            }
            for l in &r.broken_in_use {
                println!("broken layer {l} is in use; run verify again when it is not");
            }
            for d in &r.dangling_refs {
                println!("removed reference {d} (its manifest is missing)");
            }
            if r.leftovers_removed > 0 {
                println!(
                    "swept {} leftovers of interrupted work",
                    r.leftovers_removed
                );
            }
            if r.damaged() {
                println!("damage found and removed; it is fetched or unpacked again on next use");
                Ok(ExitCode::from(1))
            } else {
                println!("the cache is sound");
                Ok(ExitCode::SUCCESS)
            }
        }
    }
}

/// `1.5 MiB`-style sizes.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// `5m ago`-style times.
fn ago(t: Option<SystemTime>, now: SystemTime) -> String {
    let Some(t) = t else { return "-".into() };
    let secs = now.duration_since(t).map_or(0, |d| d.as_secs());
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86400),
    }
}

fn table(images: &[CachedImage], now: SystemTime) -> String {
    let rows: Vec<[String; 4]> = images
        .iter()
        .map(|i| {
            let hex = i.digest.strip_prefix("sha256:").unwrap_or(&i.digest);
            let mut last = ago(i.last_used, now);
            if i.in_use {
                last.push_str(" (in use)");
            }
            [
                i.reference.clone(),
                hex.chars().take(12).collect(),
                human(i.bytes),
                last,
            ]
        })
        .collect();
    let header = [
        "REFERENCE".to_owned(),
        "DIGEST".to_owned(),
        "SIZE".to_owned(),
        "LAST USED".to_owned(),
    ];
    let mut widths = [0usize; 4];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let line = format!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sizes_times_and_table() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(24 << 20), "24.0 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
        let now = SystemTime::now();
        assert_eq!(ago(None, now), "-");
        assert_eq!(ago(Some(now - Duration::from_secs(90)), now), "1m ago");
        assert_eq!(ago(Some(now - Duration::from_secs(7200)), now), "2h ago");
        let t = table(
            &[CachedImage {
                reference: "r.io/a:1".into(),
                digest: format!("sha256:{}", "ab".repeat(32)),
                bytes: 2048,
                last_used: Some(now),
                in_use: true,
            }],
            now,
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2, "{t}");
        assert!(lines[0].starts_with("REFERENCE"), "{t}");
        assert!(
            lines[1].contains("r.io/a:1")
                && lines[1].contains("abababababab ")
                && lines[1].contains("2.0 KiB")
                && lines[1].contains("0s ago (in use)"),
            "{t}"
        );
    }
}
