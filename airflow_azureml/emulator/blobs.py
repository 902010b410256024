"""The workspace's storage account, as the SDK's code upload reaches it: Azure Blob REST, path-style.

``startPendingUpload`` (``emulator.codes``) hands out a container-level SAS URL, and azure-ai-ml's
``BlobStorageClient`` (azure-storage-blob) uploads a code folder there. It sends exactly these requests,
so they are all this module serves:

- Get Blob Properties (``HEAD``) of the folder's first file: is it uploaded and confirmed already?
- Put Blob (``PUT`` with ``x-ms-blob-type: BlockBlob``), ``If-None-Match: *`` unless it overwrites a
  partial upload, ``Content-MD5`` for a non-empty file; Put Block / Put Block List for a file above the
  client's single-put size (64 MiB);
- Set Blob Metadata (``PUT ?comp=metadata``): the upload confirmation on the first file;
- Get Blob (``GET``, ``x-ms-range``), used by ``ml_client.code.download``.

An IP host makes azure-storage-blob address blobs path-style, ``http://127.0.0.1:<port>/<account>/<container>/<blob>``,
as it does for Azurite. Served over plain HTTP on its own port, as Azurite is by default: the SDK builds
its storage client from the SAS URL alone, without MLClient's ``connection_verify``, so it would refuse
the emulator's self-signed certificate. Status codes, error codes and headers follow the Blob service
REST reference ("Put Blob", "Get Blob Properties", "Set Blob Metadata", "Put Block", "Put Block List",
"Blob service error codes"). Every request needs a service SAS signed with the account's key, checked as
Azure Storage checks one ("Create a service SAS"): ``sig`` is base64(HMAC-SHA256(key, string-to-sign)),
recomputed from the request's own fields and path, so no signed field can be changed or dropped; the
time window (``st``, ``se``), the protocol (``spr``), the IP range (``sip``) and the permissions (``sp``)
are then enforced. The key never leaves the emulator (Azure hands it out only through listKeys or a
datastore's listSecrets, which the emulator does not serve).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import ipaddress
import re
import secrets
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import format_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

ACCOUNT = "emulatorstore"  # the workspace's storageAccount (routes.workspace_json)
SERVICE_VERSION = "2025-11-05"  # x-ms-version the service answers with
SAS_PERMISSIONS = "rwl"  # swagger BlobReferenceForConsumptionDto: "Container level read, write, list SAS"
SAS_LIFETIME = dt.timedelta(hours=1)
#: Storage service versions whose service SAS string-to-sign is the one below (2020-12-06 and later, as
#: azure-storage-blob 12.31.1 lists them in ``_serialize._SUPPORTED_API_VERSIONS``). An earlier version
#: signs other fields; the emulator does not check those and refuses them (least convenient case).
SAS_VERSIONS = frozenset(
    {
        "2020-12-06", "2021-02-12", "2021-04-10", "2021-06-08", "2021-08-06", "2021-12-02", "2022-11-02",
        "2023-01-03", "2023-05-03", "2023-08-03", "2023-11-03", "2024-05-04", "2024-08-04", "2024-11-04",
        "2025-01-05", "2025-05-05", "2025-07-05", "2025-11-05", "2026-02-06", "2026-04-06", "2026-06-06",
        "2026-10-06",
    }
)  # fmt: skip
#: The signed resources the emulator's blob SAS may name: a container, or one blob.
SAS_RESOURCES = ("c", "b")
#: The protocols a SAS may allow (``spr``): HTTPS only, or both; nothing else is a valid SAS.
SAS_PROTOCOLS = ("https", "https,http")
#: The fields of a user delegation SAS (signed with a user delegation key, never with the account key).
USER_DELEGATION_FIELDS = ("skoid", "sktid", "skt", "ske", "sks", "skv")
_MESSAGES = {
    "BlobNotFound": "The specified blob does not exist.",
    "ContainerNotFound": "The specified container does not exist.",
    "BlobAlreadyExists": "The specified blob already exists.",
    "Md5Mismatch": "The MD5 value specified in the request did not match with the MD5 value calculated by the server.",
    "InvalidBlockList": "The specified block list is invalid.",
    "InvalidUri": "The requested URI does not represent any resource on the server.",
    "AuthenticationFailed": "Server failed to authenticate the request. Make sure the value of Authorization "
    "header is formed correctly including the signature.",
    "AuthorizationPermissionMismatch": "This request is not authorized to perform this operation using this "
    "permission.",
    "PublicAccessNotPermitted": "Public access is not permitted on this storage account.",
    "UnsupportedHttpVerb": "The resource doesn't support specified Http Verb.",
    "InvalidRange": "The range specified is invalid for the current size of the resource.",
    "ConditionNotMet": "The condition specified using HTTP conditional header(s) is not met.",
    "ContainerAlreadyExists": "The specified container already exists.",
    "InvalidResourceName": "The specifed resource name contains invalid characters.",
    "InvalidAuthenticationInfo": "Server failed to authenticate the request. Please refer to the information in "
    "the www-authenticate header.",
    "AuthorizationProtocolMismatch": "This request is not authorized to perform this operation using this protocol.",
    "AuthorizationSourceIPMismatch": "This request is not authorized to perform this operation using this source IP.",
}
#: Azure Storage's OAuth resource: azure-storage-blob asks for ``https://storage.azure.com/.default``.
STORAGE_AUDIENCE = "https://storage.azure.com"


def _http_date(when: dt.datetime) -> str:
    return format_datetime(when, usegmt=True)


@dataclass
class Blob:
    path: Path  # where its bytes are
    etag: str
    created: dt.datetime
    modified: dt.datetime
    size: int
    content_md5: str  # base64, as Content-MD5 carries it
    content_type: str
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class Container:
    name: str
    expires: dt.datetime  # the expiry (``se``) of the SAS handed out with it (``BlobStore.sas_url``)
    blobs: dict[str, Blob] = field(default_factory=dict)
    blocks: dict[str, dict[str, bytes]] = field(default_factory=dict)  # blob -> uncommitted block id -> bytes


class BlobError(Exception):
    def __init__(self, status: int, code: str, detail: str = "") -> None:
        super().__init__(code)
        self.status = status
        self.code = code
        self.detail = detail  # Azure's <AuthenticationErrorDetail>: why a SAS was refused


def sas_string_to_sign(fields: dict[str, str], resource: str) -> str:
    """The string-to-sign of a service SAS, version 2020-12-06 and later ("Create a service SAS")."""
    names = ("sp", "st", "se", "", "si", "sip", "spr", "sv", "sr", "snapshot", "ses")
    values = [resource if not n else fields.get(n, "") for n in names]
    values += [fields.get(n, "") for n in ("rscc", "rscd", "rsce", "rscl", "rsct")]
    return "\n".join(values)


def sas_signature(account_key: str, string_to_sign: str) -> str:
    """base64(HMAC-SHA256(base64-decoded account key, UTF-8 string-to-sign))."""
    digest = hmac.new(base64.b64decode(account_key), string_to_sign.encode("utf-8"), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def _sas_time(value: str) -> dt.datetime | None:
    """A SAS time: ISO 8601 UTC, ``YYYY-MM-DD``, ``...Thh:mmZ``, ``...Thh:mm:ssZ`` or with a fraction."""
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%MZ", "%Y-%m-%d"):
        text = value
        if fmt == "%Y-%m-%dT%H:%M:%S.%fZ" and "." in value:  # up to 7 fractional digits; strptime takes 6
            head, _, fraction = value[:-1].partition(".")
            text = f"{head}.{fraction[:6]}Z"
        try:
            return dt.datetime.strptime(text, fmt).replace(tzinfo=dt.timezone.utc)
        except ValueError:
            continue
    return None


def _rfc1123(when: dt.datetime) -> str:
    return when.strftime("%a, %d %b %Y %H:%M:%S GMT")


class BlobStore:
    """Containers of the workspace's storage account, their blobs under ``root/<container>/``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.containers: dict[str, Container] = {}
        self.base_url = ""  # http://127.0.0.1:<port>, set when the blob site starts
        self.tls_url = ""  # https://127.0.0.1:<port>: the same account over TLS, for bearer tokens
        self.request_log: list[dict[str, Any]] = []
        #: A bearer token's ``aud`` claim, None for a token the identity never issued or that expired.
        self.token_audience: Callable[[str], str | None] = lambda token: None
        #: Does the service principal hold a data role (Storage Blob Data Contributor) on the account?
        self.data_role: Callable[[], bool] = lambda: True
        self.challenge = ""  # the WWW-Authenticate of a 401: where to get a token, for which resource
        #: The account key every SAS is signed with (512 random bits, base64, as Azure's keys are). Kept in
        #: memory only: never in emulator.json, a response or the request log.
        self.account_key = base64.b64encode(secrets.token_bytes(64)).decode()

    # ------------------------------------------------------------------ control
    def create_container(self, name: str | None = None) -> Container:
        """A new container with a read/write/list SAS (what one ``startPendingUpload`` hands out)."""
        name = name or str(uuid.uuid4())
        container = Container(name=name, expires=dt.datetime.now(dt.timezone.utc) + SAS_LIFETIME)
        self.containers[name] = container
        (self.root / name).mkdir(parents=True, exist_ok=True)
        return container

    def container_url(self, container: Container) -> str:
        return f"{self.base_url}/{ACCOUNT}/{container.name}"

    def sas_url(self, container: Container, permissions: str = SAS_PERMISSIONS) -> str:
        """The container's SAS URL: ``sr=c``, ``sp`` ``permissions``, ``se`` the container's expiry,
        ``spr=https,http`` (the account is also served over plain HTTP), signed with the account key."""
        expiry = container.expires.strftime("%Y-%m-%dT%H:%M:%SZ")
        query = {"sv": SERVICE_VERSION, "sr": "c", "sp": permissions, "se": expiry, "spr": "https,http"}
        return f"{self.container_url(container)}?{urlencode(self.sign(query, container.name))}"

    def sign(self, fields: dict[str, str], container: str, blob: str = "") -> dict[str, str]:
        """``fields`` with their ``sig`` for ``/blob/<account>/<container>[/<blob>]``."""
        resource = f"/blob/{ACCOUNT}/{container}" + (f"/{blob}" if blob else "")
        return {**fields, "sig": sas_signature(self.account_key, sas_string_to_sign(fields, resource))}

    def folder(self, url: str) -> Path | None:
        """The local folder behind ``<base_url>/<account>/<container>/<prefix>`` (a code version's codeUri)."""
        prefix = f"{self.base_url}/{ACCOUNT}/"
        if not self.base_url or not url.startswith(prefix):
            return None
        container, _, rest = url[len(prefix) :].split("?", 1)[0].partition("/")
        if container not in self.containers:
            return None
        path = self._path(container, rest.strip("/")) if rest.strip("/") else self.root / container
        return path if path.is_dir() else None

    def blob_names(self, container: str) -> list[str]:
        return sorted(self.containers[container].blobs) if container in self.containers else []

    # ------------------------------------------------------------------ helpers
    def _path(self, container: str, name: str) -> Path:
        parts = name.split("/")
        if not name or any(p in ("", ".", "..") for p in parts):
            raise BlobError(400, "InvalidUri")
        return self.root / container / Path(*parts)

    def _authorize(self, request: web.Request, container: Container | None, permission: str) -> None:
        signature = request.query.get("sig")
        if not signature and "Authorization" not in request.headers:
            raise BlobError(409, "PublicAccessNotPermitted")
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if not signature and scheme == "Bearer":
            # Entra ID: the token must be one the identity issued for Storage; RBAC then decides (data roles)
            if request.scheme != "https":
                raise BlobError(400, "InvalidUri")  # Azure Storage takes bearer tokens over HTTPS only
            if (self.token_audience(token.strip()) or "").rstrip("/") != STORAGE_AUDIENCE:
                raise BlobError(401, "InvalidAuthenticationInfo")
            if not self.data_role():
                raise BlobError(403, "AuthorizationPermissionMismatch")
            return
        self._check_sas(request, permission)

    def _check_sas(self, request: web.Request, permission: str) -> None:
        """Azure's check of a service SAS: fields, signature, time window, protocol, IP, then permission
        (any one of the letters of ``permission``: ``"wc"`` where Create may write a new blob).

        The canonicalized resource is the request's own path (``/blob/<account>/<container>`` for
        ``sr=c``, ``.../<blob>`` for ``sr=b``), so a SAS used on another container or blob fails the
        signature, as in Azure. Refusals are ``403 AuthenticationFailed`` with Azure's detail text.
        """
        query = request.query
        fields = {k: query[k] for k in query if k != "sig"}
        for name in ("sv", "sr", "sp", "se"):  # no stored access policies here: all four must be in the URL
            if not fields.get(name):
                raise BlobError(403, "AuthenticationFailed", f"{name} is mandatory. Cannot be empty")
        if fields["sv"] not in SAS_VERSIONS:
            raise BlobError(403, "AuthenticationFailed", f"Signed version {fields['sv']} is not supported.")
        if fields["sr"] not in SAS_RESOURCES:
            raise BlobError(403, "AuthenticationFailed", f"Signed resource {fields['sr']} is not supported.")
        delegated = [name for name in USER_DELEGATION_FIELDS if name in fields]
        if delegated:  # the account's SAS are signed with its key: a user delegation field does not belong
            raise BlobError(
                403,
                "AuthenticationFailed",
                f"{delegated[0]} is a user delegation SAS field; this SAS is not signed with a user delegation key.",
            )
        container = request.match_info["container"]
        blob = request.match_info.get("blob", "") if fields["sr"] == "b" else ""
        if fields["sr"] == "b" and not blob:
            raise BlobError(403, "AuthenticationFailed", "sr=b is not valid for a container request.")
        resource = f"/blob/{request.match_info['account']}/{container}" + (f"/{blob}" if blob else "")
        string_to_sign = sas_string_to_sign(fields, resource)
        expected = sas_signature(self.account_key, string_to_sign)
        if not hmac.compare_digest(query.get("sig", "").encode(), expected.encode()):
            raise BlobError(
                403, "AuthenticationFailed", f"Signature did not match. String to sign used was {string_to_sign}"
            )
        if fields.get("si") or fields.get("ses"):  # no stored access policy, no encryption scope
            name = "si" if fields.get("si") else "ses"
            raise BlobError(403, "AuthenticationFailed", f"{name} {fields[name]} is not known to the account.")
        now = dt.datetime.now(dt.timezone.utc)
        start = _sas_time(fields["st"]) if fields.get("st") else None
        expiry = _sas_time(fields["se"])
        if expiry is None or (fields.get("st") and start is None):
            raise BlobError(403, "AuthenticationFailed", "Signature fields not well formed.")
        if (start is not None and now < start) or now >= expiry:
            shown = f"Start [{_rfc1123(start)}] - " if start is not None else ""
            raise BlobError(
                403,
                "AuthenticationFailed",
                f"Signature not valid in the specified time frame: {shown}Expiry [{_rfc1123(expiry)}] - "
                f"Current [{_rfc1123(now)}]",
            )
        if fields.get("spr") and fields["spr"] not in SAS_PROTOCOLS:
            raise BlobError(403, "AuthenticationFailed", f"Signed protocol {fields['spr']} is not https or https,http.")
        if request.scheme not in (fields.get("spr") or "https,http").split(","):
            raise BlobError(403, "AuthorizationProtocolMismatch")
        if fields.get("sip") and not _ip_allowed(fields["sip"], request.remote or ""):
            raise BlobError(403, "AuthorizationSourceIPMismatch")
        if not set(permission) & set(fields["sp"]):  # any one of the letters of ``permission`` will do
            raise BlobError(403, "AuthorizationPermissionMismatch")

    def _store(self, container: Container, name: str, data: bytes, request: web.Request) -> Blob:
        path = self._path(container.name, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        now = dt.datetime.now(dt.timezone.utc)
        old = container.blobs.get(name)
        blob = Blob(
            path=path,
            etag=f'"0x{uuid.uuid4().hex[:15].upper()}"',
            created=old.created if old else now,
            modified=now,
            size=len(data),
            content_md5=base64.b64encode(hashlib.md5(data).digest()).decode(),
            content_type=request.headers.get("x-ms-blob-content-type") or "application/octet-stream",
            metadata=_metadata(request),
        )
        container.blobs[name] = blob
        return blob

    # ------------------------------------------------------------------ operations
    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.match_info["account"] != ACCOUNT:
            # another account's host name would not even resolve; an unknown one here is a 400
            raise BlobError(400, "InvalidUri")
        container = self.containers.get(request.match_info["container"])
        name = request.match_info.get("blob", "")
        if not name:
            return self._container_operation(request, container)
        comp = request.query.get("comp")
        if request.method == "HEAD":
            self._authorize(request, container, "r")
            blob = self._blob(container, name)
            _read_condition(request, blob)
            return _overridden(request, self._properties(blob, head=True))
        if request.method == "GET":
            self._authorize(request, container, "r")
            blob = self._blob(container, name)
            _read_condition(request, blob)
            return _overridden(request, self._download(request, blob))
        if request.method != "PUT":
            if request.method == "DELETE":
                self._authorize(request, container, "d")
            raise BlobError(405, "UnsupportedHttpVerb")
        # Create (c) writes a new blob (Put Blob, Put Block, Put Block List); an existing blob needs Write (w)
        new_blob = comp in (None, "block", "blocklist") and (container is None or name not in container.blobs)
        self._authorize(request, container, "wc" if new_blob else "w")
        if container is None:
            raise BlobError(404, "ContainerNotFound")
        body = await request.read()
        if comp == "metadata":
            blob = self._blob(container, name)
            blob.metadata = _metadata(request)
            blob.modified = dt.datetime.now(dt.timezone.utc)
            blob.etag = f'"0x{uuid.uuid4().hex[:15].upper()}"'
            return self._answer(200, {**_stamp(blob), "x-ms-request-server-encrypted": "true"})
        if comp == "block":
            _check_md5(request, body)
            block_id = request.query.get("blockid", "")
            if not block_id:
                raise BlobError(400, "InvalidUri")
            self._path(container.name, name)
            container.blocks.setdefault(name, {})[block_id] = body
            headers = {"Content-MD5": _md5(body), "x-ms-request-server-encrypted": "true"}
            return self._answer(201, headers)
        if comp == "blocklist":
            self._precondition(request, container, name)
            staged = container.blocks.get(name, {})
            try:
                ids = [el.text or "" for el in ET.fromstring(body)]
            except ET.ParseError:
                raise BlobError(400, "InvalidBlockList") from None
            if any(i not in staged for i in ids):
                raise BlobError(400, "InvalidBlockList")
            blob = self._store(container, name, b"".join(staged[i] for i in ids), request)
            if request.headers.get("x-ms-blob-content-md5"):
                blob.content_md5 = request.headers["x-ms-blob-content-md5"]
            container.blocks.pop(name, None)
            return self._answer(201, {**_stamp(blob), "x-ms-request-server-encrypted": "true"})
        if comp is not None:
            raise BlobError(400, "InvalidUri")
        if request.headers.get("x-ms-blob-type") != "BlockBlob":
            raise BlobError(400, "InvalidUri")
        _check_md5(request, body)
        self._precondition(request, container, name)
        blob = self._store(container, name, body, request)
        headers = {**_stamp(blob), "Content-MD5": blob.content_md5, "x-ms-request-server-encrypted": "true"}
        return self._answer(201, headers)

    def _precondition(self, request: web.Request, container: Container, name: str) -> None:
        """A write's conditional headers ("Specifying conditional headers for Blob service operations")."""
        blob = container.blobs.get(name)
        if request.headers.get("If-None-Match") == "*" and blob is not None:
            raise BlobError(409, "BlobAlreadyExists")
        wanted = request.headers.get("If-Match")
        if wanted is not None and wanted != "*" and (blob is None or blob.etag != wanted):
            raise BlobError(412, "ConditionNotMet")  # a blob that is gone matches no ETag either
        if wanted == "*" and blob is None:
            raise BlobError(412, "ConditionNotMet")

    def _container_operation(self, request: web.Request, container: Container | None) -> web.Response:
        """Create Container (``PUT ?restype=container``): what an Entra identity with a data role may do."""
        if request.method != "PUT" or request.query.get("restype") != "container":
            raise BlobError(400, "InvalidUri")
        if "Authorization" not in request.headers or request.query.get("sig"):
            raise BlobError(403, "AuthorizationPermissionMismatch")  # the emulator's SAS are container-level
        self._authorize(request, container, "w")
        if container is not None:
            raise BlobError(409, "ContainerAlreadyExists")
        name = request.match_info["container"]
        if not re.fullmatch(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]", name):
            raise BlobError(400, "InvalidResourceName")
        created = self.create_container(name)
        created.expires = dt.datetime.max.replace(tzinfo=dt.timezone.utc)  # no SAS of it is ever handed out
        stamp = {
            "ETag": f'"0x{uuid.uuid4().hex[:15].upper()}"',
            "Last-Modified": _http_date(dt.datetime.now(dt.timezone.utc)),
        }
        return self._answer(201, stamp)

    def _blob(self, container: Container | None, name: str) -> Blob:
        if container is None:
            raise BlobError(404, "ContainerNotFound")
        self._path(container.name, name)
        blob = container.blobs.get(name)
        if blob is None:
            raise BlobError(404, "BlobNotFound")
        return blob

    def _properties(self, blob: Blob, *, head: bool) -> web.Response:
        headers = {
            **_stamp(blob),
            "x-ms-creation-time": _http_date(blob.created),
            "x-ms-blob-type": "BlockBlob",
            "Content-Type": blob.content_type,
            "Content-MD5": blob.content_md5,
            "Accept-Ranges": "bytes",
            "x-ms-lease-status": "unlocked",
            "x-ms-lease-state": "available",
            "x-ms-server-encrypted": "true",
            **{f"x-ms-meta-{k}": v for k, v in blob.metadata.items()},
        }
        if head:
            headers["x-ms-access-tier"] = "Hot"
            headers["x-ms-access-tier-inferred"] = "true"
            headers["Content-Length"] = str(blob.size)
        return self._answer(200, headers)

    def _download(self, request: web.Request, blob: Blob) -> web.Response:
        data = blob.path.read_bytes()
        wanted = request.headers.get("x-ms-range") or request.headers.get("Range")
        response = self._properties(blob, head=False)
        if not wanted:
            response.body = data
            return response
        try:
            start_text, _, end_text = wanted.split("=", 1)[1].partition("-")
            start = int(start_text)
            end = min(int(end_text) if end_text else len(data) - 1, len(data) - 1)
        except (IndexError, ValueError):
            start, end = 0, len(data) - 1
        if start >= len(data) and len(data) > 0:
            raise BlobError(416, "InvalidRange")
        response.set_status(206)
        response.headers["Content-Range"] = f"bytes {start}-{max(end, start)}/{len(data)}"
        response.headers.pop("Content-MD5", None)  # the blob's MD5 is not the range's
        response.body = data[start : end + 1]
        return response

    def _answer(self, status: int, headers: dict[str, str]) -> web.Response:
        return web.Response(status=status, headers={**_common(), **headers})


_OVERRIDES = {
    "rscc": "Cache-Control",
    "rscd": "Content-Disposition",
    "rsce": "Content-Encoding",
    "rscl": "Content-Language",
    "rsct": "Content-Type",
}


def _overridden(request: web.Request, response: web.Response) -> web.Response:
    """A read through a SAS answers with the response headers the SAS signed (``rscc`` ... ``rsct``)."""
    if request.query.get("sig"):
        for key, header in _OVERRIDES.items():
            if request.query.get(key):
                response.headers[header] = request.query[key]
    return response


def _ip_allowed(allowed: str, remote: str) -> bool:
    """``sip``: one address or a range ``a-b``."""
    try:
        low, _, high = allowed.partition("-")
        address = ipaddress.ip_address(remote)
        return ipaddress.ip_address(low) <= address <= ipaddress.ip_address(high or low)
    except ValueError:
        return False


def _read_condition(request: web.Request, blob: Blob) -> None:
    wanted = request.headers.get("If-Match")
    if wanted is not None and wanted not in ("*", blob.etag):
        raise BlobError(412, "ConditionNotMet")


def _common() -> dict[str, str]:
    return {
        "x-ms-request-id": str(uuid.uuid4()),
        "x-ms-version": SERVICE_VERSION,
        "Date": _http_date(dt.datetime.now(dt.timezone.utc)),
        "Server": "Windows-Azure-Blob/1.0 Microsoft-HTTPAPI/2.0",
    }


def _stamp(blob: Blob) -> dict[str, str]:
    return {"ETag": blob.etag, "Last-Modified": _http_date(blob.modified)}


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def _check_md5(request: web.Request, body: bytes) -> None:
    sent = request.headers.get("Content-MD5")
    if sent is not None and sent != _md5(body):
        raise BlobError(400, "Md5Mismatch")


def _metadata(request: web.Request) -> dict[str, str]:
    return {k[len("x-ms-meta-") :]: v for k, v in request.headers.items() if k.lower().startswith("x-ms-meta-")}


def error_response(exc: BlobError, method: str, challenge: str = "") -> web.Response:
    """The Blob service's error: ``x-ms-error-code`` always, and an XML body except for ``HEAD``.

    A 401 carries the bearer challenge (``authorization_uri``, ``resource_id``) that azure-storage-blob reads.
    """
    headers = {**_common(), "x-ms-error-code": exc.code}
    if exc.status == 401 and challenge:
        headers["WWW-Authenticate"] = challenge
    if method == "HEAD":
        return web.Response(status=exc.status, headers=headers)
    request_id = headers["x-ms-request-id"]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.0000000Z", time.gmtime())
    message = f"{_MESSAGES.get(exc.code, exc.code)}\nRequestId:{request_id}\nTime:{stamp}"
    root = ET.Element("Error")
    ET.SubElement(root, "Code").text = exc.code
    ET.SubElement(root, "Message").text = message
    if exc.detail:
        ET.SubElement(root, "AuthenticationErrorDetail").text = exc.detail
    body = b'\xef\xbb\xbf<?xml version="1.0" encoding="utf-8"?>' + ET.tostring(root)
    return web.Response(status=exc.status, headers=headers, body=body, content_type="application/xml")


def blob_app(store: BlobStore, request_log: list[dict[str, Any]]) -> web.Application:
    """The storage account's HTTP app; its requests also go to the emulator's request log."""

    @web.middleware
    async def log(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        entry: dict[str, Any] = {
            "t": time.time(),
            "method": request.method,
            "path": request.path,
            "query": {k: v for k, v in request.query.items() if k != "sig"},  # a SAS signature is a secret
            "ua": request.headers.get("User-Agent", ""),
            "plane": "blob",
        }
        request_log.append(entry)
        store.request_log.append(entry)
        try:
            response = await handler(request)
        except BlobError as exc:
            response = error_response(exc, request.method, store.challenge)
        except web.HTTPException as exc:
            response = error_response(BlobError(exc.status, "InvalidUri"), request.method)
        entry["status"] = response.status
        return response

    app = web.Application(middlewares=[log], client_max_size=256 * 1024**2)
    app.router.add_route("*", "/{account}/{container}/{blob:.+}", store.handle)
    app.router.add_route("*", "/{account}/{container}", store.handle)
    return app
