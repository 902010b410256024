"""The emulator's protocol and safety behaviours, seen through the real SDK, azure-identity and kubectl.

- ARM's api-version check (required, per resource type, ARM's error envelopes);
- token audiences kept apart: ARM, the Azure ML data plane, the Kubernetes API;
- kubectl's client-side validation (``/openapi/v3``);
- datastore names and paths that cannot leave ``DIR/datastores/``;
- secret files that are owner-only from their first byte;
- the emulator's import layering (no cycles, no provider code).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import pathlib
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from airflow_azureml.hooks.azure_ml import AzureMLHook
from tests.conftest import FAST
from tests.integration.test_emulator_sdk import DEPLOYMENT, ENDPOINT, invoke, setup_workspace

REPO = Path(__file__).resolve().parents[2]
EMULATOR_DIR = REPO / "airflow_azureml" / "emulator"
SDK_DIR = Path(__import__("azure.ai.ml", fromlist=["_"]).__file__).parent
MISSING_MESSAGE = "The api-version query parameter (?api-version=) is required for all requests."


def token(emulator: Emulator, scope: str) -> str:
    from azure.identity import ClientSecretCredential

    credential = ClientSecretCredential(
        emulator.tenant_id,
        emulator.client_id,
        emulator.client_secret,
        authority=emulator.base_url,
        connection_verify=emulator.ca_cert,
        disable_instance_discovery=True,
    )
    return credential.get_token(scope).token


def arm_token(emulator: Emulator) -> str:
    return token(emulator, f"{emulator.base_url}/.default")


def ml_token(emulator: Emulator) -> str:
    return token(emulator, f"{emulator.ml_audience}/.default")


def ws_url(emulator: Emulator, suffix: str = "") -> str:
    return (
        f"{emulator.base_url}/subscriptions/{emulator.subscription_id}/resourceGroups/{emulator.resource_group}"
        f"/providers/Microsoft.MachineLearningServices/workspaces/{emulator.workspace_name}{suffix}"
    )


def get(emulator: Emulator, url: str, bearer: str, **params: str) -> requests.Response:
    headers = {"Authorization": f"Bearer {bearer}"}
    return requests.get(url, params=params, headers=headers, verify=emulator.ca_cert, timeout=30)


def post(emulator: Emulator, url: str, bearer: str, body: Any = None, **headers: str) -> requests.Response:
    headers = {"Authorization": f"Bearer {bearer}", **headers}
    return requests.post(url, json=body or {}, headers=headers, verify=emulator.ca_cert, timeout=30)


def ml_client(emulator: Emulator, aml_resource_id: str, **client_kwargs: Any) -> Any:
    """An MLClient on a custom cloud whose data-plane audience is ``aml_resource_id``; ``client_kwargs`` go to
    ``MLClient`` (azure-core pipeline options such as ``raw_response_hook``)."""
    from azure.ai.ml import MLClient
    from azure.identity import ClientSecretCredential

    credential = ClientSecretCredential(
        emulator.tenant_id,
        emulator.client_id,
        emulator.client_secret,
        authority=emulator.base_url,
        connection_verify=emulator.ca_cert,
        disable_instance_discovery=True,
    )
    digest = hashlib.sha256(f"{emulator.base_url}|{aml_resource_id}".encode()).hexdigest()[:12]
    return MLClient(
        credential,
        emulator.subscription_id,
        emulator.resource_group,
        emulator.workspace_name,
        connection_verify=emulator.ca_cert,
        show_progress=False,
        **client_kwargs,
        cloud=f"EmulatorProtocol-{digest}",
        cloud_metadata={
            "azure_portal": emulator.base_url + "/",
            "resource_manager": emulator.base_url + "/",
            "active_directory": emulator.base_url + "/",
            "aml_resource_id": aml_resource_id.rstrip("/") + "/",
            "storage_endpoint": "core.windows.net",
            "registry_discovery_endpoint": emulator.base_url + "/",
        },
    )


# ------------------------------------------------------------------------------------------ api-version
def test_arm_route_without_api_version_is_refused_as_arm_does(emulator: Emulator) -> None:
    response = get(emulator, ws_url(emulator, "/jobs"), arm_token(emulator))
    assert response.status_code == 400
    assert response.json() == {"error": {"code": "MissingApiVersionParameter", "message": MISSING_MESSAGE}}


@pytest.mark.parametrize(
    ("suffix", "version", "code", "fragment"),
    [
        ("", "2019-05-01", None, None),  # workspaces are an old type: the first stable versions still work
        ("/computes", "2019-05-01", None, None),
        ("/jobs", "2019-05-01", "NoRegisteredProviderFound", "for type 'workspaces/jobs'"),
        ("/batchEndpoints", "2019-05-01", "NoRegisteredProviderFound", "for type 'workspaces/batchEndpoints'"),
        (
            "/computes",
            "2099-01-01",
            "NoRegisteredProviderFound",
            "'2099-01-01' for type 'workspaces/computes'",
        ),
        ("/jobs/x/cancel", "2099-01-01", "NoRegisteredProviderFound", "for type 'workspaces/jobs'"),
        ("/computes", "latest", "InvalidApiVersionParameter", "The api-version 'latest' is invalid."),
    ],
)
def test_api_version_is_checked_per_resource_type(
    emulator: Emulator, suffix: str, version: str, code: str | None, fragment: str | None
) -> None:
    bearer = arm_token(emulator)
    response = get(emulator, ws_url(emulator, suffix), bearer, **{"api-version": version})
    if code is None:
        assert response.status_code == 200, response.text
        return
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == code and fragment in error["message"]
    assert "2024-10-01" in error["message"]  # the supported versions are listed, as ARM lists them


def sdk_pinned_versions() -> set[str]:
    """The ARM api-versions the installed azure-ai-ml pins, read from its own source."""
    client = (SDK_DIR / "_ml_client.py").read_text()
    pinned = set(re.findall(r'partial\(MachineLearningServicesMgmtClient, api_version="([^"]+)"\)', client))
    config = (SDK_DIR / "_restclient" / "arm_ml_service" / "_configuration.py").read_text()
    pinned |= set(re.findall(r'kwargs\.pop\("api_version", "([^"]+)"\)', config))
    return pinned


def test_every_version_the_pinned_sdk_sends_is_accepted_and_stable_2024_10_01_too(emulator: Emulator) -> None:
    from airflow_azureml.emulator.api_versions import SUPPORTED

    pinned = sdk_pinned_versions()
    assert len(pinned) >= 10 and "2025-12-01" in pinned  # the parse found the SDK's table
    for kind, versions in SUPPORTED.items():
        assert pinned | {"2024-10-01"} <= versions, kind
    bearer = arm_token(emulator)
    for version in sorted(pinned | {"2024-10-01"}):
        assert get(emulator, ws_url(emulator, "/jobs"), bearer, **{"api-version": version}).status_code == 200


def test_what_the_sdk_and_the_provider_send_is_accepted(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    from airflow_azureml.emulator.api_versions import SUPPORTED
    from airflow_azureml.hooks.rest import API_VERSION

    hook = AzureMLHook()
    ml = setup_workspace(hook)
    write_heart_csvs(emulator.datastore_path("in/proto"), files=2, rows_per_file=3, seed=1)
    name = invoke(ml, "in/proto", "proto-job-1")
    ml.jobs.get(name)
    list(ml.jobs.list())
    hook.rest().get_job(name)
    hook.rest().get_compute("low-pri-cluster")
    arm = [r for r in emulator.requests() if r["path"].startswith("/subscriptions/")]
    assert arm and all(r["status"] != 400 for r in arm), [r for r in arm if r["status"] == 400]
    sent = {r["query"].get("api-version") for r in arm}
    assert None not in sent and API_VERSION in sent
    for kind in ("workspaces/jobs", "workspaces/computes"):
        assert API_VERSION in SUPPORTED[kind]


def test_api_version_check_is_a_switch(emulator: Emulator) -> None:
    bearer = arm_token(emulator)
    assert emulator.behaviour()["check_api_versions"] is True
    emulator.set_behaviour(check_api_versions=False)
    assert get(emulator, ws_url(emulator, "/jobs"), bearer).status_code == 200
    control = emulator.control_token  # the control API takes its own token, not a workspace one
    switched = post(emulator, f"{emulator.base_url}/_emulator/behaviour", control, {"check_api_versions": True})
    assert switched.json()["check_api_versions"] is True
    assert get(emulator, ws_url(emulator, "/jobs"), bearer).status_code == 400


# ------------------------------------------------------------------------------------------- audiences
def test_each_plane_refuses_a_token_issued_for_another(emulator: Emulator) -> None:
    from airflow_azureml.emulator.identity import KUBERNETES_AUDIENCE

    arm, ml, kube = arm_token(emulator), ml_token(emulator), token(emulator, f"{KUBERNETES_AUDIENCE}/.default")
    version = {"api-version": "2024-10-01"}
    for wrong in (ml, kube):
        response = get(emulator, ws_url(emulator, "/jobs"), wrong, **version)
        assert response.status_code == 401
        error = response.json()["error"]
        assert error["code"] == "InvalidAuthenticationTokenAudience"
        assert error["message"].startswith("The access token has been obtained for wrong audience or resource '")
        assert f"'{emulator.base_url}'" in error["message"]  # the allowed audiences are named
    assert get(emulator, ws_url(emulator, "/jobs"), arm, **version).status_code == 200
    scoring = f"{emulator.base_url}/inference/batch/no-such-endpoint/jobs"
    for wrong in (arm, kube):
        response = requests.post(
            scoring, json={}, headers={"Authorization": f"Bearer {wrong}"}, verify=emulator.ca_cert
        )
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "InvalidAuthenticationTokenAudience"
    refused = post(emulator, scoring, ml)
    assert refused.status_code == 404  # past the audience check: the endpoint does not exist
    history = (
        emulator.base_url + "/history/v1.0" + ws_url(emulator, "/runs/no-such-run/details")[len(emulator.base_url) :]
    )
    for accepted in (arm, ml):  # azure-ai-ml's run-history client sends ARM's audience; its default is ML's
        assert get(emulator, history, accepted).status_code == 404
    assert get(emulator, history, kube).status_code == 401


def test_kubernetes_api_refuses_an_arm_token(emulator: Emulator) -> None:
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    kubeconfig = emulator.kubeconfig("k8s-compute")
    api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))
    assert api.list_cluster_custom_object("amlarc.azureml.com", "v1alpha1", "instancetypes")["items"] == []
    configuration = client.Configuration()
    configuration.host = f"{emulator.base_url}/k8s/k8s-compute"
    configuration.ssl_ca_cert = emulator.ca_cert
    configuration.api_key = {"authorization": f"Bearer {arm_token(emulator)}"}
    wrong = client.CustomObjectsApi(client.ApiClient(configuration))
    with pytest.raises(ApiException) as err:
        wrong.list_cluster_custom_object("amlarc.azureml.com", "v1alpha1", "instancetypes")
    assert err.value.status == 401


def test_sdk_invoke_needs_the_data_plane_audience(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    from azure.core.exceptions import HttpResponseError

    setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("in/aud"), files=1, rows_per_file=2, seed=2)
    advertised = json.loads(emulator.connection_info()["airflow_conn_json"])["extra"]["aml_resource_id"]
    right = ml_client(emulator, advertised)
    assert invoke(right, "in/aud", "aud-ok") == "aud-ok"
    wrong = ml_client(emulator, emulator.base_url)  # the ARM audience, which the hook used to send here
    with pytest.raises(HttpResponseError) as err:
        invoke(wrong, "in/aud", "aud-wrong")
    assert err.value.status_code == 401 and "InvalidAuthenticationTokenAudience" in str(err.value)
    assert emulator.job("aud-wrong") is None


def test_audience_check_is_a_switch(emulator: Emulator) -> None:
    assert emulator.behaviour()["check_audiences"] is True
    emulator.set_behaviour(check_audiences=False)
    scoring = f"{emulator.base_url}/inference/batch/{ENDPOINT}/jobs"
    headers = {"Authorization": f"Bearer {arm_token(emulator)}", "azureml-model-deployment": DEPLOYMENT}
    response = requests.post(scoring, json={}, headers=headers, verify=emulator.ca_cert, timeout=30)
    assert response.status_code == 404  # not 401: the check is off, and the endpoint does not exist


def test_token_endpoint_refuses_a_missing_scope_and_unknown_resources(emulator: Emulator) -> None:
    from azure.core.exceptions import ClientAuthenticationError

    url = f"{emulator.base_url}/{emulator.tenant_id}/oauth2/v2.0/token"
    form = {
        "grant_type": "client_credentials",
        "client_id": emulator.client_id,
        "client_secret": emulator.client_secret,
    }
    missing = requests.post(url, data=form, verify=emulator.ca_cert, timeout=30)
    assert missing.status_code == 400 and missing.json()["error_codes"] == [900144], missing.text
    assert "'scope'" in missing.json()["error_description"]
    for scope in ("https://vault.azure.net/.default", "api://nobody/.default"):
        with pytest.raises(ClientAuthenticationError) as err:
            token(emulator, scope)
        assert "AADSTS500011" in str(err.value), scope
    # the four audiences, in the forms the SDK and azure-identity ask for, are issued (Storage: the spot history)
    from airflow_azureml.emulator.identity import KUBERNETES_AUDIENCE

    for scope in (
        f"{emulator.base_url}/.default",
        f"{emulator.base_url}//.default",
        f"{emulator.ml_audience}/.default",
        f"{emulator.ml_audience}//.default",
        f"{KUBERNETES_AUDIENCE}/.default",
        "https://storage.azure.com/.default",
    ):
        assert token(emulator, scope), scope


# ---------------------------------------------------------------------------------------------- kubectl
MY_INSTANCE_TYPE = """\
apiVersion: amlarc.azureml.com/v1alpha1
kind: InstanceType
metadata:
  name: myinstancetypename
