"""Hourly Linux VM prices: the Azure Retail Prices API (public, no auth), or prices set by hand.

``GET {endpoint}/api/retail/prices?$filter=...`` pages with ``NextPageLink``. Of its items, a node is
billed on the **Consumption**, **primary-region**, **Linux** meter of its size (``productName`` not ending
in ``Windows``): a dedicated node on the pay-as-you-go meter (``skuName`` without suffix), a low-priority
node on the ``" Spot"`` meter, never the legacy ``" Low Priority"`` one (docs/billing.md). Filter values
are case-sensitive, so ARM's stored ``STANDARD_DS3_V2`` is asked for as ``Standard_DS3_v2``.

Cache: a day, in this process and (when a directory is known) in one JSON file, because Airflow runs
every task in a new process; see docs/cost.md. A prices API that cannot be read is never an error:
the price is unknown and the cost report says so.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow_azureml.exceptions import AzureMLConfigError

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://prices.azure.com"
CACHE_SECONDS = 24 * 3600.0
CACHE_FILE = "azureml-retail-prices.json"
MAX_PAGES = 20  # one size in one region is one page; a runaway NextPageLink chain stops here
TIMEOUT = 10.0
TIERS = ("dedicated", "low_priority")

_MEMORY: dict[tuple[str, str, str], tuple[float, dict[str, Any]]] = {}
_LOCK = threading.Lock()


def arm_sku_name(vm_size: str) -> str:
    """The Retail Prices API's ``armSkuName`` for a size in any case: ``STANDARD_DS3_V2`` -> ``Standard_DS3_v2``,
    ``standard_nc6s_v3`` -> ``Standard_NC6s_v3``, ``STANDARD_NC24ADS_A100_V4`` -> ``Standard_NC24ads_A100_v4``.

    Azure's size names: ``Standard_``, a family in capitals, the vCPUs, lower-case feature letters, then
    ``_``-separated parts: ``v<N>`` versions in lower case, accelerators (``A100``) in capitals.
    """
    parts = str(vm_size).strip().split("_")
    if len(parts) < 2 or parts[0].lower() not in ("standard", "basic"):
        return str(vm_size).strip()
    out = [parts[0].capitalize()]
    first = re.fullmatch(r"([A-Za-z]+)([0-9][0-9-]*)([A-Za-z]*)", parts[1])
    out.append(f"{first[1].upper()}{first[2]}{first[3].lower()}" if first else parts[1].upper())
    for part in parts[2:]:
        if re.fullmatch(r"[vV][0-9]+", part):
            out.append(part.lower())
        elif part.isalpha() and len(part) > 3:  # Promo
            out.append(part.capitalize())
        else:
            out.append(part.upper())
    return "_".join(out)


def region_name(location: str | None) -> str:
    """ARM's ``location`` as the API's ``armRegionName`` (``East US`` -> ``eastus``)."""
    return str(location or "").replace(" ", "").lower()


def check_manual_prices(value: Any, where: str) -> dict[str, dict[str, float]]:
    """Prices set by hand, ``{vm_size: {"dedicated": USD/h, "low_priority": USD/h}}``; the sizes in any case.

    Raises ``AzureMLConfigError`` naming ``where`` (the connection or the operator argument). A spot rate
    is never above pay-as-you-go (docs/billing.md rule 3).
    """
    if value in (None, "", {}):
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise AzureMLConfigError(f"{where}: prices must be JSON: {{vm_size: {{tier: USD/hour}}}}.") from None
    if not isinstance(value, Mapping):
        raise AzureMLConfigError(f"{where}: prices must be a mapping {{vm_size: {{tier: USD/hour}}}}.")
    out: dict[str, dict[str, float]] = {}
    for size, rates in value.items():
        if not isinstance(size, str) or not size.strip():
            raise AzureMLConfigError(f"{where}: a VM size name must be a non-empty string, got {size!r}.")
        if not isinstance(rates, Mapping) or not rates:
            raise AzureMLConfigError(f"{where}: prices[{size!r}] must map 'dedicated'/'low_priority' to USD/hour.")
        unknown = sorted(set(map(str, rates)) - set(TIERS))
        if unknown:
            raise AzureMLConfigError(f"{where}: prices[{size!r}] has unknown tier(s) {unknown}; use {list(TIERS)}.")
        checked: dict[str, float] = {}
        for tier, rate in rates.items():
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 0:
                raise AzureMLConfigError(
                    f"{where}: prices[{size!r}][{tier!r}] must be a finite number of USD per hour >= 0, got {rate!r}."
                )
            checked[tier] = float(rate)
        if "dedicated" in checked and "low_priority" in checked and checked["low_priority"] > checked["dedicated"]:
            raise AzureMLConfigError(
                f"{where}: prices[{size!r}]: low_priority ({checked['low_priority']}) is above dedicated "
                f"({checked['dedicated']}); a spot node is never billed above pay-as-you-go."
            )
        out[arm_sku_name(size).lower()] = checked
    return out


def manual_hourly(prices: Mapping[str, Mapping[str, float]], vm_size: str) -> dict[str, float | None] | None:
    """``{"dedicated", "spot"}`` from checked manual prices, or None when the size is not in them."""
    rates = prices.get(arm_sku_name(vm_size).lower())
    if rates is None:
        return None
    return {"dedicated": rates.get("dedicated"), "spot": rates.get("low_priority")}


def pick(items: list[dict[str, Any]], sku: str, region: str) -> dict[str, float | None]:
    """The Linux pay-as-you-go and Spot hourly rates of ``sku`` in ``region`` from the API's items."""
    picked = pick_dated(items, sku, region)
    return {tier: picked[tier] for tier in ("dedicated", "spot")}


