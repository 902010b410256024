"""The emulator's Retail Prices API and its own bill (issue 11, emulator side).

Prices are read over plain HTTPS, with no credential, as a client reads ``prices.azure.com``. The bill
is the control API's (``GET /_emulator/bill``, ``Emulator.bill()``); clusters and jobs are made with the
real MLClient. Rules and sources: docs/billing.md.
"""

from __future__ import annotations

from typing import Any

import pytest
import requests

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from airflow_azureml.hooks.azure_ml import AzureMLHook
from tests.integration.test_emulator_behaviour import CLUSTER, control, until
from tests.integration.test_emulator_sdk import invoke, setup_workspace, wait_status, wait_terminal

SKU = "Standard_DS3_v2"  # the seeds' cluster size (STANDARD_DS3_v2 in their YAML)
ONE_SIZE = f"serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' and armSkuName eq '{SKU}'"
ITEM_FIELDS = {
    "currencyCode",
    "tierMinimumUnits",
    "retailPrice",
    "unitPrice",
    "armRegionName",
    "location",
    "effectiveStartDate",
    "meterId",
    "meterName",
    "productId",
    "skuId",
    "productName",
    "skuName",
    "serviceName",
    "serviceId",
    "serviceFamily",
    "unitOfMeasure",
    "type",
    "isPrimaryMeterRegion",
    "armSkuName",
}


def prices(emulator: Emulator, url: str | None = None, **params: str) -> requests.Response:
    """``GET {prices}/api/retail/prices`` with no Authorization header: the API is public."""
    return requests.get(
        url or f"{emulator.base_url}/api/retail/prices", params=params or None, verify=emulator.ca_cert, timeout=10
    )


def all_pages(emulator: Emulator, filter_text: str) -> list[dict[str, Any]]:
    """Follow ``NextPageLink`` to the end, as a client must."""
    page = prices(emulator, **{"$filter": filter_text}).json()
    items = list(page["Items"])
    while page["NextPageLink"]:
        page = prices(emulator, page["NextPageLink"]).json()
        items.extend(page["Items"])
    return items


def linux_rate(emulator: Emulator, suffix: str = "", region: str = "eastus") -> float:
    """What a careful client picks: Consumption, primary meter, not Windows, the tier's skuName suffix."""
    items = prices(
        emulator,
        **{"$filter": f"armRegionName eq '{region}' and armSkuName eq '{SKU}' and priceType eq 'Consumption'"},
    ).json()["Items"]
    chosen = [
        i
        for i in items
        if i["isPrimaryMeterRegion"]
        and "Windows" not in i["productName"]
        and i["skuName"].removeprefix("DS3 v2") == suffix
    ]
    assert len(chosen) == 1, chosen
    return float(chosen[0]["retailPrice"])


# ------------------------------------------------------------------ prices
def test_prices_for_one_size_have_azures_shape_and_every_tier(emulator: Emulator) -> None:
    response = prices(emulator, **{"$filter": ONE_SIZE})
    assert response.status_code == 200
    body = response.json()
    assert {k: body[k] for k in ("BillingCurrency", "CustomerEntityId", "CustomerEntityType")} == {
        "BillingCurrency": "USD",
        "CustomerEntityId": "Default",
        "CustomerEntityType": "Retail",
    }
    items = body["Items"]
    assert body["Count"] == len(items) and body["NextPageLink"] is None
    for item in items:
        assert set(item) >= ITEM_FIELDS, item
        assert set(item) - ITEM_FIELDS <= {"reservationTerm"}  # no field Azure does not send
        assert (item["serviceName"], item["armRegionName"], item["armSkuName"]) == ("Virtual Machines", "eastus", SKU)
        assert item["unitOfMeasure"] == "1 Hour" and item["currencyCode"] == "USD"
    skus = {(i["productName"], i["skuName"], i["type"]) for i in items}
    for product in ("Virtual Machines DSv2 Series", "Virtual Machines DSv2 Series Windows"):
        for sku_name in ("DS3 v2", "DS3 v2 Spot", "DS3 v2 Low Priority"):
            assert (product, sku_name, "Consumption") in skus
    assert any(i["type"] == "Reservation" for i in items)  # a client must filter on type / priceType
    assert any(not i["isPrimaryMeterRegion"] for i in items)  # and on the primary meter
    # the meter a careful client picks, and the others it must not take for it
    payg, spot, low = linux_rate(emulator), linux_rate(emulator, " Spot"), linux_rate(emulator, " Low Priority")
    assert 0 < spot < payg and 0 < low < payg
    windows = [i for i in items if i["productName"].endswith("Windows") and i["skuName"] == "DS3 v2"]
    assert windows and all(i["retailPrice"] > payg for i in windows)


