//! Running an xfn-era FunctionIO function (Crossplane v1.11 to v1.13) behind
//! the v1 function API: a v1 `RunFunctionRequest` becomes the FunctionIO the
//! function reads on stdin ([`functionio_from_request`]), and the FunctionIO
//! it writes on stdout becomes the `RunFunctionResponse`
//! ([`response_from_functionio`]). v1beta1 has the same wire format: decode
//! its bytes as v1 ([`crate::transcode`]).
//!
//! # Request to FunctionIO
//!
//! | v1 `RunFunctionRequest` | FunctionIO | notes |
//! |---|---|---|
//! | `observed.composite.resource` | `observed.composite.resource` | Struct to YAML; absent: `{}` |
//! | `observed.composite.connection_details` | `observed.composite.connectionDetails` | `{name, value}` sorted by name; bytes to string, invalid UTF-8 replaced by U+FFFD (v1.13 passed strings too) |
//! | `observed.resources` (map by name) | `observed.resources` (list) | `{name, resource, connectionDetails}` sorted by name |
//! | `desired.composite.resource` | `desired.composite.resource` | the pipeline's *partial* desired XR (v1.13 passed the whole XR); absent: `{}` |
//! | `desired.composite.connection_details` | `desired.composite.connectionDetails` | as observed |
//! | `desired.resources` (map by name) | `desired.resources` (list) | `{name, resource}` sorted by name |
//! | `desired.*.ready` | - | no FunctionIO field; carried to the response |
//! | `desired.resources.*.connection_details` | - | Crossplane ignores them; carried to the response |
//! | `input` | `config` | absent: no `config` |
//! | `context` | - | no FunctionIO field; copied to the response |
//! | `meta.tag` | - | copied to the response's `meta.tag` |
//! | `meta.capabilities` | - | **lost** |
//! | `extra_resources`, `required_resources`, `required_schemas`, `credentials` | - | **lost**: FunctionIO cannot carry them (a FunctionIO function never asks for them) |
//! | - | `results` | empty: v1 does not pass results between steps |
//! | - | `apiVersion`, `kind` | left out, as the v1.13 controller did |
//!
//! # FunctionIO to response
//!
//! | FunctionIO output | v1 `RunFunctionResponse` | notes |
//! |---|---|---|
//! | - | `meta.tag` | the request's tag |
//! | - | `meta.ttl` | unset (no TTL: Crossplane does not cache, and calls again on its poll interval); a caller may set it |
//! | `desired.composite.resource` | `desired.composite.resource` | YAML to Struct; left unset when empty and nothing else is set |
//! | `desired.composite.connectionDetails` | `desired.composite.connection_details` | string to bytes; a repeated name keeps its last value |
//! | `desired.resources[].connectionDetails` (derived) | `desired.composite.connection_details` | evaluated against the observed resource of the same name with v1.13's rules (see *Derived connection details*); they override explicit ones, as in v1.13 |
//! | `desired.resources[]` `{name, resource}` | `desired.resources{name}.resource` | a repeated name keeps its last entry |
//! | `desired.resources[].readinessChecks` | - | **lost**: v1 has no readiness checks; the request's `ready` is carried, so put `function-auto-ready` after the step to derive readiness |
//! | - | `desired.*.ready`, `desired.resources.*.connection_details` | from the request's desired resource of the same name |
//! | `results[]` `{severity, message}` | `results[]` `{severity, message}` | Fatal, Warning, Normal to `SEVERITY_FATAL`, `_WARNING`, `_NORMAL`; no `reason` or `target` |
//! | `observed`, `config` | - | ignored, as v1.13 ignored them |
//! | - | `context` | the request's context, unchanged |
//! | - | `requirements`, `conditions`, `output` | unset: FunctionIO cannot express them |
//!
//! Values: a Struct holds JSON, so YAML integers become doubles (exact up to
//! 2^53, as everywhere in Crossplane's v1 API), and a double that is a whole
//! number comes back as a YAML integer. A request whose Structs hold a NaN or
//! an infinite number (a binary Struct can; JSON cannot) is refused with
//! [`Error::Request`] before the function runs. In the output, what JSON
//! cannot hold (NaN, infinity, tagged values, collections as keys) is
//! refused with [`Error::Value`];
//! numeric, boolean and null keys become strings, as `sigs.k8s.io/yaml` makes
//! them.
//!
//! # Derived connection details
//!
//! See the `connection` module: `FromValue`, `FromConnectionSecretKey` and
//! `FromFieldPath` are evaluated as Crossplane v1.13 evaluated them, against
//! the state observed before the pipeline (v1.13 used the state just
//! applied, so a new value appears one reconcile later). Malformed ones are
//! refused with [`Error::ConnectionDetail`], as v1.13 failed the reconcile.

