//! Image references: `[REGISTRY/]REPO[:TAG][@sha256:DIGEST]` and `oci:PATH[:TAG]`.
//!
//! This is a small hand-written parser rather than `oci_spec::distribution::Reference`
//! (which oci-client re-exports): that parser hard-codes `docker.io` as the registry of
//! unqualified references, and fnrun's `--registry` flag makes the default configurable.
//! The grammar follows distribution/reference: the first path component is a registry
//! if it contains `.` or `:`, is `localhost`, or is a bracketed IPv6 address.
//! Where it and oci-spec's parser read a reference differently, the tests of
//! `oci_spec_disagreements` below say what fnrun decides and why; the fuzz target
//! `reference` checks that they differ nowhere else.

use std::fmt;
use std::path::PathBuf;

use crate::digest::{Digest, DigestError, truncate};
use crate::kind::ErrorKind;

/// Docker Hub's registry host, as the normalized form of `docker.io` references.
pub const DOCKER_HUB: &str = "index.docker.io";

const DEFAULT_TAG: &str = "latest";
/// distribution/reference (from v0.6.0) and oci-spec: a repository path is at
/// most 255 bytes, a Docker Hub one counted with its `library/`; the registry
/// is not counted.
const MAX_NAME_LEN: usize = 255;
const MAX_TAG_LEN: usize = 128;

/// An image reference refused by the parser.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid image reference \"{reference}\": {reason}")]
pub struct ReferenceError {
    /// The reference as given (truncated if very long).
    pub reference: String,
    /// What is wrong with it.
    pub reason: ReferenceProblem,
}

/// What is wrong with an image reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceProblem {
    #[error("the reference is empty")]
    Empty,
    #[error(
        "{0}: images are not read; copy it into an OCI archive with `skopeo copy {0}:... oci-archive:IMAGE.tar` and use oci-archive:IMAGE.tar (or oci:DIR, a layout)"
    )]
    Transport(&'static str),
    #[error(
        "the registry host {0} reads as the {0}: transport; give its address (an IP or a name with a dot)"
    )]
    HostIsTransport(&'static str),
    #[error("the reference contains white space or control characters")]
    WhiteSpace,
    #[error("the oci layout path is empty")]
    EmptyLayoutPath,
    #[error("the tag after the oci layout path is empty")]
    EmptyLayoutTag,
    #[error("the oci layout tag has characters outside [A-Za-z0-9-._:@+/]")]
    LayoutTag,
    #[error("more than one '@'")]
    SeveralDigests,
    #[error("unsupported digest algorithm \"{0}\"; only sha256 is supported")]
    DigestAlgorithm(String),
    #[error("the digest must be sha256: followed by 64 lower-case hex digits")]
    Digest,
    #[error("the repository name is empty")]
    EmptyRepository,
    #[error("the repository name is longer than {MAX_NAME_LEN} characters")]
    NameTooLong,
    #[error("the tag must match [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}}")]
    Tag,
    #[error("invalid registry \"{registry}\": {problem}")]
    Registry {
        registry: String,
        problem: RegistryProblem,
    },
    #[error("the default registry is invalid: invalid registry \"{registry}\": {problem}")]
    DefaultRegistry {
        registry: String,
        problem: RegistryProblem,
    },
    #[error("the repository name must be lower-case")]
    UpperCase,
    #[error(
        "invalid repository path component \"{0}\": it must be lower-case letters and digits separated by '.', '_', '__' or '-'"
    )]
    RepositoryComponent(String),
}

/// What is wrong with the registry part of a reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RegistryProblem {
    #[error("unterminated '[' in IPv6 address")]
    UnterminatedIpv6,
    #[error("invalid IPv6 address")]
    Ipv6,
    #[error("unexpected characters after the IPv6 address")]
    AfterIpv6,
    #[error("host names are dot-separated labels of letters, digits and '-'")]
    Host,
    #[error("the port must be a number from 1 to 65535")]
    Port,
}

impl ReferenceError {
    /// Its class: always [`ErrorKind::InvalidReference`].
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidReference
    }
}

fn invalid(reference: &str, reason: ReferenceProblem) -> ReferenceError {
    ReferenceError {
        reference: truncate(reference),
        reason,
    }
}