def test_prices_page_through_next_page_link(emulator: Emulator) -> None:
    first = prices(emulator, **{"$filter": "serviceName eq 'Virtual Machines'"}).json()
    assert first["Count"] == len(first["Items"]) == 100  # "a maximum of 100 records" per request
    assert "$skip=100" in first["NextPageLink"]
    every = all_pages(emulator, "serviceName eq 'Virtual Machines'")
    assert len(every) > 100
    assert len({(i["meterId"], i["type"]) for i in every}) == len(every)  # no item twice across pages
    regions = {i["armRegionName"] for i in every}
    by_region = sum(
        len(all_pages(emulator, f"serviceName eq 'Virtual Machines' and armRegionName eq '{r}'")) for r in regions
    )
    assert by_region == len(every)
    past_the_end = prices(emulator, **{"$filter": "serviceName eq 'Virtual Machines'", "$skip": "100000"}).json()
    assert (past_the_end["Items"], past_the_end["Count"], past_the_end["NextPageLink"]) == ([], 0, None)


def test_prices_filter_subset(emulator: Emulator) -> None:
    # values are case-sensitive (2023-01-01-preview and later): ARM's STANDARD_DS3_V2 matches nothing
    assert prices(emulator, **{"$filter": "armSkuName eq 'STANDARD_DS3_V2'"}).json()["Items"] == []
    windows = all_pages(emulator, f"armSkuName eq '{SKU}' and contains(productName, 'Windows')")
    assert windows and all("Windows" in i["productName"] for i in windows)
    linux = all_pages(emulator, f"armSkuName eq '{SKU}' and not contains(productName, 'Windows')")
    assert linux and not any("Windows" in i["productName"] for i in linux)
    both = all_pages(emulator, f"armSkuName eq '{SKU}' and (armRegionName eq 'eastus' or armRegionName eq 'westus2')")
    assert {i["armRegionName"] for i in both} == {"eastus", "westus2"}
    spot = all_pages(emulator, f"armSkuName eq '{SKU}' and endswith(meterName, ' Spot') and priceType eq 'Consumption'")
    assert spot and all(i["meterName"].endswith(" Spot") and i["type"] == "Consumption" for i in spot)
    primary = prices(emulator, **{"$filter": ONE_SIZE, "meterRegion": "'primary'"}).json()["Items"]
    assert primary and all(i["isPrimaryMeterRegion"] for i in primary)


@pytest.mark.parametrize(
    "bad", ["armSkuName eq", "noSuchField eq 'x'", "armSkuName gt 'x'", "(armSkuName eq 'x'", "armSkuName eq 'x' and"]
)
def test_prices_refuse_a_bad_filter(emulator: Emulator, bad: str) -> None:
    response = prices(emulator, **{"$filter": bad})
    assert response.status_code == 400
    assert "filter" in response.json()["Error"]["Message"]