def pick_dated(items: list[dict[str, Any]], sku: str, region: str) -> dict[str, Any]:
    """``pick``'s rates, and since when each is in force (``dedicated_from``, ``spot_from``: the meter's
    ``effectiveStartDate`` as the API gives it, or None)."""
    best: dict[str, tuple[str, float]] = {}
    for item in items:
        if not isinstance(item, Mapping):
            continue
        if (
            item.get("armSkuName") != sku
            or region_name(item.get("armRegionName")) != region
            or item.get("type") != "Consumption"
            or item.get("isPrimaryMeterRegion") is False
            or str(item.get("productName", "")).endswith("Windows")
            or item.get("unitOfMeasure") != "1 Hour"
            or item.get("currencyCode", "USD") != "USD"
        ):
            continue
        name = str(item.get("skuName") or item.get("meterName") or "")
        if name.endswith(" Spot"):
            tier = "spot"
        elif name.endswith(" Low Priority"):
            continue  # the legacy meter, priced apart: a low-priority node is billed on the Spot meter
        else:
            tier = "dedicated"
        price = item.get("retailPrice")
        if isinstance(price, bool) or not isinstance(price, (int, float)):
            continue
        start = str(item.get("effectiveStartDate") or "")
        if tier not in best or start > best[tier][0]:  # the rate in force now
            best[tier] = (start, float(price))
    out: dict[str, Any] = {tier: best[tier][1] if tier in best else None for tier in ("dedicated", "spot")}
    out.update({f"{tier}_from": (best[tier][0] or None) if tier in best else None for tier in ("dedicated", "spot")})
    return out


