"""``airflow azureml bill``: the bill of a range of DAG runs, as an Airflow CLI command.

Registered through ``get_provider_info``'s ``cli`` list, which Airflow 3.2+ reads when it builds its parser
(3.1 ignores it: ``python -m airflow_azureml.cost`` works on every version). Airflow calls
``get_azureml_cli_commands`` on every ``airflow`` invocation, so this module imports nothing heavy; the
command itself (``backfill_bill``) is loaded only when it runs.
"""

from __future__ import annotations

import argparse
from typing import Any

DESCRIPTION = (
    "The Azure ML bill of a DAG's runs in a range of logical dates (a backfill), from the job tasks' azureml_cost "
    "XComs, read through Airflow's REST API."
)
# (flags, argparse keywords) of each argument, for both entry points; kept here, where importing is cheap
ARGUMENTS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--dag-id",), {"required": True, "help": "the DAG whose runs are billed"}),
    (("--from",), {"dest": "start", "required": True, "help": "first logical date: YYYY-MM-DD or ISO 8601"}),
    (("--to",), {"dest": "end", "required": True, "help": "last logical date, inclusive: YYYY-MM-DD or ISO 8601"}),
    (("--run-type",), {"help": "only runs of this type, e.g. backfill"}),
    (("--conn-id",), {"help": "the api-server's Airflow connection (default: airflow_api)"}),
    (("--json",), {"action": "store_true", "help": "print the bill as JSON"}),
    (("--no-metrics",), {"action": "store_true", "help": "do not send the bill as metrics"}),
]


def get_azureml_cli_commands() -> list[Any]:
    from airflow.cli.cli_config import ActionCommand, Arg, GroupCommand, lazy_load_command

    bill = ActionCommand(
        name="bill",
        help="The Azure ML bill of a DAG's runs in a range of logical dates (a backfill)",
        description=DESCRIPTION,
        func=lazy_load_command("airflow_azureml.cli.bill_command"),
        args=tuple(Arg(flags, **kwargs) for flags, kwargs in ARGUMENTS),
    )
    return [GroupCommand(name="azureml", help="Azure ML provider commands (airflow-azureml)", subcommands=(bill,))]


def bill_command(args: argparse.Namespace) -> None:
    """Bad input ends with exit code 2 before any call, as ``python -m airflow_azureml.cost`` does."""
    import sys

    from airflow_azureml import backfill_bill

    try:
        start, end = backfill_bill.checked(args)
    except ValueError as exc:
        print(f"airflow azureml bill: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    code = backfill_bill.run(args, start, end)
    if code:
        raise SystemExit(code)
