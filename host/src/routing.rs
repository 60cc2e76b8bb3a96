//! Which function a call is for. A connection is routed by its TLS server
//! name (SNI); a call on a connection without one (h2c, or a TLS client that
//! sends none) by the host of its `:authority`. Function `NAME` answers to
//! `NAME`, `NAME.NAMESPACE` and `NAME.NAMESPACE.svc`, with or without a
//! port, in any case, with or without a final dot: the names Crossplane
//! dials a function's Service by.

/// What a call says about the function it is for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Route {
    /// The TLS server name of its connection.
    pub sni: Option<String>,
    /// The `:authority` (or `Host`) of the call.
    pub authority: Option<String>,
}

/// The function name `host` (a server name or an authority's host, port
/// allowed) stands for in `namespace`; `None` for an IP address literal.
pub fn function_name(host: &str, namespace: &str) -> Option<String> {
    let host = strip_port(host.trim())?;
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if host.is_empty() || host.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    let namespace = namespace.to_ascii_lowercase();
    for suffix in [format!(".{namespace}.svc"), format!(".{namespace}")] {
        if let Some(name) = host.strip_suffix(&suffix) {
            return Some(name.to_owned());
        }
    }
    Some(host)
}

/// The host of `host[:port]`; `None` for a bracketed IPv6 literal.
pub(crate) fn strip_port(authority: &str) -> Option<&str> {
    // A bracketed or bare IPv6 literal.
    if authority.starts_with('[') || authority.matches(':').count() > 1 {
        return None;
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => Some(host),
        Some(_) => None,
        None => Some(authority),
    }
}

/// The names `name` answers to as a server name (and its certificate's SANs).
pub fn server_names(name: &str, namespace: &str) -> [String; 3] {
    [
        name.to_owned(),
        format!("{name}.{namespace}"),
        format!("{name}.{namespace}.svc"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_of_a_function_name() {
        let name = |h| function_name(h, "crossplane-system");
        for host in [
            "fn-a",
            "fn-a:9443",
            "fn-a.crossplane-system",
            "fn-a.crossplane-system:9443",
            "fn-a.crossplane-system.svc",
            "fn-a.crossplane-system.svc:9443",
            "FN-A.Crossplane-System.SVC.",
            "fn-a.crossplane-system.svc.:9443",
        ] {
            assert_eq!(name(host).as_deref(), Some("fn-a"), "{host}");
        }
        // Another namespace's name is not this one's function.
        assert_eq!(name("fn-a.other").as_deref(), Some("fn-a.other"));
        assert_eq!(
            name("fn-a.crossplane-system.svc.cluster.local").as_deref(),
            Some("fn-a.crossplane-system.svc.cluster.local")
        );
        for none in ["", "10.0.0.1:9443", "[::1]:9443", "::1", "localhost:x"] {
            assert_eq!(name(none), None, "{none}");
        }
        assert_eq!(
            server_names("fn-a", "ns"),
            ["fn-a", "fn-a.ns", "fn-a.ns.svc"]
        );
    }
}
