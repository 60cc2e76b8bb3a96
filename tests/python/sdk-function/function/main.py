"""The function's command line: the SDK's standard options (--insecure,
--address, --tls-certs-dir or $TLS_SERVER_CERTS_DIR, --debug and the message
size limits), then the SDK's gRPC server, as the SDK's function template does.
"""

import click
from crossplane.function import cli as sdkcli

from function import fn


@click.command()
@sdkcli.standard_options
def cli(**kwargs):
    """Serve the function over gRPC."""
    sdkcli.run(fn.FunctionRunner(), **kwargs)


if __name__ == "__main__":
    cli()
