//! Server reflection for a listener's services, in both versions that
//! clients speak: v1, and v1alpha (grpcio-reflection, grpc_cli, older
//! grpcurl). Each version lists the services of both, and health.

use anyhow::Context;
use tonic_reflection::pb;
use tonic_reflection::server::{Builder, v1, v1alpha};

/// The v1 and v1alpha reflection services describing `sets` (encoded
/// `FileDescriptorSet`s of the listener's own services).
pub fn services(
    sets: &[&'static [u8]],
) -> anyhow::Result<(
    v1::ServerReflectionServer<impl v1::ServerReflection>,
    v1alpha::ServerReflectionServer<impl v1alpha::ServerReflection>,
)> {
    let builder = || {
        sets.iter().fold(
            Builder::configure()
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET),
            |builder, set| builder.register_encoded_file_descriptor_set(set),
        )
    };
    // Each builder registers its own version's descriptor; the other's is added.
    let v1 = builder()
        .register_encoded_file_descriptor_set(pb::v1alpha::FILE_DESCRIPTOR_SET)
        .build_v1()
        .context("build the reflection service (v1)")?;
    let v1alpha = builder()
        .register_encoded_file_descriptor_set(pb::v1::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .context("build the reflection service (v1alpha)")?;
    Ok((v1, v1alpha))
}
