//! Semantic versions and version constraints as Porch reads the `Tag` of an
//! `EvaluateFunctionRequest` (and kpt the `tag` of a Kptfile function): the
//! rules of Go's `github.com/Masterminds/semver/v3` (v3.4.0, which Porch
//! uses), ported here with its tests' tables.
//!
//! - A version is loose: an optional `v`, one to three numbers (missing ones
//!   are 0, leading zeros allowed), an optional `-prerelease` and `+metadata`.
//! - A constraint is `||`-separated groups of constraints that must all
//!   hold, separated by spaces or commas: `=`, `!=`, `>`, `<`, `>=`, `=>`,
//!   `<=`, `=<`, `~`, `~>`, `^` or nothing before a version whose numbers may
//!   be wildcards (`x`, `X`, `*`) or missing, and hyphen ranges (`1.2 - 1.4`).
//!   A prerelease matches only when a constraint of its group names one.

use std::cmp::Ordering;
use std::fmt;

/// The most bytes of a constraint or version parsed.
const MAX_LEN: usize = 1024;

/// A version that cannot be parsed, or a constraint that cannot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SemverError {
    #[error("{0:?} is not a semantic version")]
    Version(String),
    #[error("{0:?} is not a semantic version constraint")]
    Constraint(String),
    #[error("the constraint is longer than {MAX_LEN} bytes")]
    TooLong,
}

/// A version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    major: u64,
    minor: u64,
    patch: u64,
    pre: String,
    original: String,
}

impl fmt::Display for Version {
    /// As written (a tag is named by what it was written as).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.original)
    }
}

/// Reads `s` while `ok` holds, from `*i`; returns what was read.
fn take<'a>(s: &'a str, i: &mut usize, ok: impl Fn(u8) -> bool) -> &'a str {
    let start = *i;
    while *i < s.len() && ok(s.as_bytes()[*i]) {
        *i += 1;
    }
    &s[start..*i]
}

fn ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

/// Dot-separated identifiers of `[0-9A-Za-z-]+`, from `*i`; `None` if the
/// first or one after a dot is empty.
fn identifiers<'a>(s: &'a str, i: &mut usize) -> Option<&'a str> {
    let start = *i;
    loop {
        if take(s, i, ident_char).is_empty() {
            return None;
        }
        if *i < s.len() && s.as_bytes()[*i] == b'.' {
            *i += 1;
        } else {
            return Some(&s[start..*i]);
        }
    }
}

/// The parts of a version or of a constraint's version, as the loose regular
/// expression of Masterminds/semver matches them: the numbers' text (each
/// without its dot), the prerelease and the metadata, and where it ended.
struct Parts<'a> {
    numbers: [Option<&'a str>; 3],
    pre: Option<&'a str>,
    metadata: Option<&'a str>,
}

/// Matches a version at `*i` whose numbers are made of `number` characters.
fn parts<'a>(s: &'a str, i: &mut usize, number: impl Fn(u8) -> bool) -> Option<Parts<'a>> {
    if s.as_bytes().get(*i) == Some(&b'v') {
        *i += 1;
    }
    let mut numbers = [None; 3];
    let major = take(s, i, &number);
    if major.is_empty() {
        return None;
    }
    numbers[0] = Some(major);
    for slot in &mut numbers[1..] {
        if s.as_bytes().get(*i) != Some(&b'.') {
            break;
        }
        let mut j = *i + 1;
        let n = take(s, &mut j, &number);
        if n.is_empty() {
            break;
        }
        *slot = Some(n);
        *i = j;
    }
    let mut pre = None;
    if s.as_bytes().get(*i) == Some(&b'-') {
        let mut j = *i + 1;
        if let Some(p) = identifiers(s, &mut j) {
            pre = Some(p);
            *i = j;
        }
    }
    let mut metadata = None;
    if s.as_bytes().get(*i) == Some(&b'+') {
        let mut j = *i + 1;
        if let Some(m) = identifiers(s, &mut j) {
            metadata = Some(m);
            *i = j;
        }
    }
    Some(Parts {
        numbers,
        pre,
        metadata,
    })
}