def test_spot_ratio_is_set_per_size_and_never_above_pay_as_you_go(emulator: Emulator) -> None:
    payg, low_before = linux_rate(emulator), linux_rate(emulator, " Low Priority")
    for ratio in (0.2, 0.6, 0.95):
        answer = control(emulator, "POST", "/_emulator/prices", {"armSkuName": SKU, "spot": ratio})
        assert answer["spot"] == ratio
        assert linux_rate(emulator, " Spot") == pytest.approx(payg * ratio, abs=1e-6)
        assert linux_rate(emulator, " Spot", region="westeurope") == pytest.approx(
            linux_rate(emulator, region="westeurope") * ratio, abs=1e-6
        )
    assert linux_rate(emulator, " Low Priority") == low_before  # the Low Priority meter is a separate price
    spot_item = next(i for i in all_pages(emulator, ONE_SIZE) if i["skuName"] == "DS3 v2 Spot")
    assert spot_item["effectiveStartDate"] != "2024-04-01T00:00:00Z"  # a variable rate: effective since it changed
    assert emulator.set_price_ratio("STANDARD_DS3_V2", low_priority=0.5)["low_priority"] == 0.5
    assert linux_rate(emulator, " Low Priority") == pytest.approx(payg * 0.5, abs=1e-6)
    listed = {r["armSkuName"]: r for r in control(emulator, "GET", "/_emulator/prices")}
    assert listed[SKU] == {"armSkuName": SKU, "spot": 0.95, "low_priority": 0.5}
    for body in ({"armSkuName": SKU, "spot": 1.5}, {"armSkuName": SKU, "spot": 0}, {"armSkuName": "Standard_X9"}):
        with pytest.raises(requests.HTTPError) as excinfo:
            control(emulator, "POST", "/_emulator/prices", body)
        assert excinfo.value.response.status_code == 400


# -------------------------------------------------------------------- bill
def cluster_bill(emulator: Emulator, name: str = CLUSTER) -> dict[str, Any]:
    return emulator.bill()["clusters"][name]


def open_nodes(bill: dict[str, Any]) -> list[dict[str, Any]]:
    return [n for n in bill["nodes"] if n["deallocated_at"] is None]