/// Where an image comes from: a parsed and normalized reference.
///
/// Only [`ImageRef::parse`] (and the cache's `Cache::parse_reference`) make one: its
/// variants cannot be built elsewhere, so whoever holds an `ImageRef` holds a valid,
/// normalized reference and nothing normalizes it again.
///
/// ```compile_fail
/// // Not outside this crate: the variants are `#[non_exhaustive]`.
/// let _ = fnrun_registry::ImageRef::Registry {
///     registry: "docker.io".into(),
///     repository: "busybox".into(),
///     tag: None,
///     digest: None,
/// };
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ImageRef {
    /// An image in a registry. `tag` is `latest` when neither a tag nor a digest was given.
    #[non_exhaustive]
    Registry {
        /// Registry host with an optional port, as the reference spells it
        /// (Docker keeps its case too), e.g. `index.docker.io`, `localhost:5000`.
        registry: String,
        /// Repository path, e.g. `library/busybox`.
        repository: String,
        /// Tag, if any.
        tag: Option<String>,
        /// Manifest digest (`sha256:...`), if any. It wins over the tag when both are given.
        digest: Option<String>,
    },
    /// An OCI image layout directory on the local file system.
    #[non_exhaustive]
    OciLayout {
        /// The layout directory (as given).
        path: PathBuf,
        /// Matched against the `org.opencontainers.image.ref.name` annotation in index.json.
        tag: Option<String>,
        /// `oci-archive:PATH[:TAG]`: `path` is a tar of the layout, not a directory.
        archive: bool,
    },
}

impl ImageRef {
    /// Parses a reference. Unqualified registry references use `default_registry`; when
    /// that is Docker Hub, single-component repositories get the `library/` prefix.
    pub fn parse(s: &str, default_registry: &str) -> Result<ImageRef, ReferenceError> {
        parse(s, default_registry)
    }

    /// The manifest digest, for registry references that pin one.
    pub fn pinned_digest(&self) -> Option<Digest> {
        match self {
            ImageRef::Registry {
                digest: Some(d), ..
            } => Digest::parse(d).ok(),
            _ => None,
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageRef::Registry {
                registry,
                repository,
                tag,
                digest,
            } => {
                write!(f, "{registry}/{repository}")?;
                if let Some(tag) = tag {
                    write!(f, ":{tag}")?;
                }
                if let Some(digest) = digest {
                    write!(f, "@{digest}")?;
                }
                Ok(())
            }
            ImageRef::OciLayout { path, tag, archive } => {
                let transport = if *archive { "oci-archive" } else { "oci" };
                write!(f, "{transport}:{}", path.display())?;
                if let Some(tag) = tag {
                    write!(f, ":{tag}")?;
                }
                Ok(())
            }
        }
    }
}

/// skopeo's transports that fnrun does not read.
const UNSUPPORTED_TRANSPORTS: [&str; 4] = [
    "docker-archive",
    "docker-daemon",
    "containers-storage",
    "dir",
];

pub(crate) fn parse(s: &str, default_registry: &str) -> Result<ImageRef, ReferenceError> {
    if s.is_empty() {
        return Err(invalid(s, ReferenceProblem::Empty));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(s, ReferenceProblem::WhiteSpace));
    }
    if let Some(rest) = s.strip_prefix("oci:") {
        return parse_oci_layout(s, rest, false);
    }
    // skopeo's and podman's transport of registries. A registry host named
    // like a transport (`docker://oci:5000/fn`) could not be printed back
    // as a reference that means it: refused.
    if let Some(rest) = s.strip_prefix("docker://") {
        if let Some(transport) = ["oci", "oci-archive"]
            .into_iter()
            .chain(UNSUPPORTED_TRANSPORTS)
            .find(|t| rest.strip_prefix(t).is_some_and(|r| r.starts_with(':')))
        {
            return Err(invalid(s, ReferenceProblem::HostIsTransport(transport)));
        }
        return parse_registry(rest, default_registry).map_err(|e| invalid(s, e.reason));
    }
    // skopeo's other transports: said to be unsupported, with what to use
    // instead, rather than taken for a registry host named like them.
    for transport in UNSUPPORTED_TRANSPORTS {
        if s.strip_prefix(transport)
            .is_some_and(|rest| rest.starts_with(':'))
        {
            return Err(invalid(s, ReferenceProblem::Transport(transport)));
        }
    }
    if let Some(rest) = s.strip_prefix("oci-archive:") {
        return parse_oci_layout(s, rest, true);
    }
    parse_registry(s, default_registry)
}

