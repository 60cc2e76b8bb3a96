//! Compiles the v1alpha1 proto with protox (pure Rust, no `protoc` needed on the
//! build machine) and generates the tonic client and server.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/apiextensions/fn/proto/v1alpha1/run_function.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;

    // The encoded descriptor set is kept for gRPC server reflection.
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("v1alpha1_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
