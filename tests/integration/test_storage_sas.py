"""The storage account's service SAS, checked as Azure Storage checks it (issue 19 §2).

``sig`` is base64(HMAC-SHA256(account key, string-to-sign)), and the string-to-sign of a service SAS of
version 2020-12-06 and later is the newline-joined fields ``sp, st, se, canonicalizedResource, si, sip,
spr, sv, sr, snapshot, ses, rscc, rscd, rsce, rscl, rsct`` (Microsoft Learn, "Create a service SAS").
So a SAS whose ``sp``, ``se``, ``sv`` or ``sr`` was changed, or one used on another container, no longer
matches its signature; an expired one (``se`` in the past) is refused even though it does. Each is
``403 AuthenticationFailed`` with Azure's XML error body; a missing permission is
``403 AuthorizationPermissionMismatch``. The signer below is this test's own copy of the documented
algorithm; azure-storage-blob's ``generate_container_sas`` is the second, independent one.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
import requests

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.blobs import ACCOUNT

FIELDS = ("sp", "st", "se", "resource", "si", "sip", "spr", "sv", "sr", "snapshot", "ses")
OVERRIDES = ("rscc", "rscd", "rsce", "rscl", "rsct")


def sign(key: str, container: str, query: dict[str, str], blob: str = "") -> str:
    """The documented service SAS signature (version 2020-12-06 and later)."""
    resource = f"/blob/{ACCOUNT}/{container}" + (f"/{blob}" if blob else "")
    values = {**query, "resource": resource}
    string_to_sign = "\n".join(values.get(name, "") for name in (*FIELDS, *OVERRIDES))
    digest = hmac.new(base64.b64decode(key), string_to_sign.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def stamp(when: dt.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def signed_url(emulator: Emulator, container: str, blob: str = "", **query: str) -> str:
    store = emulator.workspace.blobs
    fields = {"sv": "2025-11-05", "sr": "b" if blob else "c", "sp": "rw", "spr": "https,http", **query}
    fields.setdefault("se", stamp(dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)))
    fields["sig"] = sign(store.account_key, container, fields, blob)
    return f"{store.base_url}/{ACCOUNT}/{container}" + (f"/{blob}" if blob else "") + "?" + urlencode(fields)


def tamper(url: str, **changes: str | None) -> str:
    """``url`` with query parameters changed (``None``: removed), its ``sig`` kept."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    for key, value in changes.items():
        if value is None:
            query.pop(key, None)
        else:
            query[key] = value
    return urlunsplit(parts._replace(query=urlencode(query)))


def put(url: str, blob: str, data: bytes = b"data") -> requests.Response:
    base, _, query = url.partition("?")
    return requests.put(
        f"{base}/{blob}?{query}", data=data, headers={"x-ms-blob-type": "BlockBlob", "x-ms-version": "2025-11-05"}
    )


def error_code(response: requests.Response) -> str:
    code = ET.fromstring(response.content.decode("utf-8-sig")).findtext("Code")
    assert code == response.headers["x-ms-error-code"]
    return code or ""


@pytest.fixture
def container(emulator: Emulator) -> Any:
    store = emulator.workspace.blobs
    return emulator.call(lambda: store.create_container())


def test_the_sas_the_emulator_issues_works_with_azure_storage_blob(emulator: Emulator, container: Any) -> None:
    from azure.storage.blob import ContainerClient

    store = emulator.workspace.blobs
    client = ContainerClient.from_container_url(store.sas_url(container))
    client.upload_blob("a/b.txt", b"hello")
    assert client.download_blob("a/b.txt").readall() == b"hello"
    assert client.get_blob_client("a/b.txt").get_blob_properties().size == 5


def test_a_sas_signed_with_the_account_key_by_azure_storage_blob_works(emulator: Emulator, container: Any) -> None:
    """azure-storage-blob's own signer (``generate_container_sas``) agrees with the emulator's check."""
    from azure.storage.blob import ContainerClient, ContainerSasPermissions, generate_container_sas

    store = emulator.workspace.blobs
    token = generate_container_sas(
        ACCOUNT,
        container.name,
        account_key=store.account_key,
        permission=ContainerSasPermissions(read=True, write=True),
        expiry=dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5),
        protocol="https,http",
    )
    client = ContainerClient.from_container_url(f"{store.container_url(container)}?{token}")
    client.upload_blob("x.bin", b"\x00\x01")
    assert client.download_blob("x.bin").readall() == b"\x00\x01"