/// `oci:PATH[:TAG]` and `oci-archive:PATH[:TAG]`. Like skopeo, the path ends at the
/// first `:`, so the path itself cannot contain one.
fn parse_oci_layout(s: &str, rest: &str, archive: bool) -> Result<ImageRef, ReferenceError> {
    let (path, tag) = match rest.split_once(':') {
        Some((path, tag)) => (path, Some(tag)),
        None => (rest, None),
    };
    if path.is_empty() {
        return Err(invalid(s, ReferenceProblem::EmptyLayoutPath));
    }
    if let Some(tag) = tag {
        if tag.is_empty() {
            return Err(invalid(s, ReferenceProblem::EmptyLayoutTag));
        }
        // The org.opencontainers.image.ref.name grammar: alphanumerics and -._:@+/
        if tag.len() > MAX_NAME_LEN
            || !tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._:@+/".contains(&b))
        {
            return Err(invalid(s, ReferenceProblem::LayoutTag));
        }
    }
    Ok(ImageRef::OciLayout {
        path: PathBuf::from(path),
        tag: tag.map(str::to_owned),
        archive,
    })
}

fn parse_registry(s: &str, default_registry: &str) -> Result<ImageRef, ReferenceError> {
    let (name_tag, digest) = match s.split_once('@') {
        Some((name_tag, digest)) => {
            if digest.contains('@') {
                return Err(invalid(s, ReferenceProblem::SeveralDigests));
            }
            let digest = Digest::parse(digest).map_err(|e| match e {
                DigestError::Unsupported(alg) => invalid(s, ReferenceProblem::DigestAlgorithm(alg)),
                DigestError::Invalid(_) => invalid(s, ReferenceProblem::Digest),
            })?;
            (name_tag, Some(digest.to_string()))
        }
        None => (s, None),
    };
    // A ':' after the last '/' starts the tag; an earlier one is a registry port.
    let last_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name_tag[last_slash..].find(':') {
        Some(i) => {
            let split = last_slash + i;
            (&name_tag[..split], Some(&name_tag[split + 1..]))
        }
        None => (name_tag, None),
    };
    if let Some(tag) = tag {
        validate_tag(s, tag)?;
    }
    if name.is_empty() {
        return Err(invalid(s, ReferenceProblem::EmptyRepository));
    }

    let (registry, repository) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.')
                || first.contains(':')
                || first == "localhost"
                || first.starts_with('[') =>
        {
            validate_registry(first).map_err(|problem| {
                let registry = truncate(first);
                invalid(s, ReferenceProblem::Registry { registry, problem })
            })?;
            (first.to_owned(), rest)
        }
        _ => {
            validate_registry(default_registry).map_err(|problem| {
                let registry = truncate(default_registry);
                invalid(s, ReferenceProblem::DefaultRegistry { registry, problem })
            })?;
            (default_registry.to_owned(), name)
        }
    };
    let registry = if registry == "docker.io" {
        DOCKER_HUB.to_owned()
    } else {
        registry
    };
    validate_repository(s, repository)?;
    let repository = if registry == DOCKER_HUB && !repository.contains('/') {
        format!("library/{repository}")
    } else {
        repository.to_owned()
    };
    if repository.len() > MAX_NAME_LEN {
        return Err(invalid(s, ReferenceProblem::NameTooLong));
    }
    let tag = match (tag, &digest) {
        (Some(tag), _) => Some(tag.to_owned()),
        (None, None) => Some(DEFAULT_TAG.to_owned()),
        (None, Some(_)) => None,
    };
    Ok(ImageRef::Registry {
        registry,
        repository,
        tag,
        digest,
    })
}