impl Version {
    /// Parses a version as Masterminds/semver's `NewVersion` does.
    pub fn parse(s: &str) -> Result<Version, SemverError> {
        let bad = || SemverError::Version(s.chars().take(MAX_LEN).collect());
        if s.len() > MAX_LEN {
            return Err(bad());
        }
        let mut i = 0;
        let p = parts(s, &mut i, |c| c.is_ascii_digit()).ok_or_else(bad)?;
        if i != s.len() {
            return Err(bad());
        }
        let number = |n: Option<&str>| n.map_or(Ok(0), |n| n.parse::<u64>().map_err(|_| bad()));
        let pre = p.pre.unwrap_or("");
        // A numeric prerelease identifier has no leading zero.
        if pre
            .split('.')
            .any(|id| id.len() > 1 && id.starts_with('0') && id.bytes().all(|c| c.is_ascii_digit()))
        {
            return Err(bad());
        }
        let _ = p.metadata;
        Ok(Version {
            major: number(p.numbers[0])?,
            minor: number(p.numbers[1])?,
            patch: number(p.numbers[2])?,
            pre: pre.to_owned(),
            original: s.to_owned(),
        })
    }

    /// Precedence: numbers, then a release over its prereleases, then the
    /// prereleases' identifiers (metadata never counts).
    pub fn cmp_precedence(&self, other: &Version) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => compare_prerelease(&self.pre, &other.pre),
            })
    }
}

fn compare_prerelease(a: &str, b: &str) -> Ordering {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.split('.').collect(), b.split('.').collect());
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (
            a.get(i).copied().unwrap_or(""),
            b.get(i).copied().unwrap_or(""),
        );
        let d = compare_part(x, y);
        if d != Ordering::Equal {
            return d;
        }
    }
    Ordering::Equal
}

/// One prerelease identifier against another: a missing one is lower;
/// numbers compare as numbers and below words; words compare as bytes.
fn compare_part(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    if a.is_empty() {
        return Ordering::Less;
    }
    if b.is_empty() {
        return Ordering::Greater;
    }
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        (Ok(_), Err(_)) => Ordering::Less,
        (Err(_), Ok(_)) => Ordering::Greater,
        (Err(_), Err(_)) => a.cmp(b),
    }
}

/// The operator of one constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    TildeOrEqual,
    NotEqual,
    Greater,
    Less,
    GreaterEqual,
    LessEqual,
    Tilde,
    Caret,
}

/// The operators, the two-character ones first (the longest that fits).
const OPS: [(&str, Op); 11] = [
    ("!=", Op::NotEqual),
    (">=", Op::GreaterEqual),
    ("=>", Op::GreaterEqual),
    ("<=", Op::LessEqual),
    ("=<", Op::LessEqual),
    ("~>", Op::Tilde),
    ("=", Op::TildeOrEqual),
    (">", Op::Greater),
    ("<", Op::Less),
    ("~", Op::Tilde),
    ("^", Op::Caret),
];

/// One constraint: an operator and a version whose trailing numbers may be
/// wildcards ("dirty").
#[derive(Debug, Clone, PartialEq, Eq)]
struct One {
    op: Op,
    con: Version,
    dirty: bool,
    minor_dirty: bool,
    patch_dirty: bool,
}

/// A parsed constraint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Constraint {
    /// Groups joined by `||`, each of constraints that must all hold, and
    /// whether one of them names a prerelease.
    groups: Vec<(Vec<One>, bool)>,
}

fn wildcard(s: &str) -> bool {
    matches!(s, "x" | "X" | "*")
}

fn constraint_number(c: u8) -> bool {
    c.is_ascii_digit() || matches!(c, b'x' | b'X' | b'*' | b'|')
}

fn skip_space(s: &str, i: &mut usize) -> bool {
    !take(s, i, |c| c.is_ascii_whitespace()).is_empty()
}

