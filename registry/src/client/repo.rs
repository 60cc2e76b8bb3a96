//! What a registry request is about: a repository and the reference it is named by in
//! messages. A leaf: the client, its errors and its token exchange all use it.

/// A repository in a registry plus the normalized reference used in messages.
#[derive(Debug, Clone)]
pub struct Repo {
    pub registry: String,
    pub repository: String,
    pub reference: String,
}
