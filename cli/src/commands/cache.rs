//! `fnrun cache list | inspect IMAGE | rm IMAGE... | prune [--max-size SIZE]
//! [--dry-run] | verify`.
//!
//! `list`, `inspect`, `rm` and `prune` take `-o json|yaml` for scripts.
//! `rm` and `prune` never remove what a run is using (a held lease); `rm`
//! of an image in use, or of one that is not cached, exits 1 and says so.
//!
//! Exit codes: 0 success; 1 failure. `verify` exits 0 when it found the cache sound
//! (crash leftovers such as dead tmp/ sessions are swept and are not damage) and 1
//! when it found damage, which it removed so that the next run fetches or unpacks it
//! again (a second `verify` then exits 0), or when it could not finish.

use std::process::ExitCode;
use std::time::SystemTime;

use clap::{Args, Subcommand};
use fnrun_cache::{Cache, CacheConfig, CachedImage, PruneReport};
use serde::Serialize;

use crate::config::{DryRunArgs, OutputArgs, OutputFormat};

/// `fnrun cache` flags: `--cache-dir` is the other commands', made global
/// (`fnrun cache list --cache-dir DIR`).
#[derive(Debug, Args)]
#[command(mut_arg("cache_dir", |a| a.global(true)))]
pub struct CacheCmdArgs {
    #[command(flatten)]
    pub dir: crate::config::CacheDirArgs,
    #[command(subcommand)]
    pub action: CacheAction,
}

