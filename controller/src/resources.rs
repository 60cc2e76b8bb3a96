//! The Crossplane package types Kubernetes mode reads, with only the fields
//! it uses (unknown fields are ignored, so newer Crossplanes read too):
//! `pkg.crossplane.io/v1` Function and FunctionRevision, `v1beta1`
//! DeploymentRuntimeConfig and ImageConfig.

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The label Crossplane puts on a package's revisions: the package's name.
pub const PACKAGE_LABEL: &str = "pkg.crossplane.io/package";

/// A Function package (`spec.package`), as installed.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "pkg.crossplane.io",
    version = "v1",
    kind = "Function",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct FunctionSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub package_pull_secrets: Vec<NameRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_config_ref: Option<RuntimeConfigRef>,
}

/// One revision of a Function: the Active one is served.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "pkg.crossplane.io",
    version = "v1",
    kind = "FunctionRevision",
    status = "FunctionRevisionStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct FunctionRevisionSpec {
    /// `Active` or `Inactive`.
    #[serde(default)]
    pub desired_state: String,
    /// The package, as the Function names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub package_pull_secrets: Vec<NameRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_config_ref: Option<RuntimeConfigRef>,
}

/// What Crossplane's package manager wrote about a revision.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FunctionRevisionStatus {
    /// The image after ImageConfig rewrites, when Crossplane resolved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_image: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied_image_config_refs: Vec<AppliedImageConfigRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// An ImageConfig Crossplane applied to a revision, and why
/// (`SetImagePullSecret`, `RewriteImage`, ...).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct AppliedImageConfigRef {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub reason: String,
}

/// A condition, as crossplane-runtime writes them.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// A reference by name (a Secret in Crossplane's namespace).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct NameRef {
    #[serde(default)]
    pub name: String,
}

/// A Function's `runtimeConfigRef`: a DeploymentRuntimeConfig by default.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeConfigRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    pub name: String,
}

/// How a package's runtime is deployed; fnrun reads the `package-runtime`
/// container of its Deployment template.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "pkg.crossplane.io",
    version = "v1beta1",
    kind = "DeploymentRuntimeConfig",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentRuntimeConfigSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_template: Option<serde_json::Value>,
}

/// Settings for images matching a prefix; fnrun reads its pull secret.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[kube(
    group = "pkg.crossplane.io",
    version = "v1beta1",
    kind = "ImageConfig",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ImageConfigSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<ImageConfigRegistry>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct ImageConfigRegistry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<ImageConfigAuthentication>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ImageConfigAuthentication {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret_ref: Option<NameRef>,
}

impl FunctionRevision {
    /// Whether Crossplane made this revision the one to run.
    pub fn is_active(&self) -> bool {
        self.spec.desired_state == "Active"
    }

    /// The image to run: `status.resolvedImage` (after ImageConfig
    /// rewrites), else `spec.image`.
    pub fn image(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.resolved_image.as_deref())
            .filter(|i| !i.is_empty())
            .or(self.spec.image.as_deref())
            .filter(|i| !i.is_empty())
    }

    /// The condition `type_`, if set.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
    }
}