def test_low_priority_bill_counts_evicted_nodes_and_replacement_start_up(
    emulator: Emulator, azureml_conn: dict[str, Any]
) -> None:
    ml = setup_workspace(AzureMLHook())  # the seeds' low-priority cluster: STANDARD_DS3_v2, 2 nodes
    emulator.set_price_ratio(SKU, spot=0.2)
    emulator.set_behaviour(preempted_node_release_seconds=0.3)
    empty = cluster_bill(emulator)
    assert (empty["tier"], empty["node_seconds_total"], empty["nodes_allocated"]) == ("low_priority", 0.0, 0)
    # enough mini-batches (150 on 4 workers) that the job is still running when it is stalled
    write_heart_csvs(emulator.datastore_path("inputs/bill"), files=300, rows_per_file=1)
    name = invoke(ml, "inputs/bill", "job-bill")
    wait_status(emulator, name, "Running")
    until(lambda: cluster_bill(emulator)["node_seconds"]["running"] > 0, "running node-seconds")
    emulator.stall_job(name, 120)  # the job holds its nodes (NotResponding) while we evict and preempt
    before_eviction = cluster_bill(emulator)
    assert before_eviction["nodes_allocated"] == 2 and before_eviction["node_seconds"]["preparing"] > 0

    # 1. one node evicted: billed while preempted, until deallocated; its replacement billed from start-up
    assert emulator.evict_nodes(CLUSTER, 1) == 1
    after_eviction = until(
        lambda: (
            (b := cluster_bill(emulator))["nodes_allocated"] == 3
            and any(n["evicted"] and n["deallocated_at"] is not None for n in b["nodes"])
            and all(n["state"] in ("idle", "running") for n in open_nodes(b))
            and b
        ),
        "the evicted node deallocated and its replacement up",
    )
    evicted = next(n for n in after_eviction["nodes"] if n["evicted"])
    replacement = after_eviction["nodes"][-1]
    assert evicted["node_seconds"]["preempted"] > 0
    assert sum(evicted["node_seconds"].values()) == pytest.approx(evicted["deallocated_at"] - evicted["allocated_at"])
    assert replacement["job"] == name and not replacement["evicted"]
    assert replacement["node_seconds"]["preparing"] > 0  # the replacement's start-up is billed
    assert after_eviction["evictions"] == 1
    assert after_eviction["node_seconds"]["preempted"] > before_eviction["node_seconds"]["preempted"] == 0
    for state in ("preparing", "idle", "running"):
        assert after_eviction["node_seconds"][state] >= before_eviction["node_seconds"][state]
    assert after_eviction["node_seconds_total"] > before_eviction["node_seconds_total"]

    # 2. the whole cluster preempted: the job is canceled, every node billed until it is deallocated
    assert emulator.preempt_cluster(CLUSTER) == [name]
    assert wait_terminal(ml, name) == "Canceled"
    final = until(lambda: not open_nodes(b := cluster_bill(emulator)) and b, "every node deallocated")
    assert final["evictions"] == 3 and final["nodes_allocated"] == 3
    assert final["node_seconds"]["preempted"] > after_eviction["node_seconds"]["preempted"]
    assert final["evicted_node_seconds"] == pytest.approx(final["node_seconds_total"])  # no refund for any
    for node in final["nodes"]:  # every second from allocation to deallocation, whatever the state
        assert sum(node["node_seconds"].values()) == pytest.approx(node["deallocated_at"] - node["allocated_at"])
    assert sum(final["node_seconds"].values()) == pytest.approx(final["node_seconds_total"])
    assert final["jobs"][name]["node_seconds"] == pytest.approx(final["node_seconds"])

    # 3. the cost is node-seconds x the Spot rate the prices API shows, per hour
    spot = linux_rate(emulator, " Spot")
    assert spot == pytest.approx(0.2 * linux_rate(emulator), abs=1e-6)
    assert (final["hourly_price"], final["price_meter"]) == (spot, "DS3 v2 Spot")
    assert final["cost"] == pytest.approx(final["node_seconds_total"] * spot / 3600)
    assert emulator.bill()["clusters"][CLUSTER]["node_seconds_total"] == final["node_seconds_total"]  # none after


