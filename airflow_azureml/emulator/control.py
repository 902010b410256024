"""The emulator's control API (``/_emulator/...``): test controls that are not Azure's.

Faults (HTTP faults, cluster evictions and preemptions, capacity), behaviour switches, token expiry,
synthetic jobs, job stalls and unlogged cancels, the request log, the emulator's own bill and prices,
and the page a task's Studio link opens. ``ControlRoutes`` is that part of ``Routes``; nothing here is an
Azure API, and every Azure-shaped answer lives in its concept's module.
"""

from __future__ import annotations

import html

from aiohttp import web

from airflow_azureml.emulator.errors import arm_error, method_not_allowed
from airflow_azureml.emulator.faults import FaultRule


class ControlRoutes:
    """The part of ``Routes`` (emulator.routes) that serves the control API."""

    async def control_bill(self, request: web.Request) -> web.Response:
        """The emulator's own bill (emulator.billing): per cluster, per tier and in total."""
        return web.json_response(self.ws.bill())

    async def control_prices(self, request: web.Request) -> web.Response:
        """``GET`` every size's Spot / Low Priority ratio; ``POST {armSkuName, spot?, low_priority?}`` sets one."""
        if request.method == "GET":
            return web.json_response([self.ws.prices.ratios(sku) for sku in self.ws.prices.spot_ratio])
        if request.method != "POST":
            return method_not_allowed()
        data = await request.json()
        if not isinstance(data, dict) or not data.get("armSkuName"):
            return arm_error(400, "BadRequest", "body must be {armSkuName, spot?, low_priority?}")
        ratios = self.ws.set_price_ratio(
            str(data["armSkuName"]), spot=data.get("spot"), low_priority=data.get("low_priority")
        )
        return web.json_response(ratios)

    async def control_job(self, request: web.Request) -> web.Response:
        job = self.ws.jobs.get(request.match_info["name"])
        if job is None:
            return arm_error(404, "NotFound", "no such job")
        return web.json_response({"job": job.to_arm(self.ws_id), "runDetails": job.to_run_details()})

    async def studio_job_page(self, request: web.Request) -> web.Response:
        """What Studio's job page is to a person: name, status, compute, times, rows. A browser sends no
        bearer token, so this page needs none; it shows nothing a token would guard beyond the job's state."""
        job = self.ws.jobs.get(request.match_info["name"])
        if job is None:
            return arm_error(404, "NotFound", "no such job")
        rows = [
            ("Job", job.name),
            ("Status", job.status),
            ("Compute", job.compute or ""),
            ("Created", job.created.isoformat()),
            ("Ended", job.ended.isoformat() if job.ended else ""),
            ("Rows scored", "" if job.rows_scored is None else str(job.rows_scored)),
            ("Error", (job.error or {}).get("message") or ""),
        ]
        cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
        page = (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(job.name)}</title></head>"
            f"<body><h1>Azure ML emulator: job {html.escape(job.name)}</h1><table>{cells}</table>"
            "<p>A local emulator's page, in place of Azure ML Studio.</p></body></html>"
        )
        return web.Response(text=page, content_type="text/html")

    async def control_jobs(self, request: web.Request) -> web.Response:
        return web.json_response(
            [
                {
                    "name": j.name,
                    "status": j.status,
                    "compute": j.compute,
                    "created": j.created.isoformat(),
                    "ended": j.ended.timestamp() if j.ended else None,
                    "error": (j.error or {}).get("message"),
                    "warnings": [w["message"] for w in j.warnings],
                    "rows_scored": j.rows_scored,
                    "mini_batch_attempts": j.mini_batch_attempts,
                }
                for j in self.ws.jobs.values()
            ]
        )

    async def control_synthetic_jobs(self, request: web.Request) -> web.Response:
        data = await request.json()
        properties = {str(k): str(v) for k, v in (data.get("properties") or {}).items()}
        names = self.ws.create_synthetic_jobs(
            str(data.get("prefix", "synthetic")),
            list(data["durations"]),
            float(data.get("queue_seconds", 0)),
            properties,
        )
        return web.json_response({"jobs": names})

    async def control_requests(self, request: web.Request) -> web.Response:
        since = float(request.query.get("since", "0"))
        entries = [e for e in self.request_log if e["t"] >= since] if since else self.request_log
        return web.json_response(entries[-int(request.query.get("last", "1000")) :])

    async def control_faults(self, request: web.Request) -> web.Response:
        data = await request.json()
        rules = data if isinstance(data, list) else [data]
        try:
            for rule in rules:
                self.plan.add(FaultRule.from_dict(rule))
        except (TypeError, ValueError) as exc:
            return arm_error(400, "BadRequest", str(exc))
        return web.json_response({"rules": len(self.plan.rules)})

    async def control_clear_faults(self, request: web.Request) -> web.Response:
        self.plan.clear()
        return web.json_response({"rules": 0})

    async def control_cluster(self, request: web.Request) -> web.Response:
        name, action = request.match_info["name"], request.match_info["action"]
        data = await request.json() if request.can_read_body else {}
        if action == "preempt":
            return web.json_response({"ended": self.ws.preempt_cluster(name, data.get("form", "canceled"))})
        if action == "evict":
            return web.json_response({"evicted": self.ws.evict_nodes(name, int(data.get("count", 1)))})
        if action == "capacity":
            self.ws.set_capacity(name, data.get("nodes"))
            return web.json_response({"capacity": data.get("nodes")})
        if action == "eviction-rate":
            self.ws.set_eviction_rate(name, float(data.get("rate", 0)))
            return web.json_response({"rate": data.get("rate", 0)})
        return arm_error(404, "NotFound", f"unknown action {action!r}")

    async def control_expire_tokens(self, request: web.Request) -> web.Response:
        return web.json_response({"expired": self.identity.expire_all()})

    async def control_behaviour(self, request: web.Request) -> web.Response:
        """``GET`` the behaviour switches; ``POST {switch: value}`` changes some (400 for unknown ones)."""
        if request.method == "POST":
            return web.json_response(self.ws.set_behaviour(await request.json()))
        if request.method == "GET":
            return web.json_response(self.ws.behaviour.to_dict())
        return method_not_allowed()

    async def control_deployment_behaviour(self, request: web.Request) -> web.Response:
        ep, name = request.match_info["ep"], request.match_info["name"]
        return web.json_response(self.ws.set_deployment_behaviour(ep, name, await request.json()))

    async def control_stall(self, request: web.Request) -> web.Response:
        data = await request.json() if request.can_read_body else {}
        job = self.ws.stall_job(request.match_info["name"], float(data.get("seconds", 30)))
        return web.json_response({"name": job.name, "status": job.status})

    async def control_cancel_unlogged(self, request: web.Request) -> web.Response:
        """Test control: a person's cancel through a path the Activity Log does not see (Studio's, run history's)."""
        job = self.ws.cancel_job(request.match_info["name"])
        return web.json_response({"name": job.name, "status": job.status})