spec:
  nodeSelector:
    mylabel: mylabelvalue
  resources:
    limits:
      cpu: "1"
      nvidia.com/gpu: 1
      memory: "2Gi"
    requests:
      cpu: "700m"
      memory: "1500Mi"
"""
MY_INSTANCE_TYPE_LIST = """\
apiVersion: amlarc.azureml.com/v1alpha1
kind: InstanceTypeList
items:
  - metadata:
      name: cpusmall
    spec:
      resources:
        requests:
          cpu: "100m"
          memory: "100Mi"
        limits:
          cpu: "1"
          nvidia.com/gpu: 0
          memory: "1Gi"

  - metadata:
      name: defaultinstancetype
    spec:
      resources:
        requests:
          cpu: "1"
          memory: "1Gi"
        limits:
          cpu: "1"
          nvidia.com/gpu: 0
          memory: "1Gi"
"""


def kubectl(emulator: Emulator, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("kubectl")
    assert binary, "kubectl is not installed: run scripts/ensure_kubectl.sh (make test does)"
    env = {**os.environ, "KUBECONFIG": str(emulator.kubeconfig("k8s-compute")), "HOME": str(cwd)}
    return subprocess.run([binary, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_documents_kubectl_apply_works_with_validation_on(emulator: Emulator, tmp_path: Path) -> None:
    (tmp_path / "my_instance_type.yaml").write_text(MY_INSTANCE_TYPE)
    (tmp_path / "my_instance_type_list.yaml").write_text(MY_INSTANCE_TYPE_LIST)
    first = kubectl(emulator, tmp_path, "apply", "-f", "my_instance_type.yaml")
    assert first.returncode == 0, first.stderr
    assert "instancetype.amlarc.azureml.com/myinstancetypename created" in first.stdout
    again = kubectl(emulator, tmp_path, "apply", "-f", "my_instance_type.yaml")
    assert again.returncode == 0 and "unchanged" in again.stdout, again.stderr
    listed = kubectl(emulator, tmp_path, "apply", "-f", "my_instance_type_list.yaml")
    assert listed.returncode == 0, listed.stderr
    stored = emulator.instance_type_objects("k8s-compute")
    assert set(stored) == {"myinstancetypename", "cpusmall", "defaultinstancetype"}
    assert stored["myinstancetypename"]["spec"]["resources"]["limits"]["nvidia.com/gpu"] == 1
    opened = [r["path"] for r in emulator.requests() if "/openapi/" in r["path"] and r["status"] == 200]
    assert opened  # validation ran: kubectl read the OpenAPI documents
    writes = [r for r in emulator.requests() if r["method"] in ("POST", "PATCH") and "/instancetypes" in r["path"]]
    assert writes
    # kubectl >= 1.25 also asks the server to validate (fieldValidation=Strict); older ones, such as
    # Debian 12's 1.20, validate on the client only, from the OpenAPI documents read above.
    asked = {r["query"].get("fieldValidation") for r in writes}
    assert asked in ({"Strict"}, {None}), writes


def test_kubectl_validation_refuses_an_unknown_field(emulator: Emulator, tmp_path: Path) -> None:
    (tmp_path / "typo.yaml").write_text(MY_INSTANCE_TYPE.replace('memory: "1500Mi"', 'memroy: "1500Mi"'))
    result = kubectl(emulator, tmp_path, "apply", "-f", "typo.yaml")
    assert result.returncode != 0 and "memroy" in result.stderr
    assert emulator.instance_type_objects("k8s-compute") == {}


# ------------------------------------------------------------------------------------------- datastores
@pytest.mark.parametrize(
    "uri",
    [
        "azureml://datastores/../paths/",
        "azureml://datastores/../paths/client_secret",
        "azureml://datastores/..%2F../paths/x",
        "azureml://datastores/Upper/paths/x",
        "azureml://datastores/a.b/paths/x",
        "azureml://datastores//paths/x",
        "azureml://datastores/workspaceblobstore/paths/../../client_secret",
    ],
)
def test_data_paths_never_leave_the_datastores_folder(emulator: Emulator, uri: str) -> None:
    from airflow_azureml.emulator.errors import EmulatorError

    emulator.datastore_path("azureml://datastores/workspaceblobstore/paths/")
    before = sorted(p.name for p in emulator.data_dir.iterdir())
    with pytest.raises(EmulatorError) as err:
        emulator.datastore_path(uri)
    assert err.value.status == 400
    assert sorted(p.name for p in emulator.data_dir.iterdir()) == before


def test_invoke_with_a_path_outside_the_datastores_is_refused(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    setup_workspace(AzureMLHook())
    scoring = f"{emulator.base_url}/inference/batch/{ENDPOINT}/jobs"
    body = {
        "properties": {
            "name": "escape",
            "inputData": {"heart_dataset": {"jobInputType": "uri_folder", "uri": "azureml://datastores/../paths/"}},
        }
    }
    headers = {"Authorization": f"Bearer {ml_token(emulator)}", "azureml-model-deployment": DEPLOYMENT}
    response = requests.post(scoring, json=body, headers=headers, verify=emulator.ca_cert, timeout=30)
    assert response.status_code == 400 and "invalid" in response.json()["error"]["message"]
    assert emulator.job("escape") is None


@pytest.mark.parametrize(("name", "status"), [("%2E%2E", 400), ("Upper", 400), ("a.b", 400), ("nosuchstore", 404)])
def test_datastore_get_checks_the_name_and_creates_nothing(emulator: Emulator, name: str, status: int) -> None:
    url = ws_url(emulator, f"/datastores/{name}")
    tree_before = sorted(str(p) for p in emulator.data_dir.parent.rglob("*"))
    response = get(emulator, url, arm_token(emulator), **{"api-version": "2024-10-01"})
    assert response.status_code == status, response.text
    assert sorted(str(p) for p in emulator.data_dir.parent.rglob("*")) == tree_before


def test_sdk_reads_the_default_datastore(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    store = AzureMLHook().get_conn().datastores.get("workspaceblobstore")
    assert store.name == "workspaceblobstore"


# -------------------------------------------------------------------------------------------- secrets
SECRET_NAMES = ("client_secret", "key.pem", "emulator.json", "kubeconfig-k8s-compute.yaml")


def _open_to_others(path: Path) -> bool:
    return bool(stat.S_IMODE(path.stat().st_mode) & 0o077)


def test_secret_files_are_owner_only_from_their_first_byte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write into the data dir is watched: a secret file may never exist with a wider mode, even
    between its write and a chmod."""
    seen: list[tuple[str, int]] = []
    data_dir = (tmp_path / "emu").resolve()

    def watch(path: Path) -> None:
        path = Path(path)
        if path.exists() and path.resolve().parent == data_dir:
            seen.append((path.name, stat.S_IMODE(path.stat().st_mode)))

    for method in ("write_text", "write_bytes"):
        original = getattr(pathlib.Path, method)

        def patched(self: Path, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            result = _original(self, *args, **kwargs)
            watch(self)
            return result

        monkeypatch.setattr(pathlib.Path, method, patched)
    original_replace = os.replace

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        watch(Path(src))
        original_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    with Emulator(data_dir, timing=FAST) as emu:
        emu.kubeconfig("k8s-compute")
        for name in SECRET_NAMES:
            assert not _open_to_others(data_dir / name), name
    secret_like = [(n, m) for n, m in seen if any(n == s or n.startswith(f".{s}.") for s in SECRET_NAMES)]
    assert secret_like, "the watch saw no secret being written"
    assert all(mode & 0o077 == 0 for _, mode in secret_like), secret_like


def test_existing_secret_files_get_their_mode_fixed(tmp_path: Path) -> None:
    data_dir = tmp_path / "emu"
    with Emulator(data_dir, timing=FAST) as emu:
        emu.kubeconfig("k8s-compute")
    for name in SECRET_NAMES:
        (data_dir / name).chmod(0o644)
    with Emulator(data_dir, timing=FAST) as emu:
        emu.kubeconfig("k8s-compute")
        for name in SECRET_NAMES:
            assert stat.S_IMODE((data_dir / name).stat().st_mode) == 0o600, name


# ------------------------------------------------------------------------------------------- layering
def _emulator_imports() -> dict[str, set[str]]:
    """Every import of every emulator module (module level, functions and TYPE_CHECKING blocks alike)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(EMULATOR_DIR.rglob("*.py")):
        relative = path.relative_to(REPO).with_suffix("")
        module = ".".join(relative.parts[:-1] if relative.name == "__init__" else relative.parts)
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets.add(node.module)
                targets.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
        graph[module] = {t for t in targets if t.startswith("airflow_azureml")}
    return graph


def test_emulator_modules_import_in_one_direction() -> None:
    graph = _emulator_imports()
    edges = {m: {t for t in targets if t in graph and t != m} for m, targets in graph.items()}
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for target in sorted(edges[node]):
            if state.get(target) == "open":
                pytest.fail("import cycle: " + " -> ".join([*trail, node, target]))
            if target not in state:
                visit(target, [*trail, node])
        state[node] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [])
    assert "airflow_azureml.emulator.kubernetes.store" in edges["airflow_azureml.emulator.models"]


def test_emulator_imports_no_provider_code() -> None:
    """Only its own modules, and the neutral example-data generator it shares with the example DAGs."""
    for module, targets in _emulator_imports().items():
        outside = {t for t in targets if not t.startswith(("airflow_azureml.emulator", "airflow_azureml.example_data"))}
        assert not outside, f"{module} imports provider code: {sorted(outside)}"


@pytest.mark.parametrize("module", sorted(_emulator_imports()))
def test_each_emulator_module_imports_alone(module: str) -> None:
    result = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_token_endpoint_can_be_taken_down_and_only_by_a_rule_aimed_at_it(emulator: Emulator) -> None:
    """An Entra ID outage (route ``token``): azure-identity gets a 503; ARM routes are not touched by it,
    and a catch-all ARM fault never hits the token endpoint."""
    from azure.core.exceptions import ClientAuthenticationError

    emulator.add_fault(kind="status", status=503, route="token", count=None)
    with pytest.raises(ClientAuthenticationError):
        token(emulator, f"{emulator.base_url}/.default")
    served = [r for r in emulator.requests() if "/oauth2/" in r["path"] and r.get("fault")]
    assert served and all(r["status"] == 503 for r in served)
    emulator.clear_faults()
    bearer = token(emulator, f"{emulator.base_url}/.default")
    emulator.add_fault(kind="status", status=500, count=None)  # every ARM route, not identity
    assert token(emulator, f"{emulator.base_url}//.default")
    assert get(emulator, ws_url(emulator), bearer).status_code == 500


# ------------------------------------------------------------------------------------------ LRO polls
def put(emulator: Emulator, url: str, bearer: str, body: Any) -> requests.Response:
    headers = {"Authorization": f"Bearer {bearer}"}
    return requests.put(url, json=body, headers=headers, verify=emulator.ca_cert, timeout=30)


CLUSTER_BODY = {
    "location": "eastus",
    "properties": {
        "computeType": "AmlCompute",
        "properties": {"vmSize": "STANDARD_DS3_V2", "scaleSettings": {"minNodeCount": 0, "maxNodeCount": 1}},
    },
}


def test_a_poll_is_scoped_to_the_subscription_that_started_the_operation(emulator: Emulator) -> None:
    """ARM routes an operation's poll by its subscription: the same id under another one is not found."""
    bearer = arm_token(emulator)
    created = put(emulator, ws_url(emulator, "/computes/scoped?api-version=2024-10-01"), bearer, CLUSTER_BODY)
    assert created.status_code == 201, created.text
    poll = created.headers["Azure-AsyncOperation"]
    assert "/computeOperationsStatus/" in poll and "Location" not in created.headers  # compute.put.201
    assert get(emulator, poll, bearer).status_code == 200
    elsewhere = poll.replace(emulator.subscription_id, "00000000-0000-0000-0000-00000000dead")
    refused = get(emulator, elsewhere, bearer)
    assert refused.status_code == 404 and set(refused.json()["error"]) >= {"code", "message"}


def test_a_failed_operation_carries_an_error(emulator: Emulator) -> None:
    """A compute deleted while its create is polled: the poll says Failed, with ARM's ``error`` object."""
    bearer = arm_token(emulator)
    created = put(emulator, ws_url(emulator, "/computes/gone?api-version=2024-10-01"), bearer, CLUSTER_BODY)
    assert created.status_code == 201, created.text
    headers = {"Authorization": f"Bearer {bearer}"}
    deleted = requests.delete(
        ws_url(emulator, "/computes/gone?api-version=2024-10-01"), headers=headers, verify=emulator.ca_cert, timeout=30
    )
    assert deleted.status_code == 202
    body = get(emulator, created.headers["Azure-AsyncOperation"], bearer).json()
    assert body["status"] == "Failed"
    assert set(body["error"]) == {"code", "message"} and body["error"]["message"]
