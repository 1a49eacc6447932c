"""``pgqueue bench``: the benchmark drivers, each writing JSON under ``results/``."""

from __future__ import annotations

import click

from pgqueue_bench.charts.plot import plot_command
from pgqueue_bench.report.pages import report_command
from pgqueue_bench.scenarios.api.driver import api_command
from pgqueue_bench.scenarios.controls.driver import controls_command
from pgqueue_bench.scenarios.crash import crash_command
from pgqueue_bench.scenarios.effects.driver import effects_command
from pgqueue_bench.scenarios.enqueue.driver import enqueue_command
from pgqueue_bench.scenarios.fairness.driver import fairness_command
from pgqueue_bench.scenarios.latency import latency_command
from pgqueue_bench.scenarios.restart import restart_command
from pgqueue_bench.scenarios.scale.driver import scale_command
from pgqueue_bench.scenarios.search import search_command
from pgqueue_bench.scenarios.soak.driver import soak_command
from pgqueue_bench.scenarios.throughput.driver import throughput_command
from pgqueue_bench.scenarios.ui import ui_command
from pgqueue_bench.scenarios.unserved import unserved_command
from pgqueue_bench.scenarios.wait import wait_command


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
