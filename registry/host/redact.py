"""Secrets never printed: credentials in URLs are redacted in every message.

A database URL (``postgresql+psycopg://admin:S3cret@db/registry``), a store
URL with a user and password, or a presigned URL's signature can reach an
error message, a log line, ``--json`` output or a web page through any
exception that quotes it. :func:`redact` is applied where text leaves the
registry (the CLI's output helper, the web server's error documents, the
index's messages), so a message built anywhere is covered.
"""

from __future__ import annotations

import re

#: ``scheme://user:password@`` (the password is everything up to the last ``@``
#: of the authority, as URL parsers read it)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^/@:\s'\"]*):"
                       r"(?P<secret>[^/\s'\"]*)@(?=[^@/\s'\"]*(?:[/\s'\"]|$))")
#: query parameters that carry secrets (presigned URLs, tokens, passwords)
_PARAMS = re.compile(r"(?P<name>[?&;](?:password|passwd|pwd|secret|token|access_token|"
                     r"sig|signature|X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|"
                     r"sas)=)(?P<value>[^&#\s'\"]+)", re.IGNORECASE)
MASK = "***"


def redact(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` URL
    and the value of secret-carrying query parameters replaced by ``***``."""
    if "://" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    return _PARAMS.sub(lambda m: f"{m['name']}{MASK}", text)
