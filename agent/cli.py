"""The `autoscaler` command line."""

from __future__ import annotations

import gc
import json
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from contracts.catalog import CONTRACTS, contracts_markdown, json_schema_text
from contracts.settings import get_settings

app = typer.Typer(help="A MAPE-K autoscaler for streaming pipelines.", no_args_is_help=True)
jobs_app = typer.Typer(help="Register and list jobs.", no_args_is_help=True)
config_app = typer.Typer(help="Per-job configuration, kept in knowledge.", no_args_is_help=True)
stack_app = typer.Typer(help="The embedded stack: broker, Redis and agents on this machine.", no_args_is_help=True)
bench_app = typer.Typer(help="Former home of `autoscaler evaluate`.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
app.add_typer(config_app, name="config")
app.add_typer(stack_app, name="stack")
console = Console()
# About one task slot, then about four, then one again (rates per second for the default cost).
DEMO_SHAPE = "steps:120:90,560:240,120:150"


def _mount_cluster() -> None:
    from agent.cluster_cli import cluster_app

    app.add_typer(cluster_app, name="cluster", help="Clusters whose slot budget their jobs share.")


def _mount_job() -> None:
    from agent.job_cli import job_app

    app.add_typer(job_app, name="job", help="Run a Spark job under the autoscaler's control.")


def _mount_load() -> None:
    from agent.load_cli import loadgen_app

    app.add_typer(loadgen_app, name="load", help="Replay a load shape or trace into a topic.")


def _mount_evaluation() -> None:
    from evaluation.cli import calibrate_command, evaluate_command

    app.command("evaluate")(evaluate_command)
    app.command("calibrate")(calibrate_command)
    bench_app.command("evaluate", help="The same as `autoscaler evaluate` (its former name, kept for one "
                      "release).")(evaluate_command)
    app.add_typer(bench_app, name="bench")


def _mount_capacity() -> None:
    from capacity.cli import capacity_app

    app.add_typer(capacity_app, name="capacity")


# The commands whose modules load more than the agents need: the capacity planner alone loads scipy,
# scikit-learn and pandas (the time and memory it takes: see
# docs/results.md, "Measurements moved from docstrings"). Each is mounted only when it is the command run, or
# when the command line names none (help), so an agent worker or a `jobs register` loads none of them.
HEAVY_COMMANDS = {"job": _mount_job, "load": _mount_load, "evaluate": _mount_evaluation,
                  "calibrate": _mount_evaluation, "bench": _mount_evaluation, "capacity": _mount_capacity,
                  "cluster": _mount_cluster}


def command_names() -> set[str]:
    """The commands and command groups mounted on `app` so far, as typed on the command line."""
    return ({info.name or (info.callback.__name__.replace("_", "-") if info.callback else "")
             for info in app.registered_commands} | {group.name or "" for group in app.registered_groups})


def _mount_commands(argv: list[str]) -> None:
    """Mount the heavy command `argv` runs; every one for help or a name that is not a light command."""
    words = [word for word in argv if not word.startswith("-")]
    command = words[0] if words else None
    if command in command_names():  # mounted at import: a light command
        return
    mounts = [HEAVY_COMMANDS[command]] if command in HEAVY_COMMANDS else list(dict.fromkeys(HEAVY_COMMANDS.values()))
    for mount in mounts:
        mount()


# ---------------------------------------------------------------- agents

# The collector's thresholds in a worker (Python's defaults: 700, 10, 10). Under load a worker makes
# tens of thousands of short-lived containers a second (reports, windows, plans), nearly all freed by
# their reference counts; at the defaults the collector still ran a full collection every 2 s, each
# scanning the whole heap for about 0.2 s while the worker stood still. Fewer, larger young
# collections find the same garbage. Measurements: docs/reliability.md, "Load".
GC_THRESHOLDS = (10_000, 20, 20)


def tune_collector() -> None:
    """Freeze what start-up made (modules, compiled code, the app), so that no collection scans it
    again, and collect less often (`GC_THRESHOLDS`). Cyclic garbage is still collected."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


@app.command()
def agents(
    stage: Annotated[list[str] | None, typer.Option(help="Stage(s) to run: monitor, analyze, plan, execute.")] = None,
    web_port: Annotated[int | None, typer.Option(help="Port of /metrics and /ready.")] = None,
) -> None:
    """Run the agents (all four stages in one worker by default)."""
    from agent.app import STAGES, create_app
    from infra.kafka import ensure_topics

    settings = get_settings()
    if web_port is not None:
        settings = settings.model_copy(update={"web_port": web_port})
    stages = list(STAGES) if not stage or stage == ["all"] else stage
    if settings.event_loop == "uvloop":  # before the app and its worker make their loop
        import asyncio

        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    ensure_topics(settings)
    faust_app, _ = create_app(settings, stages)
    from faust.worker import Worker

    logging.basicConfig(level=settings.log_level.upper())
    worker = Worker(faust_app, loglevel=settings.log_level, quiet=True, redirect_stdouts=False)
    # Faust's start-up spinner, at a level of WARNING or above, sets the root logger to DEBUG so that
    # it spins on every record: every library's debug call then builds a record that no handler
    # prints (about 1 % of a worker's time at 3,000 jobs). The level stays the one configured.
    worker.spinner = None
    tune_collector()
    worker.execute_from_commandline()


@app.command()
def topics() -> None:
    """Create the autoscaler's topics if they are missing."""
    from infra.kafka import ensure_topics

    created = ensure_topics(get_settings())
    console.print(f"created: {', '.join(created) or 'none (all exist)'}")


# ---------------------------------------------------------------- contracts


@app.command()
def schema(
    name: Annotated[str | None, typer.Argument(help=f"One of: {', '.join(CONTRACTS)}")] = None,
    write: Annotated[Path | None, typer.Option(
        help="Write the contracts page (DIR/contracts.md) and every JSON Schema (DIR/schemas/<name>.schema.json).",
    )] = None,
) -> None:
    """Print a contract's JSON Schema, or write the contracts page and every schema (`--write docs`)."""
    if write is not None:
        (write / "schemas").mkdir(parents=True, exist_ok=True)
        for contract in CONTRACTS:
            (write / "schemas" / f"{contract}.schema.json").write_text(json_schema_text(contract) + "\n")
        (write / "contracts.md").write_text(contracts_markdown())
        console.print(f"wrote {write / 'contracts.md'} and {len(CONTRACTS)} schemas in {write / 'schemas'}")
        return
    if name is None:
        console.print("contracts: " + ", ".join(CONTRACTS))
        return
    try:
        typer.echo(json_schema_text(name))
    except KeyError as exc:
        console.print(f"[red]{exc.args[0]}[/red]")
        raise typer.Exit(2) from None


# ---------------------------------------------------------------- jobs and knowledge


def _knowledge_call(fn):  # type: ignore[no-untyped-def]
    from knowledge import with_knowledge

    return with_knowledge(get_settings(), fn)


def _known_policy(overrides: dict[str, str]) -> dict[str, str]:
    """Overrides whose `policy`, if any, is a registered policy (the job config only checks its form)."""
    from contracts.jobs import ConfigError
    from plan.registry import POLICIES, UnknownPolicy

    name = overrides.get("policy")
    if name is not None and name not in POLICIES:
        raise ConfigError(f"invalid configuration: policy: {UnknownPolicy(name)}")
    return overrides


@app.command()
def policies() -> None:
    """The scaling policies a job may use (`autoscaler config set JOB policy=NAME`)."""
    from plan.registry import DEFAULT_POLICY, POLICIES

    table = Table("policy", "forecast", "what it does", title=f"Scaling policies (a job's default: {DEFAULT_POLICY})")
    for name, policy in POLICIES.items():
        table.add_row(name, "yes" if policy.needs_forecast else "no", policy.summary)
    console.print(table)


@jobs_app.command("register")
def jobs_register(
    job_id: str, settings: Annotated[list[str] | None, typer.Argument(help="key=value overrides")] = None
) -> None:
    """Register a job (reports of unknown jobs are dead-lettered), optionally with settings."""
    from contracts.jobs import ConfigError, parse_assignments

    try:
        overrides = _known_policy(parse_assignments(settings or []))
        config = _knowledge_call(lambda k: k.register_job(job_id, overrides))
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    console.print(f"registered {job_id}: {config.model_dump(mode='json')}")


@config_app.command("set")
def config_set(job_id: str, settings: Annotated[list[str], typer.Argument(help="key=value")]) -> None:
    """Change a registered job's settings; invalid values are refused and nothing is changed."""
    from contracts.jobs import ConfigError, parse_assignments

    try:
        changes = _known_policy(parse_assignments(settings))
        config = _knowledge_call(lambda k: k.set_config(job_id, changes))
    except (ConfigError, KeyError) as exc:
        console.print(f"[red]{exc.args[0]}[/red]")
        raise typer.Exit(2) from None
    console.print(f"{job_id}: {config.model_dump(mode='json')}")


@config_app.command("unset")
def config_unset(job_id: str, keys: Annotated[list[str], typer.Argument(help="settings to reset")]) -> None:
    """Return settings to their defaults (from `AUTOSCALER_*`)."""
    from contracts.jobs import ConfigError, parse_assignments

    try:
        parse_assignments([f"{key}=" for key in keys])  # known keys only
        config = _knowledge_call(lambda k: k.unset_config(job_id, keys))
    except (ConfigError, KeyError) as exc:
        console.print(f"[red]{exc.args[0]}[/red]")
        raise typer.Exit(2) from None
    console.print(f"{job_id}: {config.model_dump(mode='json')}")


@config_app.command("show")
def config_show(job_id: str) -> None:
    """The job's effective configuration and where each value comes from."""
    from contracts.jobs import JobConfig

    async def collect(k):  # type: ignore[no-untyped-def]
        if not await k.job_exists(job_id):
            return None
        return await k.job_config(job_id), await k.config_overrides(job_id)

    found = _knowledge_call(collect)
    if found is None:
        console.print(f"[red]unknown job {job_id!r}[/red]")
        raise typer.Exit(2)
    config, overrides = found
    table = Table("setting", "value", "from", "meaning", title=f"{job_id} configuration")
    for name, field in JobConfig.model_fields.items():
        value = getattr(config, name)
        table.add_row(name, str(getattr(value, "value", value)), "job" if name in overrides else "default",
                      field.description or "")
    console.print(table)


@jobs_app.command("list")
def jobs_list() -> None:
    """Registered jobs with their state."""

    async def collect(k):  # type: ignore[no-untyped-def]
        rows = []
        for job in sorted(await k.jobs()):
            running = (await k.plan_state(job)).parallelism
            if running is None:
                running = ((await k.last_analysis(job)) or {}).get("parallelism")
            rows.append((job, await k.job_config(job), running))
        return rows

    table = Table("job", "mode", "policy", "parallelism", "bounds", "target util")
    for job, config, running in _knowledge_call(collect):
        table.add_row(
            job, config.mode.value, config.policy,
            "?" if running is None else str(running),
            f"{config.min_parallelism}..{config.max_parallelism}", f"{config.target_utilization:.0%}",
        )
    console.print(table)


@app.command()
def explain(
    job_id: str,
    limit: Annotated[int, typer.Option(help="How many of the latest decisions to read.")] = 30,
    changes_only: Annotated[bool, typer.Option(help="Only actions and suppressed recommendations.")] = False,
) -> None:
    """Why the job runs at its parallelism: recent decisions and suppressions, and the last action."""
    from agent.explain import decision_table, summary

    async def collect(k):  # type: ignore[no-untyped-def]
        if not await k.job_exists(job_id):
            return None
        return await k.decisions(job_id, limit), await k.events(job_id, 5)

    found = _knowledge_call(collect)
    if found is None:
        console.print(f"[red]unknown job {job_id!r}[/red]")
        raise typer.Exit(2)
    decisions, events = found
    console.print(decision_table(decisions, only_changes=changes_only))
    for line in summary(decisions):
        console.print(line, markup=False, highlight=False)
    for event in events:
        detail = event.get("detail") or event.get("error") or ""
        console.print(f"event {event['type']}: {event['from_parallelism']} -> {event['to_parallelism']} {detail}",
                      markup=False, highlight=False)


@app.command()
def status() -> None:
    """Counters of accepted and rejected reports across all workers."""
    counters = _knowledge_call(lambda k: k.counters())
    console.print_json(json.dumps(counters))


# ---------------------------------------------------------------- watch


@app.command()
def watch(
    seconds: Annotated[float, typer.Option(help="Stop after this long (0 = until Ctrl-C).")] = 0,
    all_decisions: Annotated[bool, typer.Option(help="Also show decisions whose action is none.")] = False,
    json_lines: Annotated[bool, typer.Option("--json", help="One message a line, as published.")] = False,
    from_beginning: Annotated[bool, typer.Option(help="Start at the oldest message the topics keep.")] = False,
) -> None:
    """Print decisions and scaling events as they are published, each once (repeats dropped by id)."""
    from agent.watch import watch_topics

    watch_topics(get_settings(), seconds, all_decisions, console, as_json=json_lines, from_beginning=from_beginning)


@app.command()
def dashboard(
    port: Annotated[int, typer.Option(help="Port of the dashboard's pages.")] = 8050,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    agent: Annotated[list[str] | None, typer.Option(
        help="Base URL of an agent worker whose health the header shows (repeatable); default this "
             "machine's agents on the configured web port.")] = None,
) -> None:
    """Serve the live dashboard: every job, its load, capacity, forecast, decisions and backlog."""
    from agent.dashboard import serve

    settings = get_settings()
    agents = agent or [f"http://127.0.0.1:{settings.web_port}"]
    console.print(f"dashboard on http://{host}:{port}/ (agents: {', '.join(agents)})")
    serve(settings, host, port, agents)


# ---------------------------------------------------------------- demo


@app.command()
def demo(
    shape: Annotated[str, typer.Option(help="Load shape (see `autoscaler load run --help`).")] = DEMO_SHAPE,
    cost_ms: Annotated[float, typer.Option(help="Per-record cost of the demo job (waiting, not computing).")] = 4.0,
    partitions: Annotated[int, typer.Option(help="Partitions of the demo input topic.")] = 4,
    max_parallelism: Annotated[int, typer.Option(help="Upper bound of the demo job's parallelism.")] = 8,
    cluster: Annotated[str, typer.Option(help="local: Spark in local mode, rescaled by restarting from the "
                                              "checkpoint; standalone: a Spark standalone cluster started for "
                                              "the demo, executors changed in place.")] = "local",
    workload: Annotated[str, typer.Option(help="The job: enrich (the demo job), window-agg, dedup, join, "
                                               "nexmark-q1, -q2, -q5, -q8 or -q11 (pipeline.workloads).")] = "enrich",
) -> None:
    """Run the demo Spark job under changing load on the embedded stack, autoscaled live; end with a
    summary table and a PNG of the run."""
    from agent.demo import run_demo
    from pipeline.workloads import WORKLOADS

    if cluster not in ("local", "standalone"):
        raise typer.BadParameter("local or standalone", param_hint="--cluster")
    if workload not in WORKLOADS:
        raise typer.BadParameter(", ".join(WORKLOADS), param_hint="--workload")
    run_demo(get_settings(), shape, cost_ms, partitions, max_parallelism, console, cluster, workload)


# ---------------------------------------------------------------- embedded stack


@stack_app.command("up")
def stack_up(
    agents_too: Annotated[bool, typer.Option("--agents/--no-agents", help="Also start the agents.")] = True,
    durable: Annotated[bool, typer.Option(
        "--durable", help="Keep the broker's data in a local S3 emulator (moto), not in memory.")] = False,
) -> None:
    """Start the broker, Redis (unless one answers) and the agents in the background."""
    from stack.embedded import Stack

    Stack(get_settings()).up(with_agents=agents_too, console=console, durable=durable)


@stack_app.command("down")
def stack_down() -> None:
    """Stop everything `stack up` started, and nothing else."""
    from stack.embedded import Stack

    Stack(get_settings()).down(console=console)


@stack_app.command("status")
def stack_status() -> None:
    """What the embedded stack runs."""
    from stack.embedded import Stack

    Stack(get_settings()).status(console=console)


def main() -> None:
    _mount_commands(sys.argv[1:])
    app()