def test_bill_per_tier_and_total_from_the_control_api(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    from azure.ai.ml import command
    from azure.ai.ml.entities import AmlCompute

    ml = setup_workspace(AzureMLHook())
    ml.compute.begin_create_or_update(
        AmlCompute(name="dedicated-cluster", size="STANDARD_DS3_v2", tier="dedicated", max_instances=1)
    ).result()
    emulator.set_price_ratio(SKU, spot=0.6)
    job = ml.jobs.create_or_update(
        command(
            name="cmd-dedicated",
            command="echo hello",
            environment="azureml:AzureML-sklearn-1.5@latest",
            compute="dedicated-cluster",
            experiment_name="billing",
        )
    )
    write_heart_csvs(emulator.datastore_path("inputs/tiers"), files=10, rows_per_file=3)
    batch = invoke(ml, "inputs/tiers", "job-tiers")
    assert wait_terminal(ml, job.name) == "Completed"
    assert wait_terminal(ml, batch) == "Completed"

    def settled() -> dict[str, Any] | None:
        bill = control(emulator, "GET", "/_emulator/bill")
        return None if any(open_nodes(c) for c in bill["clusters"].values()) else bill

    bill = until(settled, "every node released")
    dedicated, spot = bill["clusters"]["dedicated-cluster"], bill["clusters"][CLUSTER]
    assert dedicated["tier"] == "dedicated" and dedicated["price_meter"] == "DS3 v2"
    assert dedicated["node_seconds"]["preparing"] > 0 and dedicated["node_seconds"]["running"] > 0
    assert dedicated["jobs"]["cmd-dedicated"]["node_seconds"]["running"] > 0
    assert dedicated["cost"] == pytest.approx(dedicated["node_seconds_total"] * linux_rate(emulator) / 3600)
    assert spot["cost"] == pytest.approx(spot["node_seconds_total"] * linux_rate(emulator, " Spot") / 3600)
    assert spot["hourly_price"] == pytest.approx(0.6 * dedicated["hourly_price"], abs=1e-6)
    for tier, cluster in (("dedicated", dedicated), ("low_priority", spot)):
        assert bill["by_tier"][tier]["cost"] == pytest.approx(cluster["cost"])
        assert bill["by_tier"][tier]["node_seconds"] == pytest.approx(cluster["node_seconds"])
    assert bill["total"]["cost"] == pytest.approx(dedicated["cost"] + spot["cost"])
    assert bill["total"]["node_seconds_total"] == pytest.approx(
        dedicated["node_seconds_total"] + spot["node_seconds_total"]
    )
    # the bill is the control API's only: Azure's own compute resource carries none of it
    arm = ml.compute._operation.get(
        resource_group_name=emulator.resource_group, workspace_name=emulator.workspace_name, compute_name=CLUSTER
    ).as_dict()
    assert not {"cost", "bill", "node_seconds", "hourly_price"} & set(_keys(arm))


def test_deleted_cluster_keeps_its_bill_and_stops_accruing(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/deleted"), files=60, rows_per_file=3)
    name = invoke(ml, "inputs/deleted", "job-deleted")
    wait_status(emulator, name, "Running")
    until(lambda: cluster_bill(emulator)["node_seconds_total"] > 0, "billed node-seconds")
    ml.compute.begin_delete(CLUSTER).result()
    assert wait_terminal(ml, name) == "Failed"
    closed = cluster_bill(emulator)
    assert closed["deleted"] and not open_nodes(closed) and closed["node_seconds_total"] > 0
    wait_status(emulator, name, "Failed")
    assert cluster_bill(emulator)["node_seconds_total"] == closed["node_seconds_total"]


def _keys(value: Any) -> list[str]:
    """Every key at any depth of a JSON value."""
    keys: list[str] = []
    if isinstance(value, dict):
        for key, inner in value.items():
            keys.append(key)
            keys.extend(_keys(inner))
    elif isinstance(value, list):
        for inner in value:
            keys.extend(_keys(inner))
    return keys


def test_spot_rate_change_bills_each_stretch_at_the_rate_in_force(
    emulator: Emulator, azureml_conn: dict[str, Any]
) -> None:
    ml = setup_workspace(AzureMLHook())
    emulator.set_price_ratio(SKU, spot=0.2)
    payg = linux_rate(emulator)
    write_heart_csvs(emulator.datastore_path("inputs/variable"), files=300, rows_per_file=1)
    name = invoke(ml, "inputs/variable", "job-variable")
    wait_status(emulator, name, "Running")
    emulator.stall_job(name, 120)  # nodes stay up while the rate changes
    cheap = until(lambda: (b := cluster_bill(emulator))["node_seconds_total"] > 0 and b, "billed node-seconds")
    assert cheap["cost"] == pytest.approx(cheap["node_seconds_total"] * 0.2 * payg / 3600)
    emulator.set_price_ratio(SKU, spot=0.95)  # the Spot rate rises while the nodes are up (seed 000)
    until(lambda: cluster_bill(emulator)["node_seconds_total"] > 2 * cheap["node_seconds_total"], "more node-seconds")
    ml.jobs.begin_cancel(name).result()
    assert wait_terminal(ml, name) == "Canceled"
    final = until(lambda: not open_nodes(b := cluster_bill(emulator)) and b, "every node released")
    seconds = final["node_seconds_total"]
    assert final["hourly_price"] == pytest.approx(0.95 * payg, abs=1e-6)
    # the seconds before the change at 20 %, the rest at 95 %: between the two flat bills, below the new one
    assert seconds * 0.2 * payg / 3600 < final["cost"] < seconds * 0.95 * payg / 3600
