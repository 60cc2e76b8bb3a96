//! Crossplane's v1alpha1 `ContainerizedFunctionRunnerService` (Crossplane
//! v1.11 to v1.13, FunctionIO on stdin and stdout): a thin shell that decodes
//! the request, calls the core [`Runner`], and answers failures with the
//! core's one table of status codes.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use fnrun_api::quantity;
use fnrun_api::v1alpha1::{
    ImagePullAuth, ImagePullPolicy, NetworkPolicy, RunFunctionRequest, RunFunctionResponse,
    containerized_function_runner_service_server::ContainerizedFunctionRunnerService,
};
use fnrun_cache::PullPolicy;
use fnrun_registry::Credentials;
use fnrun_runner::error::{RequestError, RunError};
use fnrun_runner::runner::{DEFAULT_TIMEOUT, RunRequest, Runner};
use fnrun_sandbox::Network;
use tonic::{Request, Response, Status};

/// Serves `RunFunction` from a shared [`Runner`].
#[derive(Clone)]
pub struct FunctionRunnerService {
    runner: Arc<Runner>,
}

impl FunctionRunnerService {
    pub fn new(runner: Arc<Runner>) -> Self {
        FunctionRunnerService { runner }
    }
}

#[tonic::async_trait]
impl ContainerizedFunctionRunnerService for FunctionRunnerService {
    async fn run_function(
        &self,
        request: Request<RunFunctionRequest>,
    ) -> Result<Response<RunFunctionResponse>, Status> {
        let req = decode(request.into_inner()).map_err(RunError::InvalidRequest)?;
        let out = self.runner.run(req).await?;
        Ok(Response::new(RunFunctionResponse { output: out.output }))
    }
}

/// Turns the wire request into a [`RunRequest`], refusing anything malformed.
pub fn decode(req: RunFunctionRequest) -> Result<RunRequest, RequestError> {
    if req.image.trim().is_empty() {
        return Err(RequestError::NoImage);
    }
    let mut run = RunRequest::new(req.image, req.input);
    if let Some(pull) = req.image_pull_config {
        run.pull_policy = match ImagePullPolicy::try_from(pull.pull_policy) {
            Ok(ImagePullPolicy::Unspecified | ImagePullPolicy::IfNotPresent) => {
                PullPolicy::IfNotPresent
            }
            Ok(ImagePullPolicy::Always) => PullPolicy::Always,
            Ok(ImagePullPolicy::Never) => PullPolicy::Never,
            Err(_) => return Err(RequestError::PullPolicy(pull.pull_policy)),
        };
        if let Some(auth) = pull.auth {
            run.credentials = credentials(&auth)?;
        }
    }
    if let Some(config) = req.run_function_config {
        if let Some(network) = config.network {
            run.network = match NetworkPolicy::try_from(network.policy) {
                Ok(NetworkPolicy::Unspecified | NetworkPolicy::Isolated) => Network::Isolated,
                Ok(NetworkPolicy::Runner) => Network::Runner,
                Err(_) => return Err(RequestError::NetworkPolicy(network.policy)),
            };
        }
        if let Some(limits) = config.resources.and_then(|r| r.limits) {
            if !limits.memory.is_empty() {
                run.memory_bytes = Some(
                    quantity::parse_memory_limit(&limits.memory).map_err(RequestError::Memory)?,
                );
            }
            if !limits.cpu.is_empty() {
                run.cpu_millis =
                    Some(quantity::parse_cpu_limit(&limits.cpu).map_err(RequestError::Cpu)?);
            }
        }
        if let Some(t) = config.timeout {
            if t.seconds < 0 || t.nanos < 0 {
                return Err(RequestError::NegativeTimeout {
                    seconds: t.seconds,
                    nanos: t.nanos,
                });
            }
            // Both checked non-negative above.
            let t = Duration::new(t.seconds.unsigned_abs(), t.nanos.unsigned_abs());
            run.timeout = if t.is_zero() { DEFAULT_TIMEOUT } else { t };
        }
    }
    Ok(run)
}

/// Credentials from an `ImagePullAuth`, in the order docker uses them: a registry
/// token (sent as is), an identity token (an OAuth2 refresh token, exchanged at the
/// registry's token endpoint), username/password, then `auth`.
fn credentials(auth: &ImagePullAuth) -> Result<Credentials, RequestError> {
    if !auth.registry_token.is_empty() {
        return Ok(Credentials::Bearer {
            token: auth.registry_token.clone(),
        });
    }
    if !auth.identity_token.is_empty() {
        return Ok(Credentials::IdentityToken {
            token: auth.identity_token.clone(),
        });
    }
    if !auth.username.is_empty() || !auth.password.is_empty() {
        return Ok(Credentials::Basic {
            username: auth.username.clone(),
            password: auth.password.clone(),
        });
    }
    if !auth.auth.is_empty() {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.auth.trim())
            .map_err(|_| RequestError::AuthNotBase64)?;
        let decoded = String::from_utf8(decoded).map_err(|_| RequestError::AuthNotUtf8)?;
        let (username, password) = decoded
            .split_once(':')
            .ok_or(RequestError::AuthNotUserPassword)?;
        return Ok(Credentials::Basic {
            username: username.to_owned(),
            password: password.to_owned(),
        });
    }
    Ok(Credentials::Anonymous)
}

#[cfg(test)]
mod credentials_tests {
    use super::*;

