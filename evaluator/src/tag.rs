//! The `Tag` of an `EvaluateFunctionRequest`, as Porch's pod evaluator
//! reads it (nephio-project/porch `func/internal/podevaluator.go`, from
//! PR #537): empty, the image is run as given; otherwise a semantic version
//! constraint (Masterminds/semver, see [`super::semver`]) that replaces the
//! image's own tag with the highest tag of its repository that starts with
//! `v`, is a version, and satisfies the constraint.
//!
//! Porch lists the repository's tags on every call, and so does fnrun: the
//! answer can change as tags are pushed.

use fnrun_api::Quoted;
use fnrun_registry::{Credentials, ImageRef};

use super::semver::{Constraint, SemverError, Version};
use fnrun_runner::{Class, RunError, Runner};

/// Why a `Tag` chooses no image.
#[derive(Debug, thiserror::Error)]
pub enum TagError {
    #[error("Tag {tag} is not a version constraint: {error}")]
    NotAConstraint { tag: Quoted, error: SemverError },
    #[error("Tag {tag} needs a registry image, whose tags can be listed; {image} is not one")]
    NotARegistryImage { tag: Quoted, image: Quoted },
    #[error("image {image} is pinned by its digest: Tag {tag} cannot choose another version")]
    PinnedByDigest { image: Quoted, tag: Quoted },
    #[error("no tag of {repository} starting with v is a version that satisfies {constraint}")]
    NoMatch {
        repository: String,
        constraint: Quoted,
    },
    /// The reference, the registry or the listing of its tags failed.
    #[error(transparent)]
    Registry(#[from] RunError),
}

impl TagError {
    /// The failure class: no such version is NOT_FOUND, the registry's
    /// failures are its own, and the rest is a wrong request.
    pub fn class(&self) -> Class {
        match self {
            TagError::NoMatch { .. } => Class::NotFound,
            TagError::Registry(e) => e.class(),
            TagError::NotAConstraint { .. }
            | TagError::NotARegistryImage { .. }
            | TagError::PinnedByDigest { .. } => Class::InvalidArgument,
        }
    }
}

/// The image to run for `image` and `tag`.
pub async fn resolve(
    runner: &Runner,
    image: &str,
    tag: &str,
    credentials: &Credentials,
) -> Result<String, TagError> {
    if tag.is_empty() {
        return Ok(image.to_owned());
    }
    let constraint = Constraint::parse(tag).map_err(|error| TagError::NotAConstraint {
        tag: Quoted::new(tag),
        error,
    })?;
    let reference = runner
        .cache()
        .parse_reference(image)
        .map_err(RunError::from)?;
    let ImageRef::Registry {
        registry,
        repository,
        digest,
        ..
    } = &reference
    else {
        return Err(TagError::NotARegistryImage {
            tag: Quoted::new(tag),
            image: Quoted::new(image),
        });
    };
    if digest.is_some() {
        return Err(TagError::PinnedByDigest {
            image: Quoted::new(image),
            tag: Quoted::new(tag),
        });
    }
    runner.check_registry(&reference)?;
    let tags = runner
        .cache()
        .list_tags(&reference, credentials)
        .await
        .map_err(RunError::from)?;
    let best = highest(&tags, &constraint).ok_or_else(|| TagError::NoMatch {
        repository: format!("{registry}/{repository}"),
        constraint: Quoted::new(tag),
    })?;
    Ok(format!("{registry}/{repository}:{best}"))
}

/// The highest of `tags` that starts with `v`, is a version and satisfies
/// `constraint` (of two equal versions, the greater name).
fn highest<'a>(tags: &'a [String], constraint: &Constraint) -> Option<&'a str> {
    tags.iter()
        .filter(|t| t.starts_with('v'))
        .filter_map(|t| Some((Version::parse(t).ok()?, t)))
        .filter(|(v, _)| constraint.matches(v))
        .max_by(|(a, x), (b, y)| a.cmp_precedence(b).then_with(|| x.cmp(y)))
        .map(|(_, t)| t.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(tags: &[&str], constraint: &str) -> Option<String> {
        let tags: Vec<String> = tags.iter().map(|t| (*t).to_owned()).collect();
        highest(&tags, &Constraint::parse(constraint).unwrap()).map(str::to_owned)
    }

    #[test]
    fn picks_the_highest_v_tag_within_the_constraint() {
        let tags = [
            "latest",
            "v0.1.0",
            "v0.4.1",
            "v0.4.10",
            "v0.4.2",
            "v0.5.0-rc.1",
            "0.4.99",
            "v1.0.0",
            "v0.4",
            "sha256-abc",
            "v0.4.3-git-1",
        ];
        assert_eq!(pick(&tags, "~0.4").as_deref(), Some("v0.4.10"));
        assert_eq!(pick(&tags, "< 1").as_deref(), Some("v0.4.10"));
        assert_eq!(
            pick(&tags, ">= 0.5.0-0, < 1").as_deref(),
            Some("v0.5.0-rc.1")
        );
        assert_eq!(pick(&tags, "^1").as_deref(), Some("v1.0.0"));
        assert_eq!(pick(&tags, "v0.4.2").as_deref(), Some("v0.4.2"));
        assert_eq!(pick(&tags, "0.4.0").as_deref(), Some("v0.4"));
        // Tags without a `v` are not versions to Porch.
        assert_eq!(pick(&tags, "0.4.99"), None);
        assert_eq!(pick(&tags, "> 2"), None);
        assert_eq!(pick(&[], "*"), None);
    }
}
