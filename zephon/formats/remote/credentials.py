"""Where S3 requests go and which credentials sign them, as users set them (never printing a secret).

Endpoint, first set wins: ``S3_ENDPOINT_URL`` (mosaicml-streaming's variable), ``AWS_ENDPOINT_URL_S3``, then
``AWS_ENDPOINT_URL`` (boto3's), else boto3's own choice (a profile's ``endpoint_url`` or AWS). Credentials:
boto3's standard chain (environment, shared credentials file and profile, config file, SSO, container and
instance roles); with none found, requests go unsigned (public buckets). Region: boto3's, else ``us-east-1``.
``describe_credentials`` names the source for error messages: the chain's method, the profile or file, and
the access key id shortened to its last four characters.
"""
from __future__ import annotations

import os

ENDPOINT_VARIABLES = ("S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
DEFAULT_REGION = "us-east-1"

# botocore's names for where credentials came from -> words for a message
_METHODS = {
    "env": "environment variables AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY",
    "shared-credentials-file": "the shared credentials file",
    "config-file": "the AWS config file",
    "iam-role": "the instance's IAM role (instance metadata)",
    "container-role": "the container's IAM role",
    "assume-role": "an assumed role (AWS config file)",
    "assume-role-with-web-identity": "a web identity token (AWS_WEB_IDENTITY_TOKEN_FILE)",
    "sso": "AWS SSO",
    "custom-process": "a credential_process",
    "explicit": "explicit keys",
}


def s3_endpoint() -> tuple[str | None, str]:
    """``(endpoint URL or None, where it came from)`` for s3:// requests (read from the environment now)."""
    for var in ENDPOINT_VARIABLES:
        v = os.environ.get(var)
        if v:
            return v, f"${var}"
    return None, "boto3's default"


def _mask(key_id: str | None) -> str:
    return f"...{key_id[-4:]}" if key_id and len(key_id) > 4 else "(hidden)"


def s3_session():
    """``(boto3 Session, credentials or None, description)``: the standard chain, resolved once."""
    import boto3

    session = boto3.Session()
    creds = session.get_credentials()
    return session, creds, describe_credentials(session, creds)


def describe_credentials(session, creds) -> str:
    """Words naming where ``creds`` came from (method, profile, file, key id's last 4 characters)."""
    if creds is None:
        return ("no credentials found by boto3's chain (environment, ~/.aws/credentials, config file, "
                "instance role): requests are unsigned")
    method = getattr(creds, "method", None) or "unknown"
    where = _METHODS.get(method, f"boto3 credential source {method!r}")
    if method in ("shared-credentials-file", "config-file", "assume-role"):
        var = "AWS_SHARED_CREDENTIALS_FILE" if method == "shared-credentials-file" else "AWS_CONFIG_FILE"
        default = "~/.aws/credentials" if method == "shared-credentials-file" else "~/.aws/config"
        where += f" {os.environ.get(var, default)}, profile {session.profile_name!r}"
    try:
        key_id = creds.access_key
    except Exception:  # refreshable credentials may fail to refresh here: the request will say why
        key_id = None
    return f"{where} (access key id {_mask(key_id)})"


def endpoint_words() -> str:
    """The endpoint in use and its source, for messages (e.g. ``http://127.0.0.1:5000 from $S3_ENDPOINT_URL``)."""
    ep, src = s3_endpoint()
    return f"{ep} from {src}" if ep else "AWS's default endpoint"