def test_a_valid_sas_works(emulator: Emulator, container: Any) -> None:
    url = signed_url(emulator, container.name)
    assert put(url, "ok.txt").status_code == 201
    blob_url = signed_url(emulator, container.name, "ok.txt", sp="r")
    assert requests.get(blob_url).content == b"data"


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"sp": "rwd"}, id="tampered-sp"),
        pytest.param({"se": "2099-01-01T00:00:00Z"}, id="tampered-se"),
        pytest.param({"sv": "2021-06-08"}, id="tampered-sv"),
        pytest.param({"sr": "b"}, id="tampered-sr"),
        pytest.param({"se": None}, id="stripped-se"),
        pytest.param({"sv": None}, id="stripped-sv"),
        pytest.param({"sr": None}, id="stripped-sr"),
        pytest.param({"sp": None}, id="stripped-sp"),
        pytest.param({"spr": "https"}, id="tampered-spr"),
        pytest.param({"st": "2020-01-01T00:00:00Z"}, id="added-st"),
    ],
)
def test_a_tampered_or_stripped_sas_is_refused(emulator: Emulator, container: Any, changes: dict[str, Any]) -> None:
    url = tamper(emulator.workspace.blobs.sas_url(container), **changes)
    response = put(url, "evil.txt")
    assert response.status_code == 403, response.text
    assert error_code(response) == "AuthenticationFailed"
    assert "evil.txt" not in emulator.call(lambda: emulator.workspace.blobs.blob_names(container.name))


def test_the_emulators_own_sas_tampered_is_refused_by_the_real_client(emulator: Emulator, container: Any) -> None:
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob import ContainerClient

    forged = tamper(emulator.workspace.blobs.sas_url(container), se="2099-01-01T00:00:00Z")
    with pytest.raises(HttpResponseError) as refused:
        ContainerClient.from_container_url(forged).upload_blob("evil.py", b"print('x')")
    assert refused.value.status_code == 403 and refused.value.error_code == "AuthenticationFailed"


def test_an_expired_sas_is_refused(emulator: Emulator, container: Any) -> None:
    """Correctly signed, but ``se`` is in the past: Azure's "Signature not valid in the specified time frame"."""
    past = stamp(dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1))
    response = put(signed_url(emulator, container.name, se=past), "late.txt")
    assert response.status_code == 403 and error_code(response) == "AuthenticationFailed"
    assert "time frame" in response.text


def test_a_sas_that_starts_later_is_refused(emulator: Emulator, container: Any) -> None:
    later = stamp(dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=10))
    response = put(signed_url(emulator, container.name, st=later), "early.txt")
    assert response.status_code == 403 and error_code(response) == "AuthenticationFailed"


def test_an_unknown_signed_version_is_refused(emulator: Emulator, container: Any) -> None:
    """Correctly signed with a ``sv`` that is no Storage service version (or one before 2020-12-06)."""
    for version in ("2099-01-01", "2019-12-12"):
        response = put(signed_url(emulator, container.name, sv=version), "v.txt")
        assert response.status_code == 403 and error_code(response) == "AuthenticationFailed", version


def test_a_sas_of_another_container_is_refused(emulator: Emulator, container: Any) -> None:
    store = emulator.workspace.blobs
    other = emulator.call(lambda: store.create_container())
    theirs = urlsplit(store.sas_url(other)).query
    response = put(f"{store.container_url(container)}?{theirs}", "evil.txt")
    assert response.status_code == 403 and error_code(response) == "AuthenticationFailed"
    assert "Signature did not match" in response.text


def test_a_blob_sas_covers_its_blob_only(emulator: Emulator, container: Any) -> None:
    base = emulator.workspace.blobs.container_url(container)
    one = signed_url(emulator, container.name, "one.txt")
    assert requests.put(one, data=b"1", headers={"x-ms-blob-type": "BlockBlob"}).status_code == 201
    other = f"{base}/two.txt?{urlsplit(one).query}"
    response = requests.put(other, data=b"2", headers={"x-ms-blob-type": "BlockBlob"})
    assert response.status_code == 403 and error_code(response) == "AuthenticationFailed"


def test_a_permission_not_granted_is_refused(emulator: Emulator, container: Any) -> None:
    response = put(signed_url(emulator, container.name, sp="r"), "w.txt")
    assert response.status_code == 403 and error_code(response) == "AuthorizationPermissionMismatch"


