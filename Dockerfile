# One image for every pgqueue process: the migration, the HTTP API and the workers.
# docker-compose.yml builds it once and runs it as `pgqueue migrate`, `pgqueue-api ...`
# and `pgqueue worker ...`; deploy/kubernetes/ runs the same commands.
#
# The base is pinned by its exact version and by the digest of the official image's
# multi-platform index, so a rebuild starts from the same bytes; bump both together.
FROM python:3.11.16-slim-bookworm@sha256:fe556eaffd0d96abd8685b83bb8a69addd0dc730fa193669a7df0d49ddcfac02 AS base

FROM base AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY packages/pgqueue-core/ packages/pgqueue-core/
COPY packages/pgqueue-worker/ packages/pgqueue-worker/
COPY packages/pgqueue-api/ packages/pgqueue-api/
COPY plugins/pgqueue-examples/ plugins/pgqueue-examples/
# Wheels built from the sources, installed (not editable) into a virtualenv that the
# final stage copies whole. The embedded PostgreSQL (pgqueue-core[local]) is for
# development and is left out.
RUN python -m venv /opt/pgqueue \
    && /opt/pgqueue/bin/pip install \
        ./packages/pgqueue-core \
        ./packages/pgqueue-worker \
        ./packages/pgqueue-api \
        ./plugins/pgqueue-examples

FROM base
ENV PATH=/opt/pgqueue/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/pgqueue pgqueue
COPY --from=build /opt/pgqueue /opt/pgqueue
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /home/pgqueue
EXPOSE 8000
# Exec form, no shell in between: the command is PID 1 and gets SIGTERM itself (a worker
# then finishes its running jobs within --shutdown-timeout).
CMD ["pgqueue", "--help"]