mod connection;
mod structpb;

use std::collections::BTreeMap;

use serde_norway::Value;

pub use self::connection::DerivedError;

pub use self::structpb::ValueError;
use crate::functionio::{
    self, Composite, ConnectionDetail, Desired, DesiredResource, FnResult, FunctionIo, Observed,
    ObservedResource,
};
use crate::v1;
use crate::yaml::{Quoted, Segment, YamlError};

/// Why a request cannot be written as FunctionIO, or a response cannot be
/// built from a function's output.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value of the request has no JSON form (a NaN or infinite number,
    /// which a binary Struct can carry): the caller's fault, refused before
    /// the function runs ([`check_request`]).
    #[error("the request has a value FunctionIO cannot carry at {0}")]
    Request(#[source] ValueError),
    /// The output is not a FunctionIO.
    #[error("function output is not a FunctionIO: {0}")]
    Output(#[source] functionio::Error),
    /// A value of the output has no JSON form.
    #[error("function output has a value a protobuf Struct cannot hold at {0}")]
    Value(#[source] ValueError),
    /// A derived connection detail of a desired resource is malformed.
    #[error("desired resource {resource}: connectionDetails[{index}]: {error}")]
    ConnectionDetail {
        /// The resource's name.
        resource: Quoted,
        /// The detail's index.
        index: usize,
        /// What is wrong.
        #[source]
        error: DerivedError,
    },
    /// The FunctionIO could not be written as YAML.
    #[error("cannot write the FunctionIO: {0}")]
    Yaml(#[source] YamlError),
}

/// The FunctionIO given to the function for a v1 request (see the module's
/// table).
pub fn functionio_from_request(request: &v1::RunFunctionRequest) -> FunctionIo {
    let observed = request.observed.as_ref();
    let desired = request.desired.as_ref();
    FunctionIo {
        api_version: None,
        kind: None,
        config: request.input.as_ref().map(structpb::to_yaml),
        observed: Observed {
            composite: composite(observed),
            resources: observed
                .map(|s| {
                    s.resources
                        .iter()
                        .map(|(name, r)| ObservedResource {
                            name: name.clone(),
                            resource: resource_yaml(r),
                            connection_details: explicit_details(r),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        },
        desired: Desired {
            composite: composite(desired),
            resources: desired
                .map(|s| {
                    s.resources
                        .iter()
                        .map(|(name, r)| DesiredResource {
                            name: name.clone(),
                            resource: resource_yaml(r),
                            connection_details: Vec::new(),
                            readiness_checks: Vec::new(),
                        })
                        .collect()
                })
                .unwrap_or_default(),
        },
        results: Vec::new(),
    }
}

/// Checks that every Struct of `request` that the FunctionIO carries holds
/// only what JSON can, so that a function that returns its input unchanged
/// has output that maps back to a response: a binary Struct can carry NaN
/// or infinity, which JSON (so Crossplane) cannot, and which the output
/// mapping refuses. The error names the request's field (`input`,
/// `observed.…`, `desired.…`).
pub fn check_request(request: &v1::RunFunctionRequest) -> Result<(), Error> {
    fn at(segments: &[&str], e: ValueError) -> Error {
        Error::Request(
            segments
                .iter()
                .rev()
                .fold(e, |e, s| e.within(Segment::Key((*s).to_owned()))),
        )
    }
    if let Some(input) = &request.input {
        structpb::check_json(input).map_err(|e| at(&["input"], e))?;
    }
    for (field, state) in [
        ("observed", &request.observed),
        ("desired", &request.desired),
    ] {
        let Some(state) = state else { continue };
        if let Some(resource) = state.composite.as_ref().and_then(|c| c.resource.as_ref()) {
            structpb::check_json(resource).map_err(|e| at(&[field, "composite", "resource"], e))?;
        }
        for (name, r) in &state.resources {
            if let Some(resource) = &r.resource {
                structpb::check_json(resource)
                    .map_err(|e| at(&[field, "resources", name, "resource"], e))?;
            }
        }
    }
    Ok(())
}

/// [`functionio_from_request`], written as the YAML document for the
/// function's stdin, once [`check_request`] passes.
pub fn functionio_yaml_from_request(request: &v1::RunFunctionRequest) -> Result<Vec<u8>, Error> {
    check_request(request)?;
    serde_norway::to_string(&functionio_from_request(request))
        .map(String::into_bytes)
        .map_err(|e| Error::Yaml(e.into()))
}

fn composite(state: Option<&v1::State>) -> Composite {
    let composite = state.and_then(|s| s.composite.as_ref());
    Composite {
        resource: composite.map(resource_yaml).unwrap_or_default(),
        connection_details: composite.map(explicit_details).unwrap_or_default(),
    }
}

fn resource_yaml(r: &v1::Resource) -> BTreeMap<String, Value> {
    r.resource
        .as_ref()
        .map(structpb::to_yaml)
        .unwrap_or_default()
}

fn explicit_details(r: &v1::Resource) -> Vec<ConnectionDetail> {
    r.connection_details
        .iter()
        .map(|(name, value)| ConnectionDetail {
            name: name.clone(),
            value: String::from_utf8_lossy(value).into_owned(),
        })
        .collect()
}

/// The v1 response for a function's FunctionIO `output`, given the request
/// it answers (see the module's table).
pub fn response_from_functionio(
    request: &v1::RunFunctionRequest,
    output: FunctionIo,
) -> Result<v1::RunFunctionResponse, Error> {
    let observed = request.observed.as_ref();
    let desired = request.desired.as_ref();

    let mut composite_details: BTreeMap<String, Vec<u8>> = output
        .desired
        .composite
        .connection_details
        .into_iter()
        .map(|d| (d.name, d.value.into_bytes()))
        .collect();

    let mut resources = BTreeMap::new();
    for resource in output.desired.resources {
        let name = resource.name;
        let observed = observed.and_then(|s| s.resources.get(&name));
        for (index, detail) in resource.connection_details.iter().enumerate() {
            let derived =
                connection::derive(detail, observed).map_err(|error| Error::ConnectionDetail {
                    resource: Quoted::new(&name),
                    index,
                    error,
                })?;
            if let Some((key, value)) = derived {
                composite_details.insert(key, value);
            }
        }
        let carried = desired.and_then(|s| s.resources.get(&name));
        let body = structpb::from_yaml(&resource.resource).map_err(|e| {
            Error::Value(
                e.within(Segment::Key("resource".into()))
                    .within(Segment::Key(name.clone()))
                    .within(Segment::Key("resources".into()))
                    .within(Segment::Key("desired".into())),
            )
        })?;
        resources.insert(
            name,
            v1::Resource {
                resource: Some(body),
                connection_details: carried
                    .map(|r| r.connection_details.clone())
                    .unwrap_or_default(),
                ready: carried.map_or(v1::Ready::Unspecified.into(), |r| r.ready),
            },
        );
    }

    let body = structpb::from_yaml(&output.desired.composite.resource).map_err(|e| {
        Error::Value(
            e.within(Segment::Key("resource".into()))
                .within(Segment::Key("composite".into()))
                .within(Segment::Key("desired".into())),
        )
    })?;
    let ready = desired
        .and_then(|s| s.composite.as_ref())
        .map_or(v1::Ready::Unspecified.into(), |c| c.ready);
    let composite = if body.fields.is_empty()
        && composite_details.is_empty()
        && ready == i32::from(v1::Ready::Unspecified)
    {
        None
    } else {
        Some(v1::Resource {
            resource: Some(body),
            connection_details: composite_details,
            ready,
        })
    };

    Ok(v1::RunFunctionResponse {
        meta: Some(v1::ResponseMeta {
            tag: request
                .meta
                .as_ref()
                .map(|m| m.tag.clone())
                .unwrap_or_default(),
            ttl: None,
        }),
        desired: Some(v1::State {
            composite,
            resources,
        }),
        results: output.results.iter().map(result).collect(),
        context: request.context.clone(),
        requirements: None,
        conditions: Vec::new(),
        output: None,
    })
}

/// [`response_from_functionio`] for the function's raw stdout, which is
/// first checked as a FunctionIO.
pub fn response_from_functionio_yaml(
    request: &v1::RunFunctionRequest,
    output: &[u8],
) -> Result<v1::RunFunctionResponse, Error> {
    let output = functionio::validate(output).map_err(Error::Output)?;
    response_from_functionio(request, output)
}

fn result(r: &FnResult) -> v1::Result {
    let severity = match r.severity {
        functionio::Severity::Fatal => v1::Severity::Fatal,
        functionio::Severity::Warning => v1::Severity::Warning,
        functionio::Severity::Normal => v1::Severity::Normal,
    };
    v1::Result {
        severity: severity.into(),
        message: r.message.clone(),
        reason: None,
        target: None,
    }
}

#[cfg(test)]
mod tests;
