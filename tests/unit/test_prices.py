"""hooks/prices.py: the meter a node is billed on, paging, the day's cache, prices set by hand.

HTTP is replaced at the edge (``RetailPrices(get=...)``) by pages built from the emulator's price book,
which has every meter a client must leave out (Windows, Low Priority, reservations, non-primary).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest

from airflow_azureml.emulator.pricing import PriceBook, retail_prices
from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.hooks import prices
from airflow_azureml.hooks.connection import parse_connection

BASE = "https://prices.example"


@pytest.fixture(autouse=True)
def _fresh_memory() -> None:
    prices.clear_memory_cache()


class FakeApi:
    """The prices API over the emulator's price book; records the URLs asked for."""

    def __init__(self, book: PriceBook | None = None, fail: Exception | None = None) -> None:
        self.book = book or PriceBook()
        self.fail = fail
        self.urls: list[str] = []

    def __call__(self, url: str, timeout: float, verify: Any) -> Any:
        self.urls.append(url)
        if self.fail is not None:
            raise self.fail
        query = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
        body = retail_prices(self.book, query, BASE)
        return SimpleNamespace(json=lambda: body, raise_for_status=lambda: None)


@pytest.mark.parametrize(
    ("stored", "sku"),
    [
        ("STANDARD_DS3_V2", "Standard_DS3_v2"),
        ("STANDARD_DS3_v2", "Standard_DS3_v2"),
        ("standard_nc6s_v3", "Standard_NC6s_v3"),
        ("Standard_D4s_v3", "Standard_D4s_v3"),
        ("STANDARD_NC24ADS_A100_V4", "Standard_NC24ads_A100_v4"),
        ("STANDARD_E4-2S_V3", "Standard_E4-2s_v3"),
        ("STANDARD_F4S_V2", "Standard_F4s_v2"),
    ],
)
def test_arm_sku_name_from_the_case_arm_stores(stored: str, sku: str) -> None:
    assert prices.arm_sku_name(stored) == sku


def test_pick_takes_linux_consumption_primary_and_the_spot_meter_not_low_priority() -> None:
    book = PriceBook()
    book.set_ratio("Standard_DS3_v2", spot=0.35, low_priority=0.2)
    rates = prices.pick(book.items(), "Standard_DS3_v2", "eastus")
    assert rates == {"dedicated": 0.293, "spot": pytest.approx(0.293 * 0.35, abs=1e-6)}
    assert prices.pick(book.items(), "Standard_DS3_v2", "westeurope")["dedicated"] == pytest.approx(0.293 * 1.15)
    assert prices.pick(book.items(), "Standard_X1", "eastus") == {"dedicated": None, "spot": None}


def test_reads_one_size_with_a_case_sensitive_filter_and_follows_next_page_link(tmp_path: Path) -> None:
    api = FakeApi()
    rates = prices.RetailPrices(BASE, get=api, cache_dir=tmp_path).hourly("STANDARD_DS3_V2", "East US")
    assert rates == {"dedicated": 0.293, "spot": pytest.approx(0.293 * 0.35, abs=1e-6)}
    asked = unquote(api.urls[0])
    assert "armSkuName eq 'Standard_DS3_v2'" in asked and "armRegionName eq 'eastus'" in asked
    assert "priceType eq 'Consumption'" in asked
    # every page is read: a filter wide enough to need two pages
    many = prices.RetailPrices(BASE, get=FakeApi())
    assert len(many._fetch("Standard_DS3_v2", "eastus")) < 100  # one size, one region: one page
    paged = FakeApi()
    client = prices.RetailPrices(BASE, get=paged)
    wide = BASE + "/api/retail/prices?$filter=" + quote("serviceName eq 'Virtual Machines'")
    client._request = lambda url: paged(url if "$skip" in url else wide, 1, True)
    assert len(client._fetch("Standard_DS3_v2", "eastus")) > 100 and len(paged.urls) >= 2


