"""Calls a Crossplane v1 function (apiextensions.fn.proto.v1
FunctionRunnerService/RunFunction) with grpcio (grpc-core) and prints the
outcome as one JSON object: {"code": "OK" or a status code name, "details":
the status message, "response": the RunFunctionResponse as protojson, or
null}.

The request is protojson on stdin. Over h2c (no --ca) the call carries
--authority as its :authority; over mTLS (--ca, --cert, --key) the TLS server
name (SNI, and the name the server's certificate is verified for) is
--server-name, and :authority is --authority. The stubs are generated from
fnrun's protos; they must be on PYTHONPATH.
"""

import argparse
import json
import sys

import grpc
from google.protobuf import json_format

from apiextensions.fn.proto.v1 import run_function_pb2 as pb
from apiextensions.fn.proto.v1 import run_function_pb2_grpc as pb_grpc


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True, help="HOST:PORT")
    parser.add_argument("--authority", required=True)
    parser.add_argument("--ca", help="PEM CA the server's certificate must chain to")
    parser.add_argument("--cert", help="PEM client certificate")
    parser.add_argument("--key", help="PEM key of --cert")
    parser.add_argument("--server-name", help="TLS server name")
    parser.add_argument("--timeout", type=float, default=60)
    args = parser.parse_args()
    request = json_format.Parse(sys.stdin.read(), pb.RunFunctionRequest())

    options = [("grpc.default_authority", args.authority)]
    if args.ca:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=read(args.ca),
            private_key=read(args.key) if args.key else None,
            certificate_chain=read(args.cert) if args.cert else None,
        )
        options.append(("grpc.ssl_target_name_override", args.server_name))
        channel = grpc.secure_channel(args.target, credentials, options=options)
    else:
        channel = grpc.insecure_channel(args.target, options=options)
    with channel:
        stub = pb_grpc.FunctionRunnerServiceStub(channel)
        try:
            response = stub.RunFunction(request, timeout=args.timeout)
            result = {
                "code": "OK",
                "details": "",
                "response": json.loads(json_format.MessageToJson(response)),
            }
        except grpc.RpcError as e:
            result = {"code": e.code().name, "details": e.details() or "", "response": None}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