def test_the_account_key_and_signature_stay_out_of_the_request_log(emulator: Emulator, container: Any) -> None:
    store = emulator.workspace.blobs
    url = store.sas_url(container)
    assert put(url, "logged.txt").status_code == 201
    text = repr(emulator.requests())
    assert store.account_key not in text
    # the log keeps decoded query values: look for the signature as sent (URL-encoded) and as decoded
    encoded = urlsplit(url).query.split("sig=")[1].split("&")[0]
    decoded = dict(parse_qsl(urlsplit(url).query))["sig"]
    assert encoded != decoded, "a base64 signature of 32 bytes always ends in '=', encoded as %3D"
    assert encoded not in text and decoded not in text
    assert store.account_key not in repr(emulator.connection_info())


def test_a_read_answers_with_the_headers_the_sas_signed(emulator: Emulator, container: Any) -> None:
    assert put(signed_url(emulator, container.name), "page.html", b"<p>").status_code == 201
    url = signed_url(emulator, container.name, "page.html", sp="r", rsct="text/html", rscc="no-cache")
    response = requests.get(url)
    assert response.status_code == 200
    assert (response.headers["Content-Type"], response.headers["Cache-Control"]) == ("text/html", "no-cache")
    assert requests.get(tamper(url, rsct="text/plain")).status_code == 403  # signed too


def test_a_sas_for_another_source_ip_is_refused(emulator: Emulator, container: Any) -> None:
    response = put(signed_url(emulator, container.name, sip="10.0.0.1-10.0.0.9"), "ip.txt")
    assert response.status_code == 403 and error_code(response) == "AuthorizationSourceIPMismatch"
    assert put(signed_url(emulator, container.name, sip="127.0.0.1"), "ip.txt").status_code == 201


def test_create_permission_writes_a_new_blob_but_never_over_an_existing_one(emulator: Emulator, container: Any) -> None:
    """``c`` (Create): "write a new blob"; overwriting an existing one needs ``w``."""
    create = signed_url(emulator, container.name, sp="c")
    assert put(create, "new.txt", b"first").status_code == 201
    again = put(create, "new.txt", b"second")
    assert again.status_code == 403 and error_code(again) == "AuthorizationPermissionMismatch"
    assert put(signed_url(emulator, container.name, sp="w"), "new.txt", b"second").status_code == 201
    # a new blob in blocks: Put Block then Put Block List, both with c only
    base, _, query = create.partition("?")
    block_id = base64.b64encode(b"block-0").decode()
    staged = requests.put(
        f"{base}/blocks.txt?{query}&{urlencode({'comp': 'block', 'blockid': block_id})}",
        data=b"blocks",
        headers={"x-ms-version": "2025-11-05"},
    )
    assert staged.status_code == 201, staged.text
    block_list = f'<?xml version="1.0" encoding="utf-8"?><BlockList><Latest>{block_id}</Latest></BlockList>'
    committed = requests.put(
        f"{base}/blocks.txt?{query}&comp=blocklist", data=block_list, headers={"x-ms-version": "2025-11-05"}
    )
    assert committed.status_code == 201, committed.text


@pytest.mark.parametrize("protocols", ["http", "http,https", "https,http,ftp", "ftp"])
def test_a_protocol_other_than_https_or_https_http_is_refused(
    emulator: Emulator, container: Any, protocols: str
) -> None:
    """``spr`` is ``https`` or ``https,http`` ("Create a service SAS"); anything else is not a valid SAS."""
    response = put(signed_url(emulator, container.name, spr=protocols), "spr.txt")
    assert response.status_code == 403 and error_code(response) == "AuthenticationFailed", protocols
    assert put(signed_url(emulator, container.name, spr="https,http"), "spr.txt").status_code == 201


@pytest.mark.parametrize("field", ["skoid", "sktid", "skt", "ske", "sks", "skv"])
def test_a_key_signed_sas_with_user_delegation_fields_is_refused(
    emulator: Emulator, container: Any, field: str
) -> None:
    """The ``sk*`` fields belong to a user delegation SAS, which is signed with a user delegation key."""
    values = {"skoid": "00000000-0000-0000-0000-0000000000ab", "sktid": "00000000-0000-0000-0000-0000000000aa"}
    values |= {"skt": stamp(dt.datetime.now(dt.timezone.utc)), "ske": stamp(dt.datetime.now(dt.timezone.utc))}
    values |= {"sks": "b", "skv": "2025-11-05"}
    response = put(signed_url(emulator, container.name, **{field: values[field]}), "delegated.txt")
    assert response.status_code == 403 and error_code(response) == "AuthenticationFailed", field