#[derive(Debug, Subcommand)]
pub enum CacheAction {
    /// List cached images with their size and last use.
    #[command(visible_alias = "ls")]
    List {
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Show what the cache holds of an image: digests, size, last use,
    /// config and layers (JSON, as `skopeo inspect` prints; -o yaml).
    #[command(mut_arg("output", |a| a.default_value("json")))]
    Inspect {
        #[command(flatten)]
        output: OutputArgs,
        /// A cached reference, or its digest (sha256:HEX, or the 12 hex
        /// digits `cache list` shows).
        image: String,
    },
    /// Remove images and the blobs and layers only they use. An image in use
    /// is kept (exit 1).
    #[command(visible_alias = "rmi")]
    Rm {
        #[command(flatten)]
        dry_run: DryRunArgs,
        #[command(flatten)]
        output: OutputArgs,
        /// Cached references, or digests (sha256:HEX, or the 12 hex digits
        /// `cache list` shows).
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<String>,
    },
    /// Remove unused blobs and layers; with --max-size, also the least recently
    /// used images until the cache fits. Images in use are never removed.
    Prune {
        /// Largest size the cache may keep (e.g. 10Gi, 0 for everything not in use).
        #[arg(long, value_name = "SIZE", value_parser = crate::config::parse_size)]
        max_size: Option<u64>,
        #[command(flatten)]
        dry_run: DryRunArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Rehash every blob, check every layer and reference, remove what is damaged.
    /// Exit 0: sound; 1: damage was found and removed (or verify failed).
    Verify,
}

pub fn main(args: CacheCmdArgs) -> ExitCode {
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fnrun: {}", crate::support::error_line(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}

fn run(args: CacheCmdArgs) -> anyhow::Result<ExitCode> {
    let root = match args.dir.cache_dir {
        Some(dir) => dir,
        None => {
            let dir = crate::config::default_cache_dir()?;
            // The default cache before anything was pulled: nothing to list,
            // verify or prune, and nothing is created to say so.
            if !dir.exists() {
                return match &args.action {
                    CacheAction::List {
                        output: OutputArgs { format: output },
                    } => Ok(crate::output::print(match output {
                        OutputFormat::Text => table(&[], SystemTime::now()),
                        format => crate::output::render(&Vec::<Listed>::new(), *format),
                    })),
                    CacheAction::Inspect { image, .. } => anyhow::bail!(
                        "{image} is not in the cache: there is no cache at {} yet",
                        dir.display()
                    ),
                    CacheAction::Rm { images, .. } => anyhow::bail!(
                        "{} is not in the cache: there is no cache at {} yet",
                        images.join(", "),
                        dir.display()
                    ),
                    CacheAction::Prune { .. } | CacheAction::Verify => {
                        println!("no cache at {} yet: nothing was pulled", dir.display());
                        Ok(ExitCode::SUCCESS)
                    }
                };
            }
            dir
        }
    };
    // These commands read or tidy a cache: a directory that is not one is an
    // error, and is left as it was.
    let cache = Cache::open_existing(CacheConfig::new(&root)).map_err(|e| match e.kind() {
        fnrun_registry::ErrorKind::NotFound => {
            anyhow::anyhow!("{e} (give the cache directory with --cache-dir or $FNRUN_CACHE_DIR)")
        }
        _ => anyhow::anyhow!("cannot open the cache at {}: {e}", root.display()),
    })?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match args.action {
        CacheAction::List {
            output: OutputArgs { format: output },
        } => {
            let images = rt.block_on(cache.list())?;
            let text = match output {
                OutputFormat::Text => table(&images, SystemTime::now()),
                format => {
                    let listed: Vec<Listed> = images.iter().map(Listed::from).collect();
                    crate::output::render(&listed, format)
                }
            };
            Ok(crate::output::print(text))
        }
        CacheAction::Inspect {
            output: OutputArgs { format: output },
            image,
        } => match rt.block_on(cache.inspect(&image))? {
            Some(details) => Ok(crate::output::print(crate::output::render(
                &details, output,
            ))),
            None => anyhow::bail!(
                "{image} is not in the cache at {} (`fnrun cache list` lists what is)",
                root.display()
            ),
        },
        CacheAction::Rm {
            dry_run: DryRunArgs { dry_run },
            output: OutputArgs { format: output },
            images,
        } => {
            let r = rt.block_on(cache.remove(&images, dry_run))?;
            // Nothing of what was named is cached: the errors below say so,
            // with no line about 0 B freed.
            let nothing = r.removed_refs.is_empty() && r.kept_in_use.is_empty();
            let code = match nothing && output == OutputFormat::Text {
                true => ExitCode::SUCCESS,
                false => report(&r, dry_run, output),
            };
            for image in &r.not_found {
                eprintln!(
                    "fnrun: {}",
                    crate::support::error_line(&format!(
                        "{image} is not in the cache at {}",
                        root.display()
                    ))
                );
            }
            for reference in &r.kept_in_use {
                eprintln!("fnrun: {reference} is in use by a run; it was kept");
            }
            match r.not_found.is_empty() && r.kept_in_use.is_empty() {
                true => Ok(code),
                false => Ok(ExitCode::from(1)),
            }
        }
        CacheAction::Prune {
            max_size,
            dry_run: DryRunArgs { dry_run },
            output: OutputArgs { format: output },
        } => {
            let r = match (max_size, dry_run) {
                (max, true) => rt.block_on(cache.prune_dry_run(max))?,
                (Some(max), false) => rt.block_on(cache.prune(max))?,
                (None, false) => rt.block_on(cache.prune_unused())?,
            };
            Ok(report(&r, dry_run, output))
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

/// What `rm` and `prune` removed (or, with `dry_run`, would remove).
fn report(r: &PruneReport, dry_run: bool, output: OutputFormat) -> ExitCode {
    if output != OutputFormat::Text {
        return crate::output::print(crate::output::render(&Pruned::new(r, dry_run), output));
    }
    let (removed, freed) = match dry_run {
        true => ("would remove", "would free"),
        false => ("removed", "freed"),
    };
    let mut text = String::new();
    for reference in &r.removed_refs {
        text.push_str(&format!("{removed} {reference}\n"));
    }
    for reference in &r.kept_in_use {
        text.push_str(&format!("kept {reference} (in use)\n"));
    }
    text.push_str(&format!(
        "{freed} {} ({} blobs, {} layers); the cache {} {}\n",
        human(r.freed_bytes),
        r.removed_blobs,
        r.removed_layers,
        if dry_run { "would hold" } else { "holds" },
        human(r.total_bytes)
    ));
    crate::output::print(text)
}

/// One image of `cache list -o json|yaml`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Listed {
    reference: String,
    digest: String,
    /// Bytes.
    size: u64,
    /// Seconds since the epoch.
    last_used: Option<u64>,
    in_use: bool,
}

impl From<&CachedImage> for Listed {
    fn from(i: &CachedImage) -> Listed {
        Listed {
            reference: i.reference.clone(),
            digest: i.digest.clone(),
            size: i.bytes,
            last_used: i
                .last_used
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs()),
            in_use: i.in_use,
        }
    }
}

/// `rm` and `prune -o json|yaml`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Pruned<'a> {
    dry_run: bool,
    removed: &'a [String],
    kept_in_use: &'a [String],
    not_found: &'a [String],
    removed_blobs: usize,
    removed_layers: usize,
    freed_bytes: u64,
    total_bytes: u64,
}

impl Pruned<'_> {
    fn new(r: &PruneReport, dry_run: bool) -> Pruned<'_> {
        Pruned {
            dry_run,
            removed: &r.removed_refs,
            kept_in_use: &r.kept_in_use,
            not_found: &r.not_found,
            removed_blobs: r.removed_blobs,
            removed_layers: r.removed_layers,
            freed_bytes: r.freed_bytes,
            total_bytes: r.total_bytes,
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