impl Constraint {
    /// Parses a constraint as Masterminds/semver's `NewConstraint` does.
    pub fn parse(s: &str) -> Result<Constraint, SemverError> {
        if s.len() > MAX_LEN {
            return Err(SemverError::TooLong);
        }
        let groups = s
            .split("||")
            .map(|group| {
                let ones = parse_group(group)
                    .ok_or_else(|| SemverError::Constraint(group.trim().to_owned()))?;
                let pre = ones.iter().any(|o| !o.con.pre.is_empty());
                Ok((ones, pre))
            })
            .collect::<Result<_, SemverError>>()?;
        Ok(Constraint { groups })
    }

    /// Whether `v` satisfies the constraint.
    pub fn matches(&self, v: &Version) -> bool {
        self.groups
            .iter()
            .any(|(ones, pre)| ones.iter().all(|one| one.check(v, *pre)))
    }
}

/// The constraints of one `||` group: `(op) version` separated by spaces or a
/// comma; `a - b` (spaces around the hyphen, no operator before `a`) is
/// `>= a, <= b`. `None` if the group is not a constraint.
fn parse_group(s: &str) -> Option<Vec<One>> {
    let mut out = Vec::new();
    let mut i = 0;
    skip_space(s, &mut i);
    loop {
        let op = OPS
            .iter()
            .find(|(text, _)| s[i..].starts_with(text))
            .map(|(text, op)| {
                i += text.len();
                *op
            });
        skip_space(s, &mut i);
        let start = i;
        let p = parts(s, &mut i, constraint_number)?;
        let text = &s[start..i];
        // `a - b`: spaces on both sides of the hyphen, then a version.
        let mut j = i;
        let range = if skip_space(s, &mut j) && s.as_bytes().get(j) == Some(&b'-') {
            j += 1;
            if skip_space(s, &mut j) {
                let start = j;
                parts(s, &mut j, constraint_number).map(|q| (start, j, q))
            } else {
                None
            }
        } else {
            None
        };
        match range {
            Some((to_start, to_end, q)) => {
                // Masterminds/semver rewrites `>=a - b` to `>=>= a, <= b`.
                if op.is_some() {
                    return None;
                }
                out.push(one(Op::GreaterEqual, text, &p)?);
                out.push(one(Op::LessEqual, &s[to_start..to_end], &q)?);
                i = to_end;
            }
            None => out.push(one(op.unwrap_or(Op::TildeOrEqual), text, &p)?),
        }
        let spaced = skip_space(s, &mut i);
        if i == s.len() {
            return Some(out);
        }
        if s.as_bytes()[i] == b',' {
            i += 1;
            skip_space(s, &mut i);
        } else if !spaced {
            return None;
        }
    }
}

/// One constraint of operator `op` on the version `text` (matched as `p`):
/// a missing or wildcard number makes it and the numbers after it 0, and the
/// constraint "dirty" from there (`1.x` is `~1`, `>1.x` is `>=2`).
fn one(op: Op, text: &str, p: &Parts<'_>) -> Option<One> {
    let [major, minor, patch] = p.numbers;
    let pre = p.pre.map(|pre| format!("-{pre}")).unwrap_or_default();
    let open = |n: Option<&str>| n.is_none_or(wildcard);
    let (version, dirty, minor_dirty, patch_dirty) = match (major, minor) {
        _ if open(major) => (format!("0.0.0{pre}"), true, false, false),
        (Some(major), _) if open(minor) => (format!("{major}.0.0{pre}"), true, true, false),
        (Some(major), Some(minor)) if open(patch) => {
            (format!("{major}.{minor}.0{pre}"), true, false, true)
        }
        _ => (text.to_owned(), false, false, false),
    };
    Some(One {
        op,
        con: Version::parse(&version).ok()?,
        dirty,
        minor_dirty,
        patch_dirty,
    })
}

