"""Secrets never reach a log line or an exception, not even in part (issue 9, §8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_azureml.redaction import mask, scrub

JWT = "eyJhbGciOiJSUzI1NiJ9.eyJhdWQiOiJodHRwczovL21hbmFnZW1lbnQuYXp1cmUuY29tIn0.c2lnbmF0dXJlLXBhcnQtb2YtdGhlLXRva2Vu"
ACCOUNT_KEY = "Zm9vYmFyYmF6cXV4MTIzNDU2Nzg5MGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6QUJDREVGR0g+/=="
SIG = "r7Lz3%2FkQ9xW0pYvT8mN2bC5dE6fG1hJ4kL7%3D"


def test_scrub_first_then_truncate_leaves_no_prefix_of_a_registered_secret() -> None:
    secret = "s3cr3t-value-that-is-long-enough-0123456789"
    mask(secret)
    text = "x" * 480 + secret + " and more"
    cut = scrub(text, limit=500)
    assert secret[:20] not in cut and "s3cr3t" not in cut
    assert len(cut) <= 500


def test_a_registered_value_too_short_to_be_a_secret_leaves_text_readable() -> None:
    mask("a")
    mask("to")
    text = "Compute a-cluster to be deleted: a job is still running"
    assert scrub(text) == text


def test_scrub_then_truncate_leaves_no_prefix_of_a_bearer_token() -> None:
    text = "y" * 470 + f"Authorization: Bearer {JWT}"
    cut = scrub(text, limit=500)
    assert "eyJhbGci" not in cut and JWT[:12] not in cut


@pytest.mark.parametrize(
    ("text", "leak"),
    [
        (f"Authorization: Bearer {JWT}", JWT[:16]),
        ("header authorization: bearer abc.def-ghi_jkl~mno", "abc.def-ghi"),
        (f"https://acct.blob.core.windows.net/c/b?sv=2022-11-02&se=2026&sp=r&sig={SIG}&x=1", SIG[:8]),
        (f"?sv=2022&sig={SIG}", SIG[:8]),
        (f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={ACCOUNT_KEY};EndpointSuffix=x", ACCOUNT_KEY[:8]),
        ('{"password": "pass phrase"}', "phrase"),
        ("{'client_secret': 'a b c d'}", "b c d"),
        ('{"clientSecret":"with \\"escaped\\" quote and space"}', "quote and space"),
        ("password=pass phrase&next=1", "phrase"),
        ("refresh_token: rt with spaces\n", "with spaces"),
        ('"access_token": "at-1234567890"', "at-1234567890"),
    ],
)
def test_scrub_removes_secret_shapes(text: str, leak: str) -> None:
    assert leak not in scrub(text)


def test_scrub_keeps_what_is_not_secret() -> None:
    text = "Job heart-1 failed: PreemptionError: Nodes of this job got pre-empted"
    assert scrub(text) == text
    url = "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig=abc123456789"
    assert scrub(url).startswith("https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sig=")


def test_yaml_error_summary_quotes_no_line_of_the_document() -> None:
    import yaml

    from airflow_azureml.redaction import yaml_error_summary

    token = "kubeconfig-token-abcdef0123456789"
    broken = f"apiVersion: v1\nusers:\n- name: u\n  user:\n    token: {token}\n  bad: [unclosed: {token}\n"
    with pytest.raises(yaml.YAMLError) as err:
        yaml.safe_load(broken)
    assert token[:16] in str(err.value)  # PyYAML's own message quotes the line: why we never use it
    summary = yaml_error_summary(err.value)
    assert token[:8] not in summary and "line" in summary


@pytest.mark.parametrize(
    "kube_config",
    [
        "apiVersion: v1\nusers:\n- name: u\n  user:\n    token: {token}\n  bad: [unclosed {token}\n",
        "apiVersion: v1\nusers:\n- user:\n    token: {token}\n   bad: {token}\n",
        "token: {token}\n  x: : {token}\n",
    ],
)
def test_malformed_kube_config_puts_no_line_of_it_in_the_error(
    kube_config: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import json

    from airflow_azureml.exceptions import AzureMLConfigError
    from airflow_azureml.operators.kubernetes import AzureMLApplyInstanceTypesOperator

    token = "sha256~kubeconfig-token-abcdef0123456789"
    extra = {"kube_config": kube_config.format(token=token)}
    monkeypatch.setenv("AIRFLOW_CONN_K8S_BROKEN", json.dumps({"conn_type": "kubernetes", "extra": extra}))
    op = AzureMLApplyInstanceTypesOperator(task_id="apply", instance_types=[], kubernetes_conn_id="k8s_broken")
    with pytest.raises(AzureMLConfigError) as err:
        op._kube_settings()
    assert "kube_config" in str(err.value)
    for text in (str(err.value), repr(err.value), caplog.text):
        assert token[:14] not in text and "kubeconfig-token" not in text


def test_malformed_kubeconfig_file_puts_no_line_of_it_in_the_error(tmp_path: Path) -> None:
    from airflow_azureml.exceptions import AzureMLConfigError
    from airflow_azureml.operators.kubernetes import AzureMLApplyInstanceTypesOperator

    token = "sha256~kubeconfig-file-token-abcdef0123456789"
    path = tmp_path / "kubeconfig"
    path.write_text(f"apiVersion: v1\nusers:\n- user:\n    token: {token}\n   bad: {token}\n")
    op = AzureMLApplyInstanceTypesOperator(task_id="apply", instance_types=[], kubeconfig=str(path))
    with pytest.raises(AzureMLConfigError) as err:
        op._api_client()
    assert "kubeconfig" in str(err.value) and "kubeconfig-file-token" not in str(err.value)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ('"token": "kubeconfig-token-value"', "kubeconfig-token-value"),
        ("users:\n- name: u\n  user:\n    token: kube-tok-123\n", "kube-tok-123"),
        ("Authorization: Basic dXNlcjpwYXNz", "dXNlcjpwYXNz"),
        ("https://user:hunter2@host/x", "hunter2"),
        ('AccountKey="abc def"', "abc def"),
        ("sig=abcdef123&sv=1", "abcdef123"),
    ],
)
def test_scrub_removes_more_secret_shapes(text: str, secret: str) -> None:
    assert secret not in scrub(text)


def test_scrub_keeps_words_that_only_mention_a_token() -> None:
    assert scrub("could not get a token: ClientAuthenticationError") == (
        "could not get a token: ClientAuthenticationError"
    )


PEM_KEY = (
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj\n"
    "MzEfYyjiWA4R4/M2bS1GB4t7NXp98C3SC6dVMvDuictGeurT8jNbvJZHtCSuYEvu"
)


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ('users:\n- user:\n    token: "quoted-kube-token-1"\n', "quoted-kube-token-1"),
        ("users:\n- user:\n    token: 'single-quoted-token-2'\n", "single-quoted-token-2"),
        ("    client-key-data: LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQo=\n", "LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVk"),
        (f"-----BEGIN PRIVATE KEY-----\n{PEM_KEY}\n-----END PRIVATE KEY-----", "MIIEvQIBADANBgkq"),
        (f"-----BEGIN RSA PRIVATE KEY-----\n{PEM_KEY}\n-----END RSA PRIVATE KEY-----", "MzEfYyji"),
        ('{"accountKey": "c3RvcmFnZS1hY2NvdW50LWtleQ=="}', "c3RvcmFnZS1hY2NvdW50LWtleQ"),
        ('{"key": "primary-key-value-123"}', "primary-key-value-123"),
        ("{'primaryKey': 'another-key-value-456'}", "another-key-value-456"),
        ('{"client-key-data": "LS0tLS1CRUdJTiBFQyBQUklWQVRF"}', "LS0tLS1CRUdJTiBFQyBQUklW"),
    ],
)
def test_scrub_removes_the_remaining_secret_shapes(text: str, secret: str) -> None:
    assert secret not in scrub(text)


def test_scrub_keeps_a_certificate_and_words_about_keys() -> None:
    cert = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUQ\n-----END CERTIFICATE-----"
    assert scrub(cert) == cert  # public: the emulator's CA certificate is shown on purpose
    assert scrub("unknown key 'tier', did you mean 'tiers'?") == "unknown key 'tier', did you mean 'tiers'?"
    tolerations = '{"partition_key": "2026-11-01", "unit_key": "abc123", "monkey": "x"}'
    assert scrub(tolerations) == tolerations


def test_safe_uri_keeps_a_sas_urls_non_secret_parameters() -> None:
    from airflow_azureml.redaction import safe_uri

    url = f"https://acct.blob.core.windows.net/c/dir/?sv=2022-11-02&sr=c&sp=rl&se=2026-12-03T00%3A00%3A00Z&sig={SIG}"
    safe = safe_uri(url)
    assert SIG[:8] not in safe and "sig=" not in safe
    assert safe.startswith("https://acct.blob.core.windows.net/c/dir/?") and "sv=2022-11-02" in safe and "sp=rl" in safe
    plain = "azureml://datastores/workspaceblobstore/paths/out/20261101/"
    assert safe_uri(plain) == plain


def test_a_bad_data_uri_error_carries_no_sas_signature() -> None:
    from airflow_azureml.exceptions import AzureMLConfigError
    from airflow_azureml.specs import check_data_uri

    with pytest.raises(AzureMLConfigError) as err:
        check_data_uri("inputs['d']", f"ftp://acct.blob.core.windows.net/c/?sv=2022-11-02&sig={SIG}")
    assert SIG[:8] not in str(err.value) and "sv=2022-11-02" in str(err.value)


def test_a_jobs_sas_output_uri_reaches_no_xcom_with_its_signature() -> None:
    from airflow_azureml.outcomes import JobSnapshot

    out = f"https://acct.blob.core.windows.net/c/out/?sv=2022-11-02&sr=c&sp=rwl&sig={SIG}"
    job = {"name": "j", "properties": {"status": "Completed", "outputs": {"score": {"uri": out}}}}
    snapshot = JobSnapshot.from_rest(job)
    assert snapshot.output_uri is not None and SIG[:8] not in snapshot.output_uri and "sp=rwl" in snapshot.output_uri
    assert SIG[:8] not in str(snapshot.to_dict())
