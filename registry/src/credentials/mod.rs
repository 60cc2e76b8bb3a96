//! Registry credentials from where container tools keep them: podman's and
//! skopeo's `auth.json`, a docker `config.json` (`auths`, `credsStore`, `credHelpers`), the credential
//! helpers it names (`docker-credential-NAME`), and Kubernetes image pull
//! Secrets (`kubernetes.io/dockerconfigjson`), which hold the same format.

pub mod docker_config;
pub mod helper;

pub use docker_config::{
    DockerConfigError, EntryError, Found, SettingError, credentials, credentials_for_image,
    credentials_from_docker_config, credentials_from_pull_secret, find_credentials,
};