def test_a_day_in_memory_and_on_file_then_read_again(tmp_path: Path) -> None:
    now = [1_000_000.0]
    api = FakeApi()
    client = prices.RetailPrices(BASE, get=api, cache_dir=tmp_path, clock=lambda: now[0])
    client.hourly("Standard_DS3_v2", "eastus")
    client.hourly("Standard_DS3_v2", "eastus")
    assert len(api.urls) == 1
    prices.clear_memory_cache()  # a new task process: the file answers
    again = prices.RetailPrices(BASE, get=api, cache_dir=tmp_path, clock=lambda: now[0])
    assert again.hourly("Standard_DS3_v2", "eastus")["dedicated"] == 0.293 and len(api.urls) == 1
    cached = json.loads((tmp_path / prices.CACHE_FILE).read_text())
    assert cached[BASE]["Standard_DS3_v2|eastus"]["dedicated"] == 0.293
    assert [p.name for p in tmp_path.iterdir()] == [prices.CACHE_FILE]  # no temporary file left
    now[0] += prices.CACHE_SECONDS + 1  # a day later: read again
    prices.clear_memory_cache()
    again.hourly("Standard_DS3_v2", "eastus")
    assert len(api.urls) == 2


def test_an_unreachable_prices_api_is_an_unknown_price_not_an_error(tmp_path: Path) -> None:
    api = FakeApi(fail=ConnectionError("no route to host"))
    assert prices.RetailPrices(BASE, get=api, cache_dir=tmp_path).hourly("Standard_DS3_v2", "eastus") is None
    assert not (tmp_path / prices.CACHE_FILE).exists()  # nothing cached: the next task tries again


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("not json", "JSON"),
        ([1, 2], "mapping"),
        ({"Standard_DS3_v2": 0.2}, "must map"),
        ({"Standard_DS3_v2": {"spot": 0.1}}, "unknown tier"),
        ({"Standard_DS3_v2": {"dedicated": -1}}, ">= 0"),
        ({"Standard_DS3_v2": {"dedicated": float("nan")}}, "finite"),
        ({"Standard_DS3_v2": {"dedicated": True}}, "number"),
        ({"Standard_DS3_v2": {"dedicated": 0.1, "low_priority": 0.2}}, "above dedicated"),
    ],
)
def test_bad_manual_prices_are_config_errors(value: Any, message: str) -> None:
    with pytest.raises(AzureMLConfigError, match=message):
        prices.check_manual_prices(value, "here")


def test_manual_prices_match_the_size_in_any_case() -> None:
    table = prices.check_manual_prices('{"Standard_DS3_v2": {"dedicated": 0.229, "low_priority": 0.046}}', "here")
    assert prices.manual_hourly(table, "STANDARD_DS3_V2") == {"dedicated": 0.229, "spot": 0.046}
    assert prices.manual_hourly(table, "Standard_D4s_v3") is None


def _conn(**extra: Any) -> SimpleNamespace:
    base = {"subscription_id": "s", "resource_group": "r", "workspace_name": "w"}
    return SimpleNamespace(conn_id="c", extra_dejson={**base, **extra}, login=None, password=None)


def test_connection_extras_for_prices() -> None:
    settings = parse_connection(
        _conn(prices_endpoint="https://mirror.example/", prices={"Standard_DS3_v2": {"dedicated": 1}})
    )
    assert settings.prices_endpoint == "https://mirror.example"
    assert settings.manual_prices == {"standard_ds3_v2": {"dedicated": 1.0}}
    assert parse_connection(_conn()).prices_endpoint is None  # Azure's public API
    with pytest.raises(AzureMLConfigError, match="prices"):
        parse_connection(_conn(prices={"Standard_DS3_v2": {"dedicated": "cheap"}}))
    with pytest.raises(AzureMLConfigError, match="prices_endpoint"):
        parse_connection(_conn(prices_endpoint="ftp://x"))