impl One {
    /// Whether `v` satisfies this constraint; a prerelease only when
    /// `include_pre` (its group names one).
    fn check(&self, v: &Version, include_pre: bool) -> bool {
        if !v.pre.is_empty() && !include_pre {
            return false;
        }
        let c = &self.con;
        let cmp = v.cmp_precedence(c);
        match self.op {
            Op::NotEqual => {
                if self.dirty {
                    if c.major != v.major {
                        return true;
                    }
                    if c.minor != v.minor && !self.minor_dirty {
                        return true;
                    }
                    if self.minor_dirty {
                        return false;
                    }
                    if c.patch != v.patch && !self.patch_dirty {
                        return true;
                    }
                    if self.patch_dirty {
                        return (!v.pre.is_empty() || !c.pre.is_empty())
                            && compare_prerelease(&v.pre, &c.pre) != Ordering::Equal;
                    }
                }
                cmp != Ordering::Equal
            }
            Op::Greater => {
                if !self.dirty {
                    return cmp == Ordering::Greater;
                }
                if v.major != c.major {
                    return v.major > c.major;
                }
                if self.minor_dirty {
                    return false;
                }
                if self.patch_dirty {
                    return v.minor > c.minor;
                }
                cmp == Ordering::Greater
            }
            Op::Less => cmp == Ordering::Less,
            Op::GreaterEqual => cmp != Ordering::Less,
            Op::LessEqual => {
                if !self.dirty {
                    return cmp != Ordering::Greater;
                }
                !(v.major > c.major
                    || (v.major == c.major && v.minor > c.minor && !self.minor_dirty))
            }
            Op::Tilde => self.tilde(v, cmp),
            Op::TildeOrEqual => match self.dirty {
                true => self.tilde(v, cmp),
                false => cmp == Ordering::Equal,
            },
            Op::Caret => {
                if cmp == Ordering::Less {
                    return false;
                }
                if c.major > 0 || self.minor_dirty {
                    return v.major == c.major;
                }
                if v.major > 0 {
                    return false;
                }
                if c.minor > 0 || self.patch_dirty {
                    return v.minor == c.minor;
                }
                if v.minor > 0 {
                    return false;
                }
                v.patch == c.patch
            }
        }
    }