class RetailPrices:
    """Reads (and caches) one size's rates in one region from a Retail Prices API endpoint."""

    def __init__(
        self,
        endpoint: str = DEFAULT_ENDPOINT,
        *,
        verify: str | bool = True,
        cache_dir: str | os.PathLike[str] | None = None,
        get: Callable[..., Any] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.verify = verify
        self.cache_file = Path(cache_dir) / CACHE_FILE if cache_dir else None
        self._get = get
        self.clock = clock
        self.requests = 0

    def hourly(self, vm_size: str, location: str | None) -> dict[str, float | None] | None:
        """``{"dedicated": USD/h, "spot": USD/h}`` (either may be None), or None when the API cannot be read."""
        quote = self.quote(vm_size, location)
        return None if quote is None else {tier: quote[tier] for tier in ("dedicated", "spot")}

    def quote(self, vm_size: str, location: str | None) -> dict[str, Any] | None:
        """``hourly``'s rates with when each took effect (``dedicated_from``, ``spot_from``) and when they were
        read from the API (``retrieved_at``, epoch seconds: a cached quote keeps its own), or None."""
        sku, region = arm_sku_name(vm_size), region_name(location)
        key = (f"{self.endpoint}|{self.cache_file or ''}", sku, region)
        now = self.clock()
        with _LOCK:
            cached = _MEMORY.get(key)
        if cached is not None and now - cached[0] < CACHE_SECONDS:
            return {**cached[1], "retrieved_at": cached[0]}
        from_file = self._read_file(sku, region, now)
        if from_file is not None:
            with _LOCK:
                _MEMORY[key] = from_file
            return {**from_file[1], "retrieved_at": from_file[0]}
        try:
            items = self._fetch(sku, region)
        except Exception as exc:  # network, TLS, 4xx/5xx, a body of another shape: the price is unknown
            log.warning("Could not read prices for %s in %s from %s: %s", sku, region, self.endpoint, exc)
            return None
        rates = pick_dated(items, sku, region)
        with _LOCK:
            _MEMORY[key] = (now, rates)
        self._write_file(sku, region, now, rates)
        return {**rates, "retrieved_at": now}

    def _fetch(self, sku: str, region: str) -> list[dict[str, Any]]:
        query = (
            f"serviceName eq 'Virtual Machines' and priceType eq 'Consumption' "
            f"and armRegionName eq '{region}' and armSkuName eq '{sku}'"
        )
        url: str | None = f"{self.endpoint}/api/retail/prices?$filter={quote(query)}&meterRegion=%27primary%27"
        items: list[dict[str, Any]] = []
        pages = 0
        while url and pages < MAX_PAGES:
            self.requests += 1
            pages += 1
            response = self._request(url)
            body = response.json()
            if not isinstance(body, Mapping) or not isinstance(body.get("Items"), list):
                raise ValueError("the answer has no Items list")
            items.extend(body["Items"])
            url = body.get("NextPageLink") or None
        return items

    def _request(self, url: str) -> Any:
        get = self._get
        if get is None:
            import requests

            get = requests.get
        response = get(url, timeout=TIMEOUT, verify=self.verify)
        response.raise_for_status()
        return response

    # ---------------------------------------------------------------- file cache
    def _read_file(self, sku: str, region: str, now: float) -> tuple[float, dict[str, Any]] | None:
        if self.cache_file is None:
            return None
        try:
            data = json.loads(self.cache_file.read_text())
            entry = data[self.endpoint][f"{sku}|{region}"]
            fetched = float(entry["fetched"])
            if now - fetched >= CACHE_SECONDS or fetched > now:
                return None
            keys = ("dedicated", "spot", "dedicated_from", "spot_from")  # a cache from before has no dates: None
            return fetched, {k: entry.get(k) for k in keys}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _write_file(self, sku: str, region: str, now: float, rates: dict[str, Any]) -> None:
        """Atomic (a temporary file renamed over the old one); a cache that cannot be written is skipped."""
        if self.cache_file is None:
            return
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            try:
                data = json.loads(self.cache_file.read_text())
                data = data if isinstance(data, dict) else {}
            except (OSError, ValueError):
                data = {}
            data.setdefault(self.endpoint, {})[f"{sku}|{region}"] = {"fetched": now, **rates}
            fd, tmp = tempfile.mkstemp(prefix=".prices-", dir=self.cache_file.parent)
            with os.fdopen(fd, "w") as handle:
                json.dump(data, handle)
            os.replace(tmp, self.cache_file)
        except OSError as exc:
            log.info("Could not write the prices cache %s: %s", self.cache_file, exc)


def clear_memory_cache() -> None:
    """Forget the prices read in this process (tests)."""
    with _LOCK:
        _MEMORY.clear()
