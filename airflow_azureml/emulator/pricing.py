"""A local copy of the Azure Retail Prices API (``GET /api/retail/prices``), and the emulator's price book.

Shape, paging (100 items a page, ``NextPageLink`` with ``$skip``) and filter fields follow Microsoft's
"Azure Retail Prices REST API overview". Prices are realistic relative hourly USD rates for the VM sizes
the emulator knows; each size has three Linux meters (pay-as-you-go, `` Spot``, `` Low Priority``), the
same three for Windows (``productName`` ends in ``Windows``), reservations, and a non-primary duplicate,
so a client must choose the meter it means. Billing (``emulator.billing``) uses the same book: a
dedicated node at the Linux pay-as-you-go rate, a low-priority node at the Linux Spot rate (seed 000:
low-priority nodes "are allocated as Spot VMs" and billed "at the current spot rate").
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

PAGE_SIZE = 100  # "For each API request, a maximum of 100 records are returned"
SERVICE_ID = "DZH313Z7MMC8"  # Virtual Machines' serviceId in Microsoft's examples
EFFECTIVE_START = "2024-04-01T00:00:00Z"
WINDOWS_PER_VCPU = 0.046  # Windows licence per vCPU-hour on top of the Linux rate (pricing pages' typical step)
LOW_PRIORITY_RATIO = 0.2  # the legacy Low Priority meter: a fixed 80 % discount

#: armSkuName -> (meter base name, product series, vCPUs, Linux pay-as-you-go USD/hour in eastus, spot ratio)
SIZES: dict[str, tuple[str, str, int, float, float]] = {
    "Standard_DS2_v2": ("DS2 v2", "DSv2 Series", 2, 0.146, 0.30),
    "Standard_DS3_v2": ("DS3 v2", "DSv2 Series", 4, 0.293, 0.35),  # the seeds' cluster and the service default
    "Standard_DS4_v2": ("DS4 v2", "DSv2 Series", 8, 0.585, 0.40),
    "Standard_D4s_v3": ("D4s v3", "Dsv3 Series", 4, 0.192, 0.25),
    "Standard_E4s_v3": ("E4s v3", "Esv3 Series", 4, 0.252, 0.30),
    "Standard_F4s_v2": ("F4s v2", "FSv2 Series", 4, 0.169, 0.28),
    "Standard_NC6s_v3": ("NC6s v3", "NCSv3 Series", 6, 3.06, 0.45),
}
#: armRegionName -> (location, price factor against eastus)
REGIONS: dict[str, tuple[str, float]] = {
    "eastus": ("US East", 1.0),
    "westus2": ("US West 2", 1.0),
    "westeurope": ("EU West", 1.15),
}
#: $filter field (as the docs spell it, case-insensitive) -> item key; priceType is the item's ``type``
FILTER_FIELDS = {
    name.lower(): key
    for name, key in {
        "armRegionName": "armRegionName",
        "location": "location",
        "meterId": "meterId",
        "meterName": "meterName",
        "productId": "productId",
        "skuId": "skuId",
        "productName": "productName",
        "skuName": "skuName",
        "serviceName": "serviceName",
        "serviceId": "serviceId",
        "serviceFamily": "serviceFamily",
        "priceType": "type",
        "type": "type",
        "armSkuName": "armSkuName",
        "currencyCode": "currencyCode",
        "isPrimaryMeterRegion": "isPrimaryMeterRegion",
        "unitOfMeasure": "unitOfMeasure",
        "reservationTerm": "reservationTerm",
    }.items()
}


class PriceError(Exception):
    """A request the prices API refuses (400)."""


@dataclass
class PriceBook:
    """The emulator's prices. Spot is variable (seed 000), so its ratio can be changed while running."""

    spot_ratio: dict[str, float] = field(default_factory=lambda: {k: v[4] for k, v in SIZES.items()})
    low_priority_ratio: dict[str, float] = field(default_factory=lambda: {k: LOW_PRIORITY_RATIO for k in SIZES})
    changed: dict[str, str] = field(default_factory=dict)  # armSkuName -> effectiveStartDate of its last change

    @staticmethod
    def sku(vm_size: str) -> str | None:
        """The catalogue's armSkuName for ``vm_size`` in any case (ARM stores ``STANDARD_DS3_V2``)."""
        return next((k for k in SIZES if k.lower() == str(vm_size).lower()), None)

    def set_ratio(
        self, vm_size: str, *, spot: float | None = None, low_priority: float | None = None
    ) -> dict[str, Any]:
        sku = self.sku(vm_size)
        if sku is None:
            raise PriceError(f"unknown VM size {vm_size!r}; known: {sorted(SIZES)}")
        if spot is None and low_priority is None:
            raise PriceError("give a spot and/or a low_priority ratio")
        for name, value in (("spot", spot), ("low_priority", low_priority)):
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                # seed 000: "never charged more than the pay-as-you-go price for the same VM size"
                raise PriceError(f"{name} ratio must be a number in (0, 1], got {value!r}")
            (self.spot_ratio if name == "spot" else self.low_priority_ratio)[sku] = float(value)
        self.changed[sku] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        return self.ratios(sku)

    def ratios(self, sku: str) -> dict[str, Any]:
        return {"armSkuName": sku, "spot": self.spot_ratio[sku], "low_priority": self.low_priority_ratio[sku]}

    def hourly(self, vm_size: str, region: str, *, low_priority: bool) -> tuple[float, str] | None:
        """What one node of ``vm_size`` in ``region`` is billed per hour, and the meter it is billed on."""
        sku = self.sku(vm_size)
        if sku is None:
            return None
        base, _, _, payg, _ = SIZES[sku]
        factor = REGIONS.get(_region(region), REGIONS["eastus"])[1]
        if low_priority:
            return round(payg * factor * self.spot_ratio[sku], 6), f"{base} Spot"
        return round(payg * factor, 6), base

    def items(self) -> list[dict[str, Any]]:
        """Every meter, in a fixed order that is not grouped by size or tier (as the real API's is not)."""
        out: list[dict[str, Any]] = []
        for sku, (base, series, vcpus, payg, _) in SIZES.items():
            for region, (location, factor) in REGIONS.items():
                linux = payg * factor
                windows = linux + WINDOWS_PER_VCPU * vcpus * factor
                for os_suffix, price in (("", linux), (" Windows", windows)):
                    product = f"Virtual Machines {series}{os_suffix}"
                    for tier, ratio in (
                        ("", 1.0),
                        (" Spot", self.spot_ratio[sku]),
                        (" Low Priority", self.low_priority_ratio[sku]),
                    ):
                        changed = tier == " Spot" and self.changed.get(sku)
                        out.append(_item(sku, region, location, product, base + tier, price * ratio, changed or None))
                product = f"Virtual Machines {series}"
                for term, hours in (("1 Year", 8760 * 0.62), ("3 Years", 26280 * 0.40)):
                    item = _item(sku, region, location, product, base, linux * hours, None, kind="Reservation")
                    out.append({**item, "reservationTerm": term, "meterId": _uuid(sku, region, term)})
                duplicate = _item(sku, region, location, product, base, linux, None)  # a non-primary meter
                out.append({**duplicate, "meterId": _uuid(sku, region, "secondary"), "isPrimaryMeterRegion": False})
        out.sort(key=lambda i: i["meterId"])
        return out