    /// `~1.2.3` is `>=1.2.3 <1.3.0`; `~1` and `~1.x` are `>=1 <2`; `~0.0.0` any.
    fn tilde(&self, v: &Version, cmp: Ordering) -> bool {
        let c = &self.con;
        if cmp == Ordering::Less {
            return false;
        }
        if (c.major, c.minor, c.patch) == (0, 0, 0) && !self.minor_dirty && !self.patch_dirty {
            return true;
        }
        v.major == c.major && (v.minor == c.minor || self.minor_dirty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(constraint: &str, version: &str) -> bool {
        let c = Constraint::parse(constraint).unwrap_or_else(|e| panic!("{constraint}: {e}"));
        let v = Version::parse(version).unwrap_or_else(|e| panic!("{version}: {e}"));
        c.matches(&v)
    }

    /// Masterminds/semver v3.4.0's `TestConstraintCheck` and
    /// `TestConstraintsCheck` tables, but for the three cases of an empty
    /// constraint, which its `NewConstraint` (what Porch calls) refuses.
    #[test]
    fn matches_as_masterminds_semver_does() {
        let cases: &[(&str, &str, bool)] = &[
            ("=2.0.0", "1.2.3", false),
            ("=2.0.0", "2.0.0", true),
            ("=2.0", "1.2.3", false),
            ("=2.0", "2.0.0", true),
            ("=2.0", "2.0.1", true),
            ("4.1", "4.1.0", true),
            ("!=4.1.0", "4.1.0", false),
            ("!=4.1.0", "4.1.1", true),
            ("!=4.1", "4.1.0", false),
            ("!=4.1", "4.1.1", false),
            ("!=4.1", "5.1.0-alpha.1", false),
            ("!=4.1.0", "5.1.0-alpha.1", false),
            ("!=4.1-alpha", "4.1.0", true),
            ("!=4.1", "5.1.0", true),
            ("<11", "0.1.0", true),
            ("<11", "11.1.0", false),
            ("<1.1", "0.1.0", true),
            ("<1.1", "1.1.0", false),
            ("<1.1", "1.1.1", false),
            ("<=11", "1.2.3", true),
            ("<=11", "12.2.3", false),
            ("<=11", "11.2.3", true),
            ("<=1.1", "1.2.3", false),
            ("<=1.1", "0.1.0", true),
            ("<=1.1", "1.1.0", true),
            ("<=1.1", "1.1.1", true),
            (">1.1", "4.1.0", true),
            (">1.1", "1.1.0", false),
            (">0", "0", false),
            (">0", "1", true),
            (">0", "0.0.1-alpha", false),
            (">0.0", "0.0.1-alpha", false),
            (">0-0", "0.0.1-alpha", false),
            (">0.0-0", "0.0.1-alpha", false),
            (">0", "0.0.0-alpha", false),
            (">0-0", "0.0.0-alpha", false),
            (">0.0.0-0", "0.0.0-alpha", true),
            (">1.2.3-alpha.1", "1.2.3-alpha.2", true),
            (">1.2.3-alpha.1", "1.3.3-alpha.2", true),
            (">11", "11.1.0", false),
            (">11.1", "11.1.0", false),
            (">11.1", "11.1.1", false),
            (">11.1", "11.2.1", true),
            (">=11", "11.1.2", true),
            (">=11.1", "11.1.2", true),
            (">=11.1", "11.0.2", false),
            (">=1.1", "4.1.0", true),
            (">=1.1", "1.1.0", true),
            (">=1.1", "0.0.9", false),
            (">=0", "0.0.1-alpha", false),
            (">=0.0", "0.0.1-alpha", false),
            (">=0-0", "0.0.1-alpha", true),
            (">=0.0-0", "0.0.1-alpha", true),
            (">=0", "0.0.0-alpha", false),
            (">=0-0", "0.0.0-alpha", true),
            (">=0.0.0-0", "0.0.0-alpha", true),
            (">=0.0.0-0", "1.2.3", true),
            (">=0.0.0-0", "3.4.5-beta.1", true),
            ("<0", "0.0.0-alpha", false),
            ("<0-z", "0.0.0-alpha", true),
            (">=0", "0", true),
            ("=0", "1", false),
            ("*", "1", true),
            ("*", "4.5.6", true),
            ("*", "1.2.3-alpha.1", false),
            ("*-0", "1.2.3-alpha.1", true),
            ("2.*", "1", false),
            ("2.*", "3.4.5", false),
            ("2.*", "2.1.1", true),
            ("2.1.*", "2.1.1", true),
            ("2.1.*", "2.2.1", false),
            ("2", "1", false),
            ("2", "3.4.5", false),
            ("2", "2.1.1", true),
            ("2.1", "2.1.1", true),
            ("2.1", "2.2.1", false),
            ("~1.2.3", "1.2.4", true),
            ("~1.2.3", "1.3.4", false),
            ("~1.2", "1.2.4", true),
            ("~1.2", "1.3.4", false),
            ("~1", "1.2.4", true),
            ("~1", "2.3.4", false),
            ("~0.2.3", "0.2.5", true),
            ("~0.2.3", "0.3.5", false),
            ("~1.2.3-beta.2", "1.2.3-beta.4", true),
            ("~1.2.3-beta.2", "1.2.4-beta.2", true),
            ("~1.2.3-beta.2", "1.3.4-beta.2", false),
            ("^1.2.3", "1.8.9", true),
            ("^1.2.3", "2.8.9", false),
            ("^1.2.3", "1.2.1", false),
            ("^1.1.0", "2.1.0", false),
            ("^1.2.0", "2.2.1", false),
            ("^1.2.0", "1.2.1-alpha.1", false),
            ("^1.2.0-alpha.0", "1.2.1-alpha.1", true),
            ("^1.2.0-alpha.0", "1.2.1-alpha.0", true),
            ("^1.2.0-alpha.2", "1.2.0-alpha.1", false),
            ("^1.2", "1.8.9", true),
            ("^1.2", "2.8.9", false),
            ("^1", "1.8.9", true),
            ("^1", "2.8.9", false),
            ("^0.2.3", "0.2.5", true),
            ("^0.2.3", "0.5.6", false),
            ("^0.2", "0.2.5", true),
            ("^0.2", "0.5.6", false),
            ("^0.0.3", "0.0.3", true),
            ("^0.0.3", "0.0.4", false),
            ("^0.0", "0.0.3", true),
            ("^0.0", "0.1.4", false),
            ("^0.0", "1.0.4", false),
            ("^0", "0.2.3", true),
            ("^0", "1.1.4", false),
            ("^0.2.3-beta.2", "0.2.3-beta.4", true),
            ("^0.2.3-beta.2", "0.2.4-beta.2", true),
            ("^0.2.3-beta.2", "0.3.4-beta.2", false),
            ("^0.2.3-beta.2", "0.2.3-beta.2", true),
            ("*", "1.2.3", true),
            ("~0.0.0", "1.2.3", true),
            ("0.x.x", "1.2.3", false),
            ("0.0.x", "1.2.3", false),
            ("0.0.0", "1.2.3", false),
            ("*", "1.2.3", true),
            ("^0.0.0", "1.2.3", false),
            ("= 2.0", "1.2.3", false),
            ("= 2.0", "2.0.0", true),
            ("4.1", "4.1.0", true),
            ("4.1.x", "4.1.3", true),
            ("1.x", "1.4", true),
            ("!=4.1", "4.1.0", false),
            ("!=4.1-alpha", "4.1.0-alpha", false),
            ("!=4.1-alpha", "4.1.1-alpha", false),
            ("!=4.1-alpha", "4.1.0", true),
            ("!=4.1", "5.1.0", true),
            ("!=4.x", "5.1.0", true),
            ("!=4.x", "4.1.0", false),
            ("!=4.1.x", "4.2.0", true),
            ("!=4.2.x", "4.2.3", false),
            (">1.1", "4.1.0", true),
            (">1.1", "1.1.0", false),
            ("<1.1", "0.1.0", true),
            ("<1.1", "1.1.0", false),
            ("<1.1", "1.1.1", false),
            ("<1.x", "1.1.1", false),
            ("<1.x", "0.1.1", true),
            ("<1.x", "2.0.0", false),
            ("<1.1.x", "1.2.1", false),
            ("<1.1.x", "1.1.500", false),
            ("<1.1.x", "1.0.500", true),
            ("<1.2.x", "1.1.1", true),
            (">=1.1", "4.1.0", true),
            (">=1.1", "4.1.0-beta", false),
            (">=1.1", "1.1.0", true),
            (">=1.1", "0.0.9", false),
            ("<=1.1", "0.1.0", true),
            ("<=1.1", "0.1.0-alpha", false),
            ("<=1.1-a", "0.1.0-alpha", true),
            ("<=1.1", "1.1.0", true),
            ("<=1.x", "1.1.0", true),
            ("<=2.x", "3.0.0", false),
            ("<=1.1", "1.1.1", true),
            ("<=1.1.x", "1.2.500", false),
            ("<=4.5", "3.4.0", true),
            ("<=4.5", "3.7.0", true),
            ("<=4.5", "4.6.3", false),
            (">1.1, <2", "1.1.1", false),
            (">1.1, <2", "1.2.1", true),
            (">1.1, <3", "4.3.2", false),
            (">=1.1, <2, !=1.2.3", "1.2.3", false),
            (">1.1 <2", "1.1.1", false),
            (">1.1 <2", "1.2.1", true),
            (">1.1    <3", "4.3.2", false),
            (">=1.1    <2    !=1.2.3", "1.2.3", false),
            (">=1.1, <2, !=1.2.3 || > 3", "4.1.2", true),
            (">=1.1, <2, !=1.2.3 || > 3", "3.1.2", false),
            (">=1.1, <2, !=1.2.3 || >= 3", "3.0.0", true),
            (">=1.1, <2, !=1.2.3 || > 3", "3.0.0", false),
            (">=1.1, <2, !=1.2.3 || > 3", "1.2.3", false),
            (">=1.1 <2 !=1.2.3", "1.2.3", false),
            (">=1.1 <2 !=1.2.3 || > 3", "4.1.2", true),
            (">=1.1 <2 !=1.2.3 || > 3", "3.1.2", false),
            (">=1.1 <2 !=1.2.3 || >= 3", "3.0.0", true),
            (">=1.1 <2 !=1.2.3 || > 3", "3.0.0", false),
            (">=1.1 <2 !=1.2.3 || > 3", "1.2.3", false),
            ("> 1.1, <     2", "1.1.1", false),
            (">   1.1, <2", "1.2.1", true),
            (">1.1, <  3", "4.3.2", false),
            (">= 1.1, <     2, !=1.2.3", "1.2.3", false),
            ("> 1.1 < 2", "1.1.1", false),
            (">1.1 < 2", "1.2.1", true),
            ("> 1.1    <3", "4.3.2", false),
            (">=1.1    < 2    != 1.2.3", "1.2.3", false),
            (">= 1.1, <2, !=1.2.3 || > 3", "4.1.2", true),
            (">= 1.1, <2, != 1.2.3 || > 3", "3.1.2", false),
            (">= 1.1, <2, != 1.2.3 || >= 3", "3.0.0", true),
            (">= 1.1, <2, !=1.2.3 || > 3", "3.0.0", false),
            (">= 1.1, <2, !=1.2.3 || > 3", "1.2.3", false),
            (">= 1.1 <2 != 1.2.3", "1.2.3", false),
            (">= 1.1 <2 != 1.2.3 || > 3", "4.1.2", true),
            (">= 1.1 <2 != 1.2.3 || > 3", "3.1.2", false),
            (">= 1.1 <2 != 1.2.3 || >= 3", "3.0.0", true),
            (">= 1.1 < 2 !=1.2.3 || > 3", "3.0.0", false),
            (">=1.1 < 2 !=1.2.3 || > 3", "1.2.3", false),
            (">= 1.0.0  <= 2.0.0-beta", "1.0.1-beta", true),
            (">= 1.0.0  <= 2.0.0-beta", "1.0.1", true),
            (">= 1.0.0  <= 2.0.0-beta", "3.0.0", false),
            (">= 1.0.0  <= 2.0.0-beta || > 3", "1.0.1-beta", true),
            (">= 1.0.0  <= 2.0.0-beta || > 3", "3.0.1-beta", false),
            (
                ">= 1.0.0  <= 2.0.0-beta != 1.0.1 || > 3",
                "1.0.1-beta",
                true,
            ),
            (
                ">= 1.0.0  <= 2.0.0-beta != 1.0.1-beta || > 3",
                "1.0.1-beta",
                false,
            ),
            (">= 1.0.0-0  <= 2.0.0", "1.0.1-beta", true),
            ("1.1 - 2", "1.1.1", true),
            ("1.5.0 - 4.5", "3.7.0", true),
            ("1.1-3", "4.3.2", false),
            ("^1.1", "1.1.1", true),
            ("^1.1", "4.3.2", false),
            ("^1.x", "1.1.1", true),
            ("^2.x", "1.1.1", false),
            ("^1.x", "2.1.1", false),
            ("^1.x", "1.1.1-beta1", false),
            ("^1.1.2-alpha", "1.2.1-beta1", true),
            ("^1.2.x-alpha", "1.1.1-beta1", false),
            ("^0.0.1", "0.0.1", true),
            ("^0.0.1", "0.3.1", false),
            ("~*", "2.1.1", true),
            ("~1", "2.1.1", false),
            ("~1", "1.3.5", true),
            ("~1", "1.4", true),
            ("~1.x", "2.1.1", false),
            ("~1.x", "1.3.5", true),
            ("~1.x", "1.4", true),
            ("~1.1", "1.1.1", true),
            ("~1.1", "1.1.1-alpha", false),
            ("~1.1-alpha", "1.1.1-beta", true),
            ("~1.1.1-beta", "1.1.1-alpha", false),
            ("~1.1.1-beta", "1.1.1", true),
            ("~1.2.3", "1.2.5", true),
            ("~1.2.3", "1.2.2", false),
            ("~1.2.3", "1.3.2", false),
            ("~1.1", "1.2.3", false),
            ("~1.3", "2.4.5", false),
            ("1.0.0 - 2.0.0 <=2.0.0", "1.5.0", true),
            ("1.0.0 - 2.0.0, <=2.0.0", "1.5.0", true),
        ];
        let failed: Vec<String> = cases
            .iter()
            .filter(|(c, v, want)| check(c, v) != *want)
            .map(|(c, v, want)| format!("{c:?} on {v:?} should be {want}"))
            .collect();
        assert!(failed.is_empty(), "{failed:#?}");
    }

    /// Masterminds/semver v3.4.0's `TestNewConstraint` table.
    #[test]
    fn parses_as_masterminds_semver_does() {
        for (input, ors, count) in [
            (">= 1.1", 1, 1),
            (">40.50.60, < 50.70", 1, 2),
            ("2.0", 1, 1),
            ("v2.3.5-20161202202307-sha.e8fc5e5", 1, 1),
            (">= 1.2.3 < 2.0", 1, 2),
            (">= 1.2.3 < 2.0 || => 3.0 < 4", 2, 2),
            (">= 1.2.3, < 2.0", 1, 2),
            (">= 1.2.3, < 2.0 || => 3.0, < 4", 2, 2),
            ("3 - 4 || => 3.0, < 4", 2, 2),
            ("12.3.34 ~1.2.3", 1, 2),
            ("1.0.0 - 2.0.0, <=2.0.0", 1, 3),
        ] {
            let c = Constraint::parse(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(c.groups.len(), ors, "{input}");
            assert_eq!(c.groups[0].0.len(), count, "{input}");
        }
        for bad in [
            ">= bar",
            "BAR >= 1.2.3",
            "12.3.4.1234",
            "12.23.4.1234",
            "12.3.34.1234",
            "12.3.34~ 1.2.3",
            "",
            "  ",
            "1.2,",
            ",1.2",
            ">=1 - 2",
            "1|2",
            "1.2 || ",
        ] {
            assert!(Constraint::parse(bad).is_err(), "{bad:?} parsed");
        }
        let long = "1".repeat(2000);
        assert_eq!(Constraint::parse(&long), Err(SemverError::TooLong));
    }

    /// Masterminds/semver v3.4.0's `TestNewVersion` table (loose parsing).
    #[test]
    fn parses_versions_loosely() {
        for ok in [
            "1.2.3",
            "1.2.3+test.01",
            "1.2.3-alpha.-1",
            "v1.2.3",
            "1.0",
            "v1.0",
            "1",
            "v1",
            "1.2-5",
            "v1.2-5",
            "1.2-beta.5",
            "v1.2-beta.5",
            "1.2.0-x.Y.0+metadata",
            "v1.2.0-x.Y.0+metadata",
            "1.2.0-x.Y.0+metadata-width-hypen",
            "1.2.3-rc1-with-hypen",
            "v1.2.3-rc1-with-hypen",
            "1.2.2147483648",
            "1.2147483648.3",
            "2147483648.3.0",
            "20221209-update-renovatejson-v4",
            "01.1.1",
            "1.01.1",
            "1.1.01",
        ] {
            assert!(Version::parse(ok).is_ok(), "{ok:?} refused");
        }
        for bad in [
            "1.2.3-alpha.01",
            "1.2.beta",
            "v1.2.beta",
            "foo",
            "\n1.2",
            "\nv1.2",
            "1.2.3.4",
            "v1.2.3.4",
            "12.3.4.1234",
            "1.1.2+.123",
            "1.0.0-alpha_beta",
            "1.0.0-alpha..",
            "1.0.0-alpha..1",
            "9.8.7+meta+meta",
            "1.2.31----RC-SNAPSHOT.12.09.1--.12+788",
            "99999999999999999999999",
            "latest",
            "",
        ] {
            assert!(Version::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn orders_by_precedence() {
        let mut versions: Vec<Version> = [
            "v1.0.0",
            "v1.0.0-rc.1",
            "v1.0.0-alpha",
            "v0.9",
            "v1.0.0-rc.11",
            "v1.0.0-rc.2",
            "v2",
            "v1.0.0-beta",
        ]
        .iter()
        .map(|v| Version::parse(v).unwrap())
        .collect();
        versions.sort_by(Version::cmp_precedence);
        let sorted: Vec<String> = versions.iter().map(ToString::to_string).collect();
        assert_eq!(
            sorted,
            [
                "v0.9",
                "v1.0.0-alpha",
                "v1.0.0-beta",
                "v1.0.0-rc.1",
                "v1.0.0-rc.2",
                "v1.0.0-rc.11",
                "v1.0.0",
                "v2"
            ]
        );
    }
}