/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`
fn validate_tag(s: &str, tag: &str) -> Result<(), ReferenceError> {
    let ok = !tag.is_empty()
        && tag.len() <= MAX_TAG_LEN
        && tag.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_alphanumeric() || b == b'_' || (i > 0 && (b == b'.' || b == b'-'))
        });
    if ok {
        Ok(())
    } else {
        Err(invalid(s, ReferenceProblem::Tag))
    }
}

/// `host[:port]` where host is DNS labels, or `[ipv6]`.
fn validate_registry(registry: &str) -> Result<(), RegistryProblem> {
    let (host, port) = if let Some(rest) = registry.strip_prefix('[') {
        let Some((addr, after)) = rest.split_once(']') else {
            return Err(RegistryProblem::UnterminatedIpv6);
        };
        // Hex digits and colons, as Docker's grammar has them: no zone, no
        // IPv4 in dotted form (`::ffff:1.2.3.4`).
        if !addr.bytes().all(|b| b.is_ascii_hexdigit() || b == b':')
            || addr.parse::<std::net::Ipv6Addr>().is_err()
        {
            return Err(RegistryProblem::Ipv6);
        }
        match after {
            "" => (None, None),
            p => match p.strip_prefix(':') {
                Some(port) => (None, Some(port)),
                None => return Err(RegistryProblem::AfterIpv6),
            },
        }
    } else {
        match registry.split_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(registry), None),
        }
    };
    if let Some(host) = host {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if host.is_empty() || !host.split('.').all(label_ok) {
            return Err(RegistryProblem::Host);
        }
    }
    if let Some(port) = port
        && (port.is_empty()
            || !port.bytes().all(|b| b.is_ascii_digit())
            || !matches!(port.parse::<u16>(), Ok(1..)))
    {
        return Err(RegistryProblem::Port);
    }
    Ok(())
}

/// Components `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*` separated by `/`.
fn validate_repository(s: &str, repository: &str) -> Result<(), ReferenceError> {
    if repository.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(invalid(s, ReferenceProblem::UpperCase));
    }
    for component in repository.split('/') {
        if !repository_component_ok(component) {
            return Err(invalid(
                s,
                ReferenceProblem::RepositoryComponent(truncate(component)),
            ));
        }
    }
    Ok(())
}

fn repository_component_ok(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator run: '.', '_', '__' or one or more '-'.
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";

    fn reg(r: &str, repo: &str, tag: Option<&str>, digest: Option<&str>) -> ImageRef {
        ImageRef::Registry {
            registry: r.into(),
            repository: repo.into(),
            tag: tag.map(Into::into),
            digest: digest.map(Into::into),
        }
    }

    #[test]
    fn parses_valid_references() {
        let hub = DOCKER_HUB;
        let cases: Vec<(&str, &str, ImageRef, String)> = vec![
            (
                "busybox",
                hub,
                reg(hub, "library/busybox", Some("latest"), None),
                "index.docker.io/library/busybox:latest".into(),
            ),
            (
                "busybox:1.36",
                hub,
                reg(hub, "library/busybox", Some("1.36"), None),
                "index.docker.io/library/busybox:1.36".into(),
            ),
            (
                "docker.io/busybox",
                hub,
                reg(hub, "library/busybox", Some("latest"), None),
                "index.docker.io/library/busybox:latest".into(),
            ),
            (
                "docker.io/library/busybox",
                "docker.io",
                reg(hub, "library/busybox", Some("latest"), None),
                "index.docker.io/library/busybox:latest".into(),
            ),
            (
                "busybox",
                "docker.io",
                reg(hub, "library/busybox", Some("latest"), None),
                "index.docker.io/library/busybox:latest".into(),
            ),
            (
                "crossplane/function-foo:v1",
                hub,
                reg(hub, "crossplane/function-foo", Some("v1"), None),
                "index.docker.io/crossplane/function-foo:v1".into(),
            ),
            (
                "busybox",
                "localhost:5000",
                reg("localhost:5000", "busybox", Some("latest"), None),
                "localhost:5000/busybox:latest".into(),
            ),
            (
                "localhost/fn",
                hub,
                reg("localhost", "fn", Some("latest"), None),
                "localhost/fn:latest".into(),
            ),
            (
                "localhost:5000/a/b_c__d-e.f:tag-1.0",
                hub,
                reg("localhost:5000", "a/b_c__d-e.f", Some("tag-1.0"), None),
                "localhost:5000/a/b_c__d-e.f:tag-1.0".into(),
            ),
            (
                "127.0.0.1:5000/fn",
                hub,
                reg("127.0.0.1:5000", "fn", Some("latest"), None),
                "127.0.0.1:5000/fn:latest".into(),
            ),
            (
                "xpkg.upbound.io/crossplane-contrib/function-patch-and-transform:v0.1.4",
                hub,
                reg(
                    "xpkg.upbound.io",
                    "crossplane-contrib/function-patch-and-transform",
                    Some("v0.1.4"),
                    None,
                ),
                "xpkg.upbound.io/crossplane-contrib/function-patch-and-transform:v0.1.4".into(),
            ),
            (
                "Registry.Example.COM/fn",
                hub,
                reg("Registry.Example.COM", "fn", Some("latest"), None),
                "Registry.Example.COM/fn:latest".into(),
            ),
            (
                "[::1]:5000/fn:v1",
                hub,
                reg("[::1]:5000", "fn", Some("v1"), None),
                "[::1]:5000/fn:v1".into(),
            ),
        ];
        for (input, default, want, display) in cases {
            let got = parse(input, default).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(got, want, "{input}");
            assert_eq!(got.to_string(), display, "{input}");
            // The normalized form parses to itself.
            assert_eq!(
                parse(&display, "unused.example").unwrap(),
                want,
                "{display}"
            );
        }

        let with_digest = parse(&format!("localhost:5000/fn@{D}"), hub).unwrap();
        assert_eq!(with_digest, reg("localhost:5000", "fn", None, Some(D)));
        assert_eq!(with_digest.to_string(), format!("localhost:5000/fn@{D}"));
        assert!(with_digest.pinned_digest().is_some());
        let both = parse(&format!("fn:v1@{D}"), hub).unwrap();
        assert_eq!(both, reg(hub, "library/fn", Some("v1"), Some(D)));
    }

    #[test]
    fn parses_oci_layouts() {
        assert_eq!(
            parse("oci:/tmp/layout", DOCKER_HUB).unwrap(),
            ImageRef::OciLayout {
                path: "/tmp/layout".into(),
                tag: None,
                archive: false,
            }
        );
        let r = parse("oci:./dir:v1.0", DOCKER_HUB).unwrap();
        assert_eq!(
            r,
            ImageRef::OciLayout {
                path: "./dir".into(),
                tag: Some("v1.0".into()),
                archive: false,
            }
        );
        assert_eq!(r.to_string(), "oci:./dir:v1.0");
        let r = parse("oci-archive:/tmp/img.tar:v1", DOCKER_HUB).unwrap();
        assert_eq!(
            r,
            ImageRef::OciLayout {
                path: "/tmp/img.tar".into(),
                tag: Some("v1".into()),
                archive: true,
            }
        );
        assert_eq!(r.to_string(), "oci-archive:/tmp/img.tar:v1");
    }

    /// Where fnrun's parser and oci-spec's (`oci_client::Reference`) read a
    /// reference differently, one test per kind of input (issue 18; the fuzz
    /// target `reference` finds any other). Each checks that oci-spec still
    /// reads it so, then says what fnrun decides against the distribution
    /// spec and Docker's grammar (distribution/reference), and why.
    mod oci_spec_disagreements {
        use super::*;
        use oci_client::Reference;

        const HUB: &str = DOCKER_HUB;

        fn oci(s: &str) -> Reference {
            Reference::try_from(s).unwrap_or_else(|e| panic!("oci-spec refuses {s:?}: {e}"))
        }

        fn oci_refuses(s: &str) {
            assert!(Reference::try_from(s).is_err(), "oci-spec takes {s:?}");
        }

        fn problem(s: &str) -> ReferenceProblem {
            parse(s, HUB).unwrap_err().reason
        }

        /// Decided: the registry keeps its case, as Docker and oci-spec keep
        /// it (the grammar allows upper case in a domain); fnrun lower-cased
        /// it. `Docker.io` is not Docker Hub: both compare `docker.io`
        /// exactly. (Agreed now; it was a disagreement.)
        #[test]
        fn a_registry_keeps_its_case() {
            for (input, registry) in [
                ("Example.COM:5000/fn:v1", "Example.COM:5000"),
                ("Docker.io/fn:v1", "Docker.io"),
            ] {
                assert_eq!(oci(input).registry(), registry);
                assert_eq!(
                    parse(input, HUB).unwrap(),
                    reg(registry, "fn", Some("v1"), None)
                );
            }
        }

        /// Decided: only the repository path counts towards the 255
        /// characters, a Docker Hub one with its `library/`, as Docker counts
        /// it since distribution/reference v0.6.0 and oci-spec does (the
        /// spec sets no limit; it says many clients count the registry too,
        /// so registries should avoid such names). fnrun counted the
        /// registry as well, refusing Docker Hub short names of 238 to 247
        /// characters that both accept. (Agreed now.)
        #[test]
        fn a_name_of_255_counts_its_repository_path_only() {
            let short = "a".repeat(255 - "library/".len());
            let path = "a".repeat(255);
            for input in [
                short.clone(),
                format!("docker.io/{short}"),
                format!("index.docker.io/library/{short}:v1"),
                format!("example.com/{path}"),
                format!(
                    "registry.example.com:5000/{}/{}",
                    &path[..127],
                    &path[..127]
                ),
            ] {
                let theirs = oci(&input);
                let ImageRef::Registry { repository, .. } = parse(&input, HUB).unwrap() else {
                    panic!("{input}: not a registry reference");
                };
                assert_eq!(repository, theirs.repository(), "{input}");
            }
            for input in [format!("{short}a"), format!("example.com/{path}a")] {
                oci_refuses(&input);
                assert_eq!(problem(&input), ReferenceProblem::NameTooLong, "{input}");
            }
        }

        /// Decided: a bracketed IPv6 address is a registry, as in Docker's
        /// grammar (oci-spec's copy of it predates them), in hex digits and
        /// colons only: Docker leaves out zones and the dotted IPv4 form
        /// (`::ffff:1.2.3.4`), and so does fnrun now.
        #[test]
        fn a_bracketed_ipv6_registry_is_a_registry() {
            oci_refuses("[::1]:5000/fn:v1");
            assert_eq!(
                parse("[::1]:5000/fn:v1", HUB).unwrap(),
                reg("[::1]:5000", "fn", Some("v1"), None)
            );
            assert!(parse("[2001:DB8::1]/fn", HUB).is_ok());
            for input in ["[::ffff:1.2.3.4]/fn", "[fe80::1%eth0]:5000/fn"] {
                oci_refuses(input);
                assert!(
                    matches!(
                        problem(input),
                        ReferenceProblem::Registry {
                            problem: RegistryProblem::Ipv6,
                            ..
                        }
                    ),
                    "{input}"
                );
            }
        }

        /// Decided: `oci:` and `oci-archive:` name a layout and an archive,
        /// as in skopeo and podman, where oci-spec reads an image `oci` or
        /// `oci-archive` of Docker Hub with a tag; that image can be written
        /// `docker.io/library/oci:TAG`.
        #[test]
        fn oci_prefixes_name_layouts() {
            for (input, archive) in [("oci:fn", false), ("oci-archive:fn.tar", true)] {
                assert!(
                    oci(input).repository().starts_with("library/oci"),
                    "{input}"
                );
                assert!(
                    matches!(parse(input, HUB).unwrap(), ImageRef::OciLayout { archive: a, .. } if a == archive),
                    "{input}"
                );
            }
        }

        /// Decided: skopeo's other transports (`dir:`, `docker-archive:`, ...)
        /// are refused with the `skopeo copy` that makes an archive fnrun
        /// reads, rather than taken for a Docker Hub image with a tag.
        #[test]
        fn other_transport_prefixes_are_refused() {
            assert_eq!(oci("dir:v1").repository(), "library/dir");
            assert_eq!(problem("dir:v1"), ReferenceProblem::Transport("dir"));
            oci("docker-daemon:v1");
            assert_eq!(
                problem("docker-daemon:v1"),
                ReferenceProblem::Transport("docker-daemon")
            );
        }

        /// Decided: skopeo's `docker://` prefix is taken, which no
        /// reference grammar has: `fnrun run docker://IMAGE` means IMAGE.
        #[test]
        fn the_docker_transport_prefix_is_taken() {
            oci_refuses("docker://example.com/fn:v1");
            assert_eq!(
                parse("docker://example.com/fn:v1", HUB).unwrap(),
                parse("example.com/fn:v1", HUB).unwrap()
            );
        }

        /// Decided: a tag is ASCII, as the spec's `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`
        /// and Docker's (Go's `\w` is ASCII) have it; oci-spec's Rust `\w`
        /// takes any Unicode letter or digit.
        #[test]
        fn a_tag_is_ascii() {
            for input in ["fn:é", "fn:v٣", "example.com/fn:ǅ"] {
                oci(input);
                assert_eq!(problem(input), ReferenceProblem::Tag, "{input}");
            }
        }

        /// Decided: a digest's hex is lower-case, as the image spec's
        /// sha256 encoding `[a-f0-9]{64}` and Docker (go-digest) require;
        /// oci-spec takes any hex digit.
        #[test]
        fn a_digest_is_lower_case() {
            let input = format!("fn@sha256:{}", "F".repeat(64));
            oci(&input);
            assert_eq!(problem(&input), ReferenceProblem::Digest);
        }

        /// Decided, stricter by design: a digest is sha256, the one
        /// algorithm the store verifies; the image spec registers sha512
        /// too, and oci-spec also takes sha384.
        #[test]
        fn a_digest_is_sha256() {
            for (algorithm, len) in [("sha512", 128), ("sha384", 96)] {
                let input = format!("fn@{algorithm}:{}", "f".repeat(len));
                oci(&input);
                assert_eq!(
                    problem(&input),
                    ReferenceProblem::DigestAlgorithm(algorithm.into())
                );
            }
        }

        /// Decided: a repository is lower-case, and an upper-case first
        /// component is refused as such. oci-spec reads `Fn/app` as the
        /// Docker Hub repository `Fn/app`, which its own grammar forbids;
        /// Docker reads `Fn` as a registry host. fnrun takes a first
        /// component for a registry by a `.`, a `:`, `localhost` or
        /// brackets, as oci-spec does: a host without a dot can be written
        /// with its port, and a mistyped repository is said to be one
        /// rather than looked up as a host.
        #[test]
        fn an_upper_case_first_component_is_refused() {
            assert_eq!(oci("Fn/app:v1").repository(), "Fn/app");
            assert_eq!(problem("Fn/app:v1"), ReferenceProblem::UpperCase);
            assert_eq!(
                parse("Fn:5000/app:v1", HUB).unwrap(),
                reg("Fn:5000", "app", Some("v1"), None)
            );
        }

        /// Decided: a registry host is dot-separated labels of letters,
        /// digits and `-`, as in Docker's grammar and DNS. oci-spec takes
        /// `my_registry.example` for a registry: its grammar reads it as a
        /// repository component, then its split calls it a domain (Docker's
        /// reads a reference with no registry and that repository).
        #[test]
        fn a_registry_host_has_no_underscore() {
            assert_eq!(
                oci("my_registry.example/fn").registry(),
                "my_registry.example"
            );
            assert!(matches!(
                problem("my_registry.example/fn"),
                ReferenceProblem::Registry {
                    problem: RegistryProblem::Host,
                    ..
                }
            ));
        }

        /// Decided: a port is a TCP port, 1 to 65535; oci-spec and Docker
        /// take any digits, which fail only when the registry is dialled.
        /// fnrun took 65536 to 99999.
        #[test]
        fn a_port_is_a_tcp_port() {
            for input in [
                "example.com:0/fn",
                "example.com:65536/fn",
                "example.com:99999999/fn",
            ] {
                oci(input);
                assert!(
                    matches!(
                        problem(input),
                        ReferenceProblem::Registry {
                            problem: RegistryProblem::Port,
                            ..
                        }
                    ),
                    "{input}"
                );
            }
            assert!(parse("example.com:65535/fn", HUB).is_ok());
        }
    }

    #[test]
    fn refuses_invalid_references() {
        let long_repo = "a".repeat(300);
        let cases = [
            "",
            " busybox",
            "busybox ",
            "Busybox",
            "library/BusyBox",
            "localhost:5000/Fn",
            "busybox:",
            ":tag",
            "busybox:-tag",
            "busybox:tag with space",
            "busybox@sha256:abc",
            "busybox@sha256:FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF",
            "busybox@md5:ffffffffffffffffffffffffffffffff",
            "busybox@sha512:ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "a//b",
            "a/",
            "/a",
            "a/-b",
            "a/b-",
            "a/b...c",
            "a/b___c",
            "local_host:5000/fn",
            "-bad.example.com/fn",
            "example.com:port/fn",
            "[::1/fn",
            "[zz]:5000/fn",
            "oci:",
            "oci::tag",
            "oci:/path:",
            "oci:/path:bad tag",
            "oci-archive:",
            "oci-archive:/x.tar:",
            &long_repo,
        ];
        for input in cases {
            let err = parse(input, DOCKER_HUB).expect_err(input);
            assert!(
                err.to_string().starts_with("invalid image reference"),
                "{err}"
            );
            let err = ImageRef::parse(input, DOCKER_HUB).unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidReference, "{input}");
        }
    }

    #[test]
    fn takes_skopeos_docker_transport_and_names_what_to_use_for_others() {
        let r = parse("docker://localhost:5000/fns/echo:v1", DOCKER_HUB).unwrap();
        assert_eq!(r, reg("localhost:5000", "fns/echo", Some("v1"), None));
        let r = parse("docker://busybox", DOCKER_HUB).unwrap();
        assert_eq!(r.to_string(), "index.docker.io/library/busybox:latest");
        let err = parse("docker://", DOCKER_HUB).unwrap_err();
        assert_eq!(err.reference, "docker://");
        // Printed back, these would name a layout or a transport.
        for (input, host) in [
            ("docker://oci:5000/fn", "oci"),
            ("docker://dir:5000/fn", "dir"),
            ("docker://oci-archive:1/fn", "oci-archive"),
        ] {
            let err = parse(input, DOCKER_HUB).unwrap_err();
            assert_eq!(
                err.reason,
                ReferenceProblem::HostIsTransport(host),
                "{input}"
            );
        }
        for (input, transport) in [
            ("docker-archive:/tmp/fn.tar", "docker-archive"),
            ("docker-archive:fn.tar:fn:v1", "docker-archive"),
            ("docker-daemon:fn:v1", "docker-daemon"),
            ("containers-storage:fn", "containers-storage"),
            ("dir:/tmp/fn", "dir"),
        ] {
            let err = parse(input, DOCKER_HUB).unwrap_err();
            assert_eq!(
                err.reason,
                ReferenceProblem::Transport(transport),
                "{input}"
            );
            let message = err.to_string();
            assert!(
                message.contains("skopeo copy") && message.contains("oci-archive:"),
                "{message}"
            );
        }
        // A registry host that merely starts like one is a registry.
        let r = parse("dir.example.com/fn:v1", DOCKER_HUB).unwrap();
        assert_eq!(r, reg("dir.example.com", "fn", Some("v1"), None));
    }

    #[test]
    fn refuses_invalid_default_registry() {
        assert!(parse("busybox", "bad registry").is_err());
        assert!(parse("busybox", "").is_err());
        let err = parse("busybox", "bad:port").unwrap_err();
        assert_eq!(
            err.reason,
            ReferenceProblem::DefaultRegistry {
                registry: "bad:port".into(),
                problem: RegistryProblem::Port
            }
        );
        assert_eq!(
            err.to_string(),
            "invalid image reference \"busybox\": the default registry is invalid: invalid registry \"bad:port\": the port must be a number from 1 to 65535"
        );
    }

    #[test]
    fn messages_name_the_problem() {
        let message = |r: &str| parse(r, DOCKER_HUB).unwrap_err().to_string();
        assert_eq!(
            message("busybox:-tag"),
            "invalid image reference \"busybox:-tag\": the tag must match [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
        );
        assert_eq!(
            message("[zz]:5000/fn"),
            "invalid image reference \"[zz]:5000/fn\": invalid registry \"[zz]:5000\": invalid IPv6 address"
        );
        assert_eq!(
            message("busybox@md5:ffffffffffffffffffffffffffffffff"),
            "invalid image reference \"busybox@md5:ffffffffffffffffffffffffffffffff\": unsupported digest algorithm \"md5\"; only sha256 is supported"
        );
    }
}
