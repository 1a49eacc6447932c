"""``pgqueue bench``: the benchmark drivers, each writing JSON under ``results/``."""

from __future__ import annotations

import click

from pgqueue_bench.api_load import api_command
from pgqueue_bench.controls import controls_command
from pgqueue_bench.crash import crash_command
from pgqueue_bench.effects import effects_command
from pgqueue_bench.enqueue import enqueue_command
from pgqueue_bench.fairness import fairness_command
from pgqueue_bench.latency import latency_command
from pgqueue_bench.plot import plot_command
from pgqueue_bench.report import report_command
from pgqueue_bench.restart import restart_command
from pgqueue_bench.scale import scale_command
from pgqueue_bench.search import search_command
from pgqueue_bench.soak import soak_command
from pgqueue_bench.throughput import throughput_command
from pgqueue_bench.ui import ui_command
from pgqueue_bench.unserved import unserved_command
from pgqueue_bench.wait import wait_command


@click.group("bench")
def bench() -> None:
    """Benchmarks on the embedded PostgreSQL, or DATABASE_URL / --database-url."""


bench.add_command(throughput_command)
bench.add_command(latency_command)
bench.add_command(crash_command)
bench.add_command(controls_command)
bench.add_command(restart_command)
bench.add_command(scale_command)
bench.add_command(enqueue_command)
bench.add_command(api_command)
bench.add_command(ui_command)
bench.add_command(soak_command)
bench.add_command(effects_command)
bench.add_command(unserved_command)
bench.add_command(search_command)
bench.add_command(wait_command)
bench.add_command(fairness_command)
bench.add_command(plot_command)
bench.add_command(report_command)
