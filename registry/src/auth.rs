//! What a registry request authenticates with. Where credentials are found (docker's
//! config file, credential helpers, pull secrets) is module `credentials`.

use std::fmt;

/// Registry credentials.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum Credentials {
    /// No credentials (anonymous token, if the registry uses tokens).
    #[default]
    Anonymous,
    /// User name and password (or access token used as a password).
    Basic {
        /// User name.
        username: String,
        /// Password; never printed.
        password: String,
    },
    /// A registry token (docker's `registrytoken`): sent as is as
    /// `Authorization: Bearer` to the registry, without a token exchange.
    Bearer {
        /// The token; never printed.
        token: String,
    },
    /// An identity token (docker's `identitytoken`): an OAuth2 refresh token that is
    /// exchanged at the registry's token endpoint for a repository-scoped access token.
    IdentityToken {
        /// The refresh token; never printed.
        token: String,
    },
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &"<redacted>")
                .finish(),
            Credentials::Bearer { .. } => f.write_str("Bearer(<redacted>)"),
            Credentials::IdentityToken { .. } => f.write_str("IdentityToken(<redacted>)"),
        }
    }
}