def test_operator_prices_are_checked_before_any_api_call(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_azureml.operators import AzureMLInvokeBatchEndpointOperator

    def no_azure(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an API call before the input was checked")

    monkeypatch.setattr("airflow_azureml.hooks.azure_ml.AzureMLHook.get_conn", no_azure)
    monkeypatch.setattr("airflow_azureml.hooks.azure_ml.AzureMLHook.rest", no_azure)
    op = AzureMLInvokeBatchEndpointOperator(
        task_id="t",
        endpoint_name="e",
        inputs={"x": "azureml://datastores/d/paths/p/"},
        prices={"Standard_DS3_v2": {"dedicated": 0.1, "low_priority": 0.5}},
    )
    with pytest.raises(AzureMLConfigError, match="above dedicated"):
        op.validate()


def test_a_quote_says_since_when_each_rate_is_in_force_and_when_it_was_read(tmp_path: Path) -> None:
    """The cost report names the price and its time (issue 22 section 3): a spot price change moves the Spot
    meter's effectiveStartDate, and a cached quote keeps the time it was read, in memory and on file."""
    book = PriceBook()
    now = [2_000_000.0]
    client = prices.RetailPrices(BASE, get=FakeApi(book), cache_dir=tmp_path, clock=lambda: now[0])
    first = client.quote("Standard_DS3_v2", "eastus")
    assert first is not None and first["retrieved_at"] == 2_000_000.0
    assert first["spot_from"] == first["dedicated_from"] == "2024-04-01T00:00:00Z"
    now[0] += 60
    assert client.quote("Standard_DS3_v2", "eastus") == first  # from memory: read at the same time
    prices.clear_memory_cache()
    assert (
        prices.RetailPrices(BASE, cache_dir=tmp_path, clock=lambda: now[0]).quote("Standard_DS3_v2", "eastus") == first
    )
    book.set_ratio("Standard_DS3_v2", spot=0.5)  # the spot price moves
    now[0] += prices.CACHE_SECONDS
    prices.clear_memory_cache()
    moved = client.quote("Standard_DS3_v2", "eastus")
    assert moved is not None and moved["spot"] == pytest.approx(0.293 * 0.5) and moved["spot_from"] > "2024-04-01"
    assert moved["retrieved_at"] == now[0] and client.hourly("Standard_DS3_v2", "eastus") == {
        "dedicated": 0.293,
        "spot": pytest.approx(0.293 * 0.5),
    }


def test_the_bill_names_the_price_and_its_time() -> None:
    from airflow_azureml import cost

    usage = {
        "v": 1,
        "computes": {"spot-c": {"vm_size": "STANDARD_DS3_V2", "location": "eastus", "tier": "low_priority"}},
        "spans": [
            {"job": "j", "compute": "spot-c", "points": [[0.0, 0, 2, 0, 0, 0, 0]], "end": 3600.0, "statuses": []}
        ],
    }
    quote = {
        "dedicated": 0.293,
        "spot": 0.1,
        "source": "Retail Prices API (https://prices.azure.com)",
        "retrieved_at": "2026-12-05T22:00:00+00:00",
        "effective_from": {"dedicated": "2024-04-01T00:00:00Z", "spot": "2026-12-01T00:00:00Z"},
    }
    bill = cost.estimate(usage, {"spot-c": quote})
    entry = bill["computes"]["spot-c"]
    assert (entry["price_effective_from"], entry["price_retrieved_at"]) == (
        "2026-12-01T00:00:00Z",
        "2026-12-05T22:00:00+00:00",
    )
    assert "rate in force since 2026-12-01T00:00:00Z, read 2026-12-05T22:00:00+00:00" in cost.format_bill(bill)
    again = cost.run_bill([{**bill, "usage": usage}])["computes"]["spot-c"]
    assert (
        again["price_effective_from"] == "2026-12-01T00:00:00Z" and again["price_retrieved_at"] == quote["retrieved_at"]
    )


def test_a_rate_that_took_effect_during_the_usage_is_said() -> None:
    from airflow_azureml import cost

    usage = {
        "v": 1,
        "computes": {"spot-c": {"vm_size": "STANDARD_DS3_V2", "location": "eastus", "tier": "low_priority"}},
        "spans": [
            {"job": "j", "compute": "spot-c", "points": [[1_780_000_000.0, 0, 2, 0, 0, 0, 0]], "end": 1_780_003_600.0}
        ],
    }
    during = cost.iso_time(1_780_001_800.0)
    bill = cost.estimate(usage, {"spot-c": {"dedicated": 0.3, "spot": 0.1, "effective_from": {"spot": during}}})
    assert bill["computes"]["spot-c"]["price_changed_during"] is True
    assert "took effect during this usage" in cost.format_bill(bill)
    before = cost.iso_time(1_779_000_000.0)
    bill = cost.estimate(usage, {"spot-c": {"dedicated": 0.3, "spot": 0.1, "effective_from": {"spot": before}}})
    assert "price_changed_during" not in bill["computes"]["spot-c"]
