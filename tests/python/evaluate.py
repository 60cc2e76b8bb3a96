"""Calls Porch's evaluator.FunctionEvaluator/EvaluateFunction with grpcio
(grpc-core) and prints the outcome as one JSON object: {"code": "OK" or a
status code name, "details": the status message, "resource_list": the output,
"log": the function's log}.

TARGET is the library's own (unix:PATH, unix-abstract:NAME or HOST:PORT), with
its default :authority. The stubs are generated from fnrun's protos; they must
be on PYTHONPATH.
"""

import argparse
import json
import sys

import grpc

from evaluator import evaluator_pb2 as pb
from evaluator import evaluator_pb2_grpc as pb_grpc


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--tag", default="")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    resource_list = sys.stdin.buffer.read()

    with grpc.insecure_channel(args.target) as channel:
        stub = pb_grpc.FunctionEvaluatorStub(channel)
        request = pb.EvaluateFunctionRequest(
            resource_list=resource_list, image=args.image, Tag=args.tag
        )
        try:
            response = stub.EvaluateFunction(request, timeout=args.timeout)
            result = {
                "code": "OK",
                "details": "",
                "resource_list": response.resource_list.decode("utf-8", "replace"),
                "log": response.log.decode("utf-8", "replace"),
            }
        except grpc.RpcError as e:
            result = {
                "code": e.code().name,
                "details": e.details() or "",
                "resource_list": "",
                "log": "",
            }
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
