"""The options every driver takes alike: the server to run on and where the results go."""

from __future__ import annotations

import click

database_url_option = click.option(
    "--database-url", envvar="DATABASE_URL", help="Default: the embedded PostgreSQL."
)
results_dir_option = click.option(
    "--results-dir", type=click.Path(file_okay=False), help="Default: ./results."
)
