"""Asks fnrun's server reflection, with grpcio-reflection's client (which
speaks grpc.reflection.v1alpha), for its services and for the file that
defines SYMBOL, and prints them as one JSON object: {"services": [...],
"file": {"name", "package", "services": {service: [methods]}}}.
"""

import argparse
import json
import sys

import grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--symbol", required=True)
    args = parser.parse_args()
    with grpc.insecure_channel(args.target) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = list(database.get_services())
        file = database.FindFileContainingSymbol(args.symbol)
    json.dump(
        {
            "services": services,
            "file": {
                "name": file.name,
                "package": file.package,
                "services": {s.name: [m.name for m in s.method] for s in file.service},
            },
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