def _region(name: str) -> str:
    return str(name or "eastus").replace(" ", "").lower()


def _uuid(*parts: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "airflow-azureml-prices/" + "/".join(parts)))


def _code(*parts: str) -> str:
    digest = hashlib.sha256("/".join(parts).encode()).digest()
    alphabet = "0123456789ABCDEFGHJKLMNPQRSTVWXZ"
    return "DZH318Z0" + "".join(alphabet[b % len(alphabet)] for b in digest[:4])


def _item(
    sku: str,
    region: str,
    location: str,
    product: str,
    meter: str,
    price: float,
    changed: str | None,
    *,
    kind: str = "Consumption",
) -> dict[str, Any]:
    """One item, with the fields (and order) of Microsoft's example response."""
    product_id = _code(product)
    price = round(price, 6)
    return {
        "currencyCode": "USD",
        "tierMinimumUnits": 0.0,
        "retailPrice": price,
        "unitPrice": price,
        "armRegionName": region,
        "location": location,
        "effectiveStartDate": changed or EFFECTIVE_START,
        "meterId": _uuid(sku, region, product, meter),
        "meterName": meter,
        "productId": product_id,
        "skuId": f"{product_id}/{_code(product, meter)[-4:]}",
        "productName": product,
        "skuName": meter,
        "serviceName": "Virtual Machines",
        "serviceId": SERVICE_ID,
        "serviceFamily": "Compute",
        "unitOfMeasure": "1 Hour",
        "type": kind,
        "isPrimaryMeterRegion": True,
        "armSkuName": sku,
    }


# --------------------------------------------------------------- $filter
_TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>-?\d+(?:\.\d+)?)|(?P<op>[(),])|(?P<word>[A-Za-z_]\w*))")


