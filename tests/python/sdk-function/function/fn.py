"""What the function does: it annotates the desired composite resource with
the SDK's version and adds one Normal result that says so. Everything else in
the desired state, the tag and the context pass through (response.to)."""

import importlib.metadata
import platform

import grpc
from crossplane.function import logging, resource, response
from crossplane.function.proto.v1 import run_function_pb2 as fnv1
from crossplane.function.proto.v1 import run_function_pb2_grpc as grpcv1

NAME = "function-python-sdk"
ANNOTATION = "fnrun.dev/python-sdk"


class FunctionRunner(grpcv1.FunctionRunnerServiceServicer):
    """Runs the function for v1 requests; the SDK serves v1beta1 through it."""

    def __init__(self):
        self.log = logging.get_logger()
        self.sdk = importlib.metadata.version("crossplane-function-sdk-python")

    async def RunFunction(  # noqa: N802  (gRPC's name)
        self, req: fnv1.RunFunctionRequest, _: grpc.aio.ServicerContext
    ) -> fnv1.RunFunctionResponse:
        log = self.log.bind(tag=req.meta.tag)
        rsp = response.to(req)

        observed = resource.struct_to_dict(req.observed.composite.resource)
        kind = observed.get("kind", "composite resource")
        name = observed.get("metadata", {}).get("name", "")

        desired = resource.struct_to_dict(rsp.desired.composite.resource)
        metadata = desired.get("metadata") or {}
        metadata["annotations"] = {
            **(metadata.get("annotations") or {}),
            ANNOTATION: self.sdk,
        }
        resource.update(rsp.desired.composite, {"metadata": metadata})

        response.normal(
            rsp,
            f"{NAME}: annotated {kind} {name} with {ANNOTATION}={self.sdk} "
            f"(Python {platform.python_version()}); "
            f"{len(rsp.desired.resources)} desired composed resources",
        )
        log.info("annotated the composite resource", name=name)
        return rsp
