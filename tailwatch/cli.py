"""`tailwatch` command line: serve, migrate, detect, sql, export, simulate."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from tailwatch import __version__
from tailwatch.settings import CONFIG_ENV, Settings, SettingsError, load_settings

log = logging.getLogger("tailwatch")


class _Command(argparse.ArgumentParser):
    """A command's parser. With `describe`, its description is written only when its help is shown, so the
    simulate command can list the simulator's scenarios without every other command importing it."""

    def __init__(self, *args: Any, describe: Callable[[], str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._describe = describe

    def format_help(self) -> str:
        if self._describe is not None:
            self.description = self._describe()
        return super().format_help()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tailwatch",
        description="Trace analytics for LLM serving: an OTLP export target with tail-latency detectors.",
        epilog="Configuration: a YAML file (--config or TAILWATCH_CONFIG), TAILWATCH_* environment variables, "
        "then flags; later ones win. See docs/configuration.md.",
    )
    parser.add_argument("--version", action="version", version=f"tailwatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Command)

    serve = sub.add_parser(
        "serve",
        help="run the OTLP receivers, the scheduler and the API (migrates the database first)",
        description="Run the OTLP/gRPC and OTLP/HTTP receivers and the Tailwatch API until SIGTERM or Ctrl-C. "
        "The database is migrated to the newest schema on start.",
    )
    _common(serve)
    serve.add_argument("--host", help="address to bind every port to (default 127.0.0.1; 0.0.0.0 for all)")
    serve.add_argument("--grpc-port", type=int, help="OTLP/gRPC port (default 4317)")
    serve.add_argument("--http-port", type=int, help="OTLP/HTTP port (default 4318)")
    serve.add_argument("--api-port", type=int, help="Tailwatch API port (default 4319)")
    serve.set_defaults(run=_serve)

    mig = sub.add_parser(
        "migrate",
        help="upgrade the database schema to the newest version (Alembic upgrade head)",
        description="Create or upgrade the database schema. Run it while no `tailwatch serve` holds the file; "
        "serve also migrates on start.",
    )
    _common(mig)
    mig.set_defaults(run=_migrate)

    det = sub.add_parser(
        "detect",
        help="evaluate detectors once, exactly as the scheduler would at a given time",
        description="Evaluate detectors once and persist their figures and alerts, through the same code path "
        "as the scheduler. With --at, evaluate as the scheduler would have at that wall-clock time, to replay "
        "history. With --from and --to, evaluate every window of the range as history, oldest first: figures "
        "and SLO minutes, no alerts or notifications. Needs the database file to itself: stop `serve` first.",
    )
    _common(det)
    how = det.add_mutually_exclusive_group(required=True)
    how.add_argument("--once", action="store_true", help="evaluate once (with --at: as of then) and exit")
    how.add_argument(
        "--from",
        dest="start",
        metavar="ISO8601",
        type=_timestamp,
        help="backfill: evaluate each detector at every point of its interval grid from this time",
    )
    det.add_argument(
        "--to", dest="end", metavar="ISO8601", type=_timestamp, help="with --from: up to this time (default: now)"
    )
    det.add_argument(
        "--at",
        metavar="ISO8601",
        type=_timestamp,
        help="evaluation time, e.g. 2026-11-21T12:00:00Z (default: now); naive times are UTC",
    )
    det.add_argument(
        "--detector",
        metavar="NAME",
        action="append",
        help="a detector key to run (repeatable; default: every enabled detector)",
    )
    det.set_defaults(run=_detect)

    q = sub.add_parser(
        "sql",
        help="run one read-only SQL statement against a running service or the database file",
        description="Run one SELECT (or EXPLAIN) and print its rows. Talks to a running service by --url; with "
        "--db, or when no process holds the configured database file, opens the file read-only itself. Either "
        "way the statement is read-only, time-limited (sql.timeout_seconds) and capped (sql.max_rows). "
        "The tables, views and a cookbook are in docs/sql.md.",
    )
    q.add_argument("statement", help='the SQL, e.g. "SELECT * FROM token_latency_5m LIMIT 10"')
    q.add_argument("--format", choices=["table", "csv", "json"], default="table", help="output (default table)")
    _target(q)
    q.set_defaults(run=_sql)

    ex = sub.add_parser(
        "export",
        help="write requests, scores and spans in a time range as Parquet partitioned by date and tenant",
        description="Write the rows whose end_time is in [--since, --until) under DIR/<dataset>/date=YYYY-MM-DD/"
        "tenant_id=T/ as Parquet, for DuckDB, Polars, pandas or Spark (hive partitioning). Datasets: requests "
        "(llm_requests), scores (llm_request_scores with the request's tenant), spans (every stored span). "
        "A second export into the same DIR replaces the partitions it writes.",
    )
    ex.add_argument("--since", type=_timestamp, required=True, help="start, ISO 8601 (inclusive)")
    ex.add_argument("--until", type=_timestamp, required=True, help="end, ISO 8601 (exclusive)")
    ex.add_argument("--to", metavar="DIR", required=True, help="directory to write into")
    ex.add_argument(
        "--dataset",
        action="append",
        choices=["requests", "scores", "spans"],
        help="what to export (repeatable; default all three)",
    )
    _target(ex)
    ex.set_defaults(run=_export)

    sim = sub.add_parser(
        "simulate",
        help="send realistic LLM-serving spans with a planted cause to an OTLP endpoint",
        describe=_simulate_description,
    )
    sim.add_argument("--scenario", required=True, help="scenario name(s), comma-separated")
    sim.add_argument(
        "--endpoint",
        default=None,
        help="OTLP endpoint (default localhost:4317 for grpc, http://localhost:4318 for http)",
    )
    sim.add_argument("--protocol", choices=["grpc", "http"], default="grpc", help="OTLP transport (default grpc)")
    sim.add_argument(
        "--emitter",
        choices=["attributes", "vllm"],
        default="attributes",
        help="what the fleet sends. attributes (default): one span per request carrying tenant, queue depth, "
        "cache hits, quantization and scores as attributes. vllm: vLLM 0.33's own timing-only span under a "
        "gateway span that names the tenant and model, scores as gen_ai.evaluation.result log records, and each "
        "replica's vllm:* engine metrics every 5 s as OTLP metrics, as the OpenTelemetry Collector forwards a "
        "scrape; queue depth, replicas and cache hits then come from the engine metrics",
    )
    sim.add_argument("--seed", type=int, default=42, help="random seed: the same seed sends the same spans")
    sim.add_argument("--end", type=_timestamp, help="end of the fault window, ISO 8601 (default: 30 s before now)")
    sim.add_argument(
        "--history-hours", type=float, default=2.0, help="healthy history before the fault window (default 2)"
    )
    sim.add_argument("--history-rate", type=float, default=0.5, help="requests per second in the history (default 0.5)")
    sim.add_argument(
        "--rate", type=float, default=4.0, help="requests per second in the fault window and live (default 4)"
    )
    sim.add_argument("--live-seconds", type=float, default=0.0, help="then stream live healthy traffic this long")
    sim.add_argument("--list", action="store_true", help="list the scenarios with their planted cause and exit")
    sim.set_defaults(run=_simulate)
    return parser


def _simulate_description() -> str:
    from simulator.scenarios import SCENARIOS

    return (
        "Generate LLM request spans (tenants, replicas, token counts, latencies, cache hits, queue "
        "depth, quantization, quality scores) and send them through the OpenTelemetry SDK exporter: a healthy "
        "history for baselines, then a fault window ending at --end with the scenario's cause planted, then "
        "optionally live traffic. Scenarios: " + ", ".join(SCENARIOS) + ". Combine them with commas. "
        "With --emitter vllm the same requests arrive as a real fleet sends them with nothing custom "
        "(docs/simulate.md)."
    )


def _simulate(settings: Settings, args: argparse.Namespace) -> int:
    from simulator.scenarios import SCENARIOS

    if args.list:
        for name, scenario in SCENARIOS.items():
            print(f"{name}: {scenario.truth}")
        return 0
    names = [n.strip() for n in args.scenario.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"tailwatch: unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    try:
        from simulator.simulate import run
    except ModuleNotFoundError as exc:
        # The SDK is the simulate extra's, not the service's: say how to get it rather than a traceback.
        if not (exc.name or "").startswith("opentelemetry"):
            raise
        print(
            f"tailwatch: simulate sends through the OpenTelemetry SDK, which is not installed (no module {exc.name}); "
            "install it with scripts/setup or pip install 'tailwatch[simulate]'",
            file=sys.stderr,
        )
        return 1
    endpoint = args.endpoint or ("localhost:4317" if args.protocol == "grpc" else "http://localhost:4318")
    end = args.end or (datetime.now(UTC).replace(tzinfo=None, microsecond=0) - timedelta(seconds=30))
    sent = run(
        names, endpoint=endpoint, protocol=args.protocol, seed=args.seed, end=end, history_hours=args.history_hours,
        history_rate=args.history_rate, rate=args.rate, live_seconds=args.live_seconds, emitter=args.emitter,
    )  # fmt: skip
    at = end + timedelta(seconds=30)
    print(f"sent {sent} requests ({args.emitter} emitter); fault window ends {end.isoformat()}Z")
    for name in names:
        print(f"  {name}: {SCENARIOS[name].truth}")
    print(
        "evaluate it now (the scheduler would at its next 5-minute mark):\n"
        f'  curl -s -X POST localhost:4319/v1/detect -d \'{{"at": "{at.isoformat()}Z"}}\''
    )
    return 0


def _timestamp(text: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    return parsed.astimezone(UTC).replace(tzinfo=None) if parsed.tzinfo else parsed


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help=f"YAML settings file (default: ${CONFIG_ENV} if set)")
    p.add_argument("--db", metavar="PATH", help="DuckDB database file (default ./tailwatch.duckdb, or $TAILWATCH_DB)")


def _target(p: argparse.ArgumentParser) -> None:
    _common(p)
    p.add_argument("--url", help="a running service's API, e.g. http://127.0.0.1:4319 (default: the configured one)")
    p.add_argument("--token", help="API bearer token (default: api.token, e.g. $TAILWATCH_API__TOKEN)")


def _analyst(run: Any) -> Any:
    """A command that talks to a service or a file: its failures are one line on stderr and exit code 1."""

    def wrapped(settings: Settings, args: argparse.Namespace) -> int:
        # Imported here so `tailwatch --help` does not load Arrow and Polars.
        from storage.export import ExportError
        from tailwatch.client import ClientError, Target

        if args.url and args.db:
            raise SettingsError("give --url or --db, not both")
        try:
            code: int = run(settings, args, Target.resolve(settings, args.url, args.db, args.token))
        except (ClientError, ExportError) as exc:
            print(f"tailwatch: {exc}", file=sys.stderr)
            return 1
        return code

    return wrapped


@_analyst
def _sql(settings: Settings, args: argparse.Namespace, target: Any) -> int:
    answer = target.sql(args.statement, args.format)
    text = answer.body if isinstance(answer.body, str) else answer.body.decode()
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    if answer.truncated:
        print(
            f"tailwatch: truncated at sql.max_rows ({settings.sql.max_rows}) rows; aggregate, add a LIMIT, "
            "or use `tailwatch export` for everything",
            file=sys.stderr,
        )
    return 0


@_analyst
def _export(settings: Settings, args: argparse.Namespace, target: Any) -> int:
    from pathlib import Path

    for dataset in args.dataset or ["requests", "scores", "spans"]:
        rows = target.export(dataset, args.since, args.until, Path(args.to))
        print(f"{dataset}: {rows} rows -> {Path(args.to) / dataset}")
    return 0


def _settings(args: argparse.Namespace) -> Settings:
    overrides: dict[str, Any] = {}
    for flag in ("db", "host", "grpc_port", "http_port", "api_port"):
        value = getattr(args, flag, None)
        if value is not None:
            overrides[flag] = value
    return load_settings(getattr(args, "config", None) or os.environ.get(CONFIG_ENV), overrides)


def _serve(settings: Settings) -> int:
    if settings.storage.backend == "duckdb":
        from collector.kept_out_libraries import keep_out

        keep_out()  # chDB, the only user of pandas, is a ClickHouse backend
        from tailwatch.compose import migrate_in_a_child

        migrate_in_a_child(settings)
    from tailwatch.service import Service  # imported here so `tailwatch --help` stays fast

    async def run() -> int:
        service = Service(settings)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            try:
                await service.start()
            except OSError as exc:  # a port in use or an address this machine does not have
                print(f"tailwatch: cannot start: {exc}", file=sys.stderr)
                return 3
            await stop.wait()
            log.info("stopping: no new requests; flushing what is queued")
        finally:
            await service.shutdown()
        return 0

    return asyncio.run(run())


def _migrate(settings: Settings) -> int:
    from tailwatch.compose import migrate

    print(migrate(settings))
    return 0


def _detect(settings: Settings, args: argparse.Namespace) -> int:
    from detectors.registry import get
    from tailwatch.compose import detection_pass, notifier, open_storage

    for key in args.detector or []:
        get(key)  # an unknown key fails here, naming the known ones
    if args.start is not None:
        return _backfill(settings, args)
    if args.end is not None:
        raise SettingsError("--to needs --from: the range to backfill")
    at = args.at or datetime.now(UTC).replace(tzinfo=None)
    storage = open_storage(settings)
    sink = notifier(settings)
    try:
        results = detection_pass(settings, storage, sink=sink).run(at, args.detector)
        if not sink.flush(settings.alerting.timeout_seconds * settings.alerting.max_attempts * 2):
            print("tailwatch: some alert notifications were not delivered in time", file=sys.stderr)
    finally:
        sink.close()
        storage.close()
    for r in results:
        status = {"ok": "ok", "too_large": f"SKIPPED: {r.error}"}.get(r.outcome, f"FAILED: {r.error}")
        print(f"{r.detector}: window {r.window.label()}: {status}; {r.rows} figure rows, {len(r.firing)} firing")
        for alert in r.firing:
            print(f"  [{alert.severity}] {alert.summary}")
    return 0 if all(r.outcome == "ok" for r in results) else 1


def _backfill(settings: Settings, args: argparse.Namespace) -> int:
    from detectors.catch_up import backfill
    from tailwatch.compose import detection_pass, open_storage

    end = args.end or datetime.now(UTC).replace(tzinfo=None)
    if args.at is not None:
        raise SettingsError("--at is for --once; a backfill takes --from and --to")
    if end < args.start:
        raise SettingsError(f"--to {end.isoformat()} is before --from {args.start.isoformat()}")
    storage = open_storage(settings)
    try:
        results = backfill(detection_pass(settings, storage), args.start, end, args.detector)
    finally:
        storage.close()
    by_detector: dict[str, list[str]] = {}
    for r in results:
        by_detector.setdefault(r.detector, []).append(r.outcome)
    for key, outcomes in by_detector.items():
        failed = len(outcomes) - outcomes.count("ok")
        print(f"{key}: {len(outcomes)} windows evaluated" + (f", {failed} FAILED" if failed else ""))
    for r in results:
        if r.outcome != "ok":
            print(f"  {r.detector} {r.window.label()}: {r.error}")
    if not results:
        print("no windows in that range (each detector is evaluated at the points of its interval grid)")
    return 0 if all(r.outcome == "ok" for r in results) else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        settings = _settings(args)
        logging.getLogger().setLevel(settings.log_level.upper())
        # Their INFO lines narrate internals (plugin setup, every job run); warnings still show.
        for noisy in ("alembic", "apscheduler"):
            logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
        with_args = (_detect, _simulate, _sql, _export)
        code: int = args.run(settings, args) if args.run in with_args else args.run(settings)
    except SettingsError as exc:
        print(f"tailwatch: configuration error: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"tailwatch: {exc.args[0]}", file=sys.stderr)
        return 2
    except Exception as exc:
        # Imported only on a failure: the wiring knows which of the store's failures are someone's to fix.
        from tailwatch.compose import store_failure

        failure = store_failure(exc, getattr(args, "db", None) or os.environ.get("TAILWATCH_DB") or "the database")
        if failure is None:
            raise
        print(f"tailwatch: {failure[1]}", file=sys.stderr)
        return failure[0]
    return code


if __name__ == "__main__":
    raise SystemExit(main())
