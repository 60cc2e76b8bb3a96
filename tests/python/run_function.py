"""Calls fnrun's RunFunction with grpcio (grpc-core) and prints the outcome as
one JSON object: {"code": "OK" or a status code name, "details": the status
message, "output": the output FunctionIO}.

The channel is the library's own for TARGET (unix:PATH, unix-abstract:NAME or
HOST:PORT), with its default :authority: the socket's path, percent-encoded, or
its name. The stubs are generated from fnrun's protos; they must be on
PYTHONPATH.
"""

import argparse
import json
import sys

import grpc

from apiextensions.fn.proto.v1alpha1 import run_function_pb2 as pb
from apiextensions.fn.proto.v1alpha1 import run_function_pb2_grpc as pb_grpc


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--input", default="-", help="FunctionIO file, - for stdin")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    if args.input == "-":
        data = sys.stdin.buffer.read()
    else:
        with open(args.input, "rb") as f:
            data = f.read()

    options = [
        ("grpc.max_send_message_length", 64 << 20),
        ("grpc.max_receive_message_length", 128 << 20),
    ]
    with grpc.insecure_channel(args.target, options=options) as channel:
        stub = pb_grpc.ContainerizedFunctionRunnerServiceStub(channel)
        request = pb.RunFunctionRequest(image=args.image, input=data)
        try:
            response = stub.RunFunction(request, timeout=args.timeout)
            result = {
                "code": "OK",
                "details": "",
                "output": response.output.decode("utf-8", "replace"),
            }
        except grpc.RpcError as e:
            result = {"code": e.code().name, "details": e.details() or "", "output": ""}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
