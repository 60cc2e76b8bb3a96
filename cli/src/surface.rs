//! The command line's surface, pinned: every command and every flag (its
//! names, value names, defaults, environment variable, possible values,
//! help heading, help text and order in `--help`) rendered as text and
//! compared with `surface.txt`, checked in beside this file. A change to
//! the flags that is not meant to change what a user types or reads fails
//! here; one that is meant to is a change to `surface.txt` in the same
//! commit. `FNRUN_UPDATE_SURFACE=1 cargo test -p fnrun surface` rewrites it.

use std::fmt::Write as _;

use clap::CommandFactory;

use crate::cli::Cli;

const SNAPSHOT: &str = include_str!("surface.txt");

/// The surface of `fnrun` and all its subcommands, depth first.
fn surface() -> String {
    let mut command = Cli::command();
    // Globals are propagated to the subcommands, and display orders
    // assigned, by `build`.
    command.build();
    let mut out = String::new();
    write_command(&mut out, &command, "fnrun");
    out
}

fn write_command(out: &mut String, command: &clap::Command, path: &str) {
    let text = |s: Option<&clap::builder::StyledStr>| s.map(|s| s.to_string());
    writeln!(out, "== {path}").unwrap();
    let aliases: Vec<&str> = command.get_all_aliases().collect();
    let visible: Vec<&str> = command.get_visible_aliases().collect();
    if !aliases.is_empty() {
        writeln!(out, "aliases: {aliases:?} visible: {visible:?}").unwrap();
    }
    for (label, value) in [
        ("about", text(command.get_about())),
        ("long_about", text(command.get_long_about())),
        ("before_help", text(command.get_before_help())),
        ("after_help", text(command.get_after_help())),
        ("after_long_help", text(command.get_after_long_help())),
    ] {
        if let Some(value) = value {
            writeln!(out, "{label}: {value:?}").unwrap();
        }
    }
    let mut args: Vec<&clap::Arg> = command.get_arguments().collect();
    args.sort_by_key(|a| (a.is_positional(), a.get_display_order()));
    for arg in args {
        write_arg(out, command, arg);
    }
    for sub in command.get_subcommands() {
        write_command(out, sub, &format!("{path} {}", sub.get_name()));
    }
}

fn write_arg(out: &mut String, command: &clap::Command, arg: &clap::Arg) {
    let mut line = format!("  {}", arg.get_id());
    if let Some(long) = arg.get_long() {
        write!(line, " --{long}").unwrap();
    }
    if let Some(short) = arg.get_short() {
        write!(line, " -{short}").unwrap();
    }
    if let Some(index) = arg.get_index() {
        write!(line, " #{index}").unwrap();
    }
    writeln!(out, "{line}").unwrap();
    let mut field = |label: &str, value: String| writeln!(out, "    {label}: {value}").unwrap();
    field("order", arg.get_display_order().to_string());
    field("action", format!("{:?}", arg.get_action()));
    if let Some(names) = arg.get_value_names() {
        let names: Vec<String> = names.iter().map(ToString::to_string).collect();
        field("value_names", format!("{names:?}"));
    }
    if let Some(num) = arg.get_num_args() {
        field("num_args", format!("{num:?}"));
    }
    if !arg.get_default_values().is_empty() {
        field("default", format!("{:?}", arg.get_default_values()));
    }
    if let Some(env) = arg.get_env() {
        field("env", format!("{env:?}"));
    }
    if let Some(aliases) = arg.get_all_aliases() {
        field("aliases", format!("{aliases:?}"));
    }
    if let Some(aliases) = arg.get_all_short_aliases() {
        field("short_aliases", format!("{aliases:?}"));
    }
    let values: Vec<String> = arg
        .get_possible_values()
        .iter()
        .map(|v| {
            let names: Vec<&str> = v.get_name_and_aliases().collect();
            match v.get_help() {
                Some(help) => format!("{} ({help})", names.join("|")),
                None => names.join("|"),
            }
        })
        .collect();
    if !values.is_empty() {
        field("values", format!("{values:?}"));
    }
    if let Some(heading) = arg.get_help_heading() {
        field("heading", heading.to_owned());
    }
    let set: Vec<&str> = [
        ("required", arg.is_required_set()),
        ("global", arg.is_global_set()),
        ("hidden", arg.is_hide_set()),
        ("last", arg.is_last_set()),
        ("ignore_case", arg.is_ignore_case_set()),
        ("hyphen_values", arg.is_allow_hyphen_values_set()),
        ("hide_default", arg.is_hide_default_value_set()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    if !set.is_empty() {
        field("set", set.join(","));
    }
    let conflicts: Vec<String> = command
        .get_arg_conflicts_with(arg)
        .iter()
        .map(|a| a.get_id().to_string())
        .collect();
    if !conflicts.is_empty() {
        field("conflicts", format!("{conflicts:?}"));
    }
    if let Some(help) = arg.get_help() {
        field("help", format!("{:?}", help.to_string()));
    }
    if let Some(help) = arg.get_long_help() {
        field("long_help", format!("{:?}", help.to_string()));
    }
}

#[test]
fn the_command_line_surface_is_as_pinned() {
    let now = surface();
    if std::env::var_os("FNRUN_UPDATE_SURFACE").is_some() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/surface.txt");
        std::fs::write(path, &now).unwrap();
        return;
    }
    if now != SNAPSHOT {
        let (now_lines, was_lines): (Vec<&str>, Vec<&str>) =
            (now.lines().collect(), SNAPSHOT.lines().collect());
        let first = now_lines
            .iter()
            .zip(&was_lines)
            .position(|(a, b)| a != b)
            .unwrap_or(now_lines.len().min(was_lines.len()));
        let context = |lines: &[&str]| {
            lines[first.saturating_sub(8)..(first + 4).min(lines.len())].join("\n")
        };
        panic!(
            "the command line's surface changed (cli/src/surface.txt; \
             FNRUN_UPDATE_SURFACE=1 rewrites it if that is meant), first at line {}:\n\
             --- pinned\n{}\n--- now\n{}",
            first + 1,
            context(&was_lines),
            context(&now_lines)
        );
    }
}
