"""`autoscaler cluster`: register the clusters whose slot budgets jobs share (`JobConfig.cluster`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from contracts.settings import get_settings

cluster_app = typer.Typer(help="Clusters whose slot budget their jobs share (the fleet step).",
                          no_args_is_help=True)
console = Console()


def _call(fn):  # type: ignore[no-untyped-def]
    from knowledge import with_knowledge

    return with_knowledge(get_settings(), fn)


@cluster_app.command("add")
def cluster_add(
    name: str,
    workers: Annotated[int, typer.Option(help="Workers in the cluster.")],
    slots_per_worker: Annotated[int, typer.Option(help="Executor slots (cores) per worker.")],
) -> None:
    """Register a cluster (or change its size); a size below its jobs' minimums is refused."""
    from pydantic import ValidationError

    from contracts.fleet import ClusterConfig
    from contracts.jobs import ConfigError

    try:
        cluster = ClusterConfig(name=name, workers=workers, slots_per_worker=slots_per_worker)
        _call(lambda k: k.register_cluster(cluster))
    except ValidationError as exc:
        console.print(f"[red]invalid cluster: {'; '.join(e['msg'] for e in exc.errors())}[/red]")
        raise typer.Exit(2) from None
    except ConfigError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    console.print(f"cluster {name}: {cluster.budget} slots ({workers} x {slots_per_worker})")


@cluster_app.command("list")
def cluster_list() -> None:
    """The registered clusters, and per cluster the slots its jobs hold and last bid for."""
    clusters = _call(lambda k: k.clusters())
    table = Table("cluster", "slots", "held", "jobs", title="Clusters")
    for name, cluster in sorted(clusters.items()):
        state = _call(lambda k, name=name: k.fleet_state(name))
        table.add_row(name, str(cluster.budget), str(sum(state.held.values())), ", ".join(sorted(state.held)))
    console.print(table)


@cluster_app.command("remove")
def cluster_remove(name: str) -> None:
    """Forget a cluster; its jobs hold (reason `unknown_cluster`) until they name another or none."""
    _call(lambda k: k.remove_cluster(name))
    console.print(f"removed cluster {name}")
