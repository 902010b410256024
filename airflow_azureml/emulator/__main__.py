"""``python -m airflow_azureml.emulator --data-dir DIR [--port N]``: run until interrupted."""

from __future__ import annotations

import argparse
import signal
import threading

from airflow_azureml.emulator import Emulator


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m airflow_azureml.emulator", description=__doc__)
    parser.add_argument("--data-dir", required=True, help="folder for certificates, datastores and emulator.json")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 = any free port)")
    parser.add_argument("--seed", type=int, default=0, help="seed for random faults")
    parser.add_argument("--mini-batch-seconds", type=float, default=None, help="simulated time per mini-batch")
    parser.add_argument("--node-startup-seconds", type=float, default=None, help="simulated node start-up time")
    parser.add_argument(
        "--kube-cluster",
        action="append",
        default=[],
        metavar="NAME",
        help="write DIR/kubeconfig-NAME.yaml for the Kubernetes cluster NAME (repeatable)",
    )
    args = parser.parse_args(argv)
    from airflow_azureml.emulator import Timing

    timing = Timing()
    if args.mini_batch_seconds is not None:
        timing.mini_batch = args.mini_batch_seconds
    if args.node_startup_seconds is not None:
        timing.node_startup = args.node_startup_seconds
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with Emulator(args.data_dir, port=args.port, seed=args.seed, timing=timing) as emulator:
        print(f"Azure ML emulator listening on {emulator.base_url}", flush=True)
        print(f"connection details: {emulator.data_dir / 'emulator.json'}", flush=True)
        for cluster in args.kube_cluster:
            print(f"kubeconfig for Kubernetes cluster {cluster}: {emulator.kubeconfig(cluster)}", flush=True)
        stop.wait()


if __name__ == "__main__":
    main()