def _tokens(text: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise PriceError(f"Invalid $filter near {text[pos : pos + 20]!r}")
        pos = match.end()
        if match["str"] is not None:
            out.append(("value", match["str"][1:-1].replace("''", "'")))
        elif match["num"] is not None:
            out.append(("value", float(match["num"])))
        elif match["op"] is not None:
            out.append(("op", match["op"]))
        else:
            word = match["word"]
            lowered = word.lower()
            if lowered in ("true", "false"):
                out.append(("value", lowered == "true"))
            elif lowered in ("and", "or", "not", "eq", "ne", "contains", "startswith", "endswith"):
                out.append(("kw", lowered))
            else:
                out.append(("field", word))
    return out


class _Parser:
    """OData's subset that clients use: ``eq``/``ne``, ``and``/``or``/``not``, parentheses,
    ``contains``/``startswith``/``endswith``. Values are case-sensitive (2023-01-01-preview and later;
    the least convenient case for every version)."""

    def __init__(self, text: str) -> None:
        self.tokens = _tokens(text)
        self.pos = 0

    def parse(self) -> Any:
        node = self._or()
        if self.pos != len(self.tokens):
            raise PriceError(f"Invalid $filter: unexpected {self.tokens[self.pos][1]!r}")
        return node

    def _peek(self) -> tuple[str, Any] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self, kind: str, value: Any = None) -> Any:
        token = self._peek()
        if token is None or token[0] != kind or (value is not None and token[1] != value):
            raise PriceError(f"Invalid $filter: expected {value or kind}, got {token[1] if token else 'the end'!r}")
        self.pos += 1
        return token[1]

    def _or(self) -> Any:
        node = self._and()
        while self._peek() == ("kw", "or"):
            self.pos += 1
            node = ("or", node, self._and())
        return node

    def _and(self) -> Any:
        node = self._not()
        while self._peek() == ("kw", "and"):
            self.pos += 1
            node = ("and", node, self._not())
        return node

    def _not(self) -> Any:
        if self._peek() == ("kw", "not"):
            self.pos += 1
            return ("not", self._not())
        return self._atom()

    def _atom(self) -> Any:
        token = self._peek()
        if token == ("op", "("):
            self.pos += 1
            node = self._or()
            self._take("op", ")")
            return node
        if token is not None and token[0] == "kw" and token[1] in ("contains", "startswith", "endswith"):
            self.pos += 1
            self._take("op", "(")
            key = _field(self._take("field"))
            self._take("op", ",")
            value = self._take("value")
            self._take("op", ")")
            return (token[1], key, value)
        key = _field(self._take("field"))
        token = self._peek()
        if token not in (("kw", "eq"), ("kw", "ne")):
            raise PriceError(f"Invalid $filter: expected eq or ne after {key!r}")
        self.pos += 1
        return (token[1], key, self._take("value"))


def _field(name: str) -> str:
    key = FILTER_FIELDS.get(name.lower())
    if key is None:
        raise PriceError(f"Invalid $filter: {name!r} is not a field that can be filtered on")
    return key


def _matches(node: Any, item: dict[str, Any]) -> bool:
    op = node[0]
    if op == "and":
        return _matches(node[1], item) and _matches(node[2], item)
    if op == "or":
        return _matches(node[1], item) or _matches(node[2], item)
    if op == "not":
        return not _matches(node[1], item)
    value = item.get(node[1])
    if op == "eq":
        return value == node[2]
    if op == "ne":
        return value != node[2]
    if not isinstance(value, str) or not isinstance(node[2], str):
        return False
    return {"contains": value.__contains__, "startswith": value.startswith, "endswith": value.endswith}[op](node[2])


def retail_prices(book: PriceBook, query: dict[str, str], base_url: str) -> dict[str, Any]:
    """The API's answer to ``GET /api/retail/prices`` with ``query``: one page of at most 100 items."""
    currency = query.get("currencyCode", "USD").strip("'\"")
    if currency != "USD":
        raise PriceError(f"currencyCode {currency!r}: this emulator serves USD prices only")
    items = book.items()
    text = query.get("$filter", "").strip()
    if text:
        tree = _Parser(text).parse()
        items = [i for i in items if _matches(tree, i)]
    if query.get("meterRegion", "").strip("'\"").lower() == "primary":
        items = [i for i in items if i["isPrimaryMeterRegion"]]
    try:
        skip = int(query.get("$skip", "0"))
    except ValueError:
        raise PriceError(f"$skip must be an integer, got {query.get('$skip')!r}") from None
    if skip < 0:
        raise PriceError("$skip must be >= 0")
    page = items[skip : skip + PAGE_SIZE]
    next_link = None
    if skip + PAGE_SIZE < len(items):
        params = {k: v for k, v in query.items() if k != "$skip"}
        params["$skip"] = str(skip + PAGE_SIZE)
        next_link = f"{base_url}/api/retail/prices?{urlencode(params, safe='$', quote_via=quote)}"
    return {
        "BillingCurrency": "USD",
        "CustomerEntityId": "Default",
        "CustomerEntityType": "Retail",
        "Items": page,
        "NextPageLink": next_link,
        "Count": len(page),
    }