    #[test]
    fn every_form_of_image_pull_auth() {
        let with = |f: fn(&mut ImagePullAuth)| {
            let mut a = ImagePullAuth::default();
            f(&mut a);
            credentials(&a)
        };
        assert_eq!(with(|_| {}), Ok(Credentials::Anonymous));
        assert_eq!(
            with(|a| {
                a.username = "u".into();
                a.password = "p".into();
            }),
            Ok(Credentials::Basic {
                username: "u".into(),
                password: "p".into()
            })
        );
        assert_eq!(
            with(|a| a.auth = "dTpwOnc=".into()),
            Ok(Credentials::Basic {
                username: "u".into(),
                password: "p:w".into()
            })
        );
        assert_eq!(
            with(|a| {
                a.identity_token = "refresh".into();
                a.username = "u".into();
            }),
            Ok(Credentials::IdentityToken {
                token: "refresh".into()
            })
        );
        assert_eq!(
            with(|a| {
                a.registry_token = "bearer".into();
                a.identity_token = "refresh".into();
                a.auth = "dTpw".into();
            }),
            Ok(Credentials::Bearer {
                token: "bearer".into()
            })
        );
        let mut a = ImagePullAuth {
            auth: "bm9jb2xvbg==".into(),
            ..Default::default()
        };
        let err = credentials(&a).unwrap_err();
        assert!(!err.to_string().contains("nocolon"), "{err}");
        a.auth = "%%%".into();
        assert!(credentials(&a).is_err());
    }
}

#[cfg(test)]
mod tests {
    use fnrun_api::v1alpha1::{
        ImagePullConfig, NetworkConfig, ResourceConfig, ResourceLimits, RunFunctionConfig,
    };

    use super::*;

    fn req() -> RunFunctionRequest {
        RunFunctionRequest {
            image: "example.org/fn:v1".into(),
            input: b"{}".to_vec(),
            image_pull_config: None,
            run_function_config: None,
        }
    }

    #[test]
    fn defaults_follow_the_spec() {
        let r = decode(req()).unwrap();
        assert_eq!(r.timeout, Duration::from_secs(25));
        assert_eq!(r.network, Network::Isolated);
        assert!(matches!(r.pull_policy, PullPolicy::IfNotPresent));
        assert!(matches!(r.credentials, Credentials::Anonymous));
        assert_eq!(r.memory_bytes, None);
    }

    #[test]
    fn decodes_every_field() {
        let mut q = req();
        q.image_pull_config = Some(ImagePullConfig {
            pull_policy: ImagePullPolicy::Never as i32,
            auth: Some(ImagePullAuth {
                auth: base64::engine::general_purpose::STANDARD.encode("u:p:w"),
                ..Default::default()
            }),
        });
        q.run_function_config = Some(RunFunctionConfig {
            resources: Some(ResourceConfig {
                limits: Some(ResourceLimits {
                    memory: "128Mi".into(),
                    cpu: "500m".into(),
                }),
            }),
            network: Some(NetworkConfig {
                policy: NetworkPolicy::Runner as i32,
            }),
            timeout: Some(prost_types::Duration {
                seconds: 2,
                nanos: 500_000_000,
            }),
        });
        let r = decode(q).unwrap();
        assert!(matches!(r.pull_policy, PullPolicy::Never));
        assert!(
            matches!(&r.credentials, Credentials::Basic { username, password } if username == "u" && password == "p:w")
        );
        assert_eq!(r.memory_bytes, Some(128 << 20));
        assert_eq!(r.cpu_millis, Some(500));
        assert_eq!(r.network, Network::Runner);
        assert_eq!(r.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn refuses_malformed_requests() {
        let mut q = req();
        q.image = " ".into();
        assert!(
            decode(q)
                .unwrap_err()
                .to_string()
                .contains("image is required")
        );
        let mut q = req();
        q.run_function_config = Some(RunFunctionConfig {
            resources: Some(ResourceConfig {
                limits: Some(ResourceLimits {
                    memory: "lots".into(),
                    cpu: String::new(),
                }),
            }),
            ..Default::default()
        });
        assert!(
            decode(q)
                .unwrap_err()
                .to_string()
                .contains("memory limit \"lots\"")
        );
        // Limits no process can start in, or no cpu at all: refused before
        // any sandbox is made, with what was probably meant.
        for (memory, cpu, wanted) in [
            (
                "128m",
                "",
                "memory limit \"128m\" is 128 thousandths of a byte",
            ),
            ("0", "", "below the smallest memory limit"),
            ("1Ki", "", "below the smallest memory limit"),
            ("", "0", "cpu limit \"0\" is no cpu at all"),
        ] {
            let mut q = req();
            q.run_function_config = Some(RunFunctionConfig {
                resources: Some(ResourceConfig {
                    limits: Some(ResourceLimits {
                        memory: memory.into(),
                        cpu: cpu.into(),
                    }),
                }),
                ..Default::default()
            });
            let e = decode(q).unwrap_err().to_string();
            assert!(e.contains(wanted), "{memory:?} {cpu:?}: {e}");
        }
        let mut q = req();
        q.run_function_config = Some(RunFunctionConfig {
            timeout: Some(prost_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..Default::default()
        });
        assert!(decode(q).unwrap_err().to_string().contains("negative"));
        let mut q = req();
        q.image_pull_config = Some(ImagePullConfig {
            pull_policy: 42,
            auth: None,
        });
        assert!(
            decode(q)
                .unwrap_err()
                .to_string()
                .contains("unknown image pull policy")
        );
    }
}
