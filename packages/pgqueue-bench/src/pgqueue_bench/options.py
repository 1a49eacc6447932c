"""The options every driver takes alike: the server to run on and where the results go."""

from __future__ import annotations

import click

database_url_option = click.option(
    "--database-url", envvar="DATABASE_URL", help="Default: the embedded PostgreSQL."
)
results_dir_option = click.option(
    "--results-dir", type=click.Path(file_okay=False), help="Default: ./results."
)


def seconds_range(ctx: click.Context, param: click.Parameter, value: str) -> tuple[float, float]:
    """A click callback reading ``MIN-MAX`` (such as ``60-180``): two positive numbers,
    the first at most the second."""
    try:
        low, high = (float(part) for part in value.split("-"))
    except ValueError:
        raise click.BadParameter("give MIN-MAX, such as 60-180") from None
    if not 0 < low <= high:
        raise click.BadParameter("MIN must be positive and at most MAX")
    return low, high
