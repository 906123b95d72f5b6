"""A moto S3 server with authentication on (run as a process): any request
signed with keys moto does not know answers 403 InvalidAccessKeyId, as a real
server does for wrong credentials. Prints its endpoint, then serves until
stdin closes."""

import os
import sys

os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"  # read by moto at import

from tests.support.s3server import S3Server  # noqa: E402

if __name__ == "__main__":
    server = S3Server(serialize=True).start()
    print(server.endpoint, flush=True)
    sys.stdin.read()
    server.stop()
