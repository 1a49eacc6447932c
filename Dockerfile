# One image for every pgqueue process: the API, workers and the CLI.
# docker-compose.yml runs it as `pgqueue-api ...` and as `pgqueue worker ...`.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

WORKDIR /src
COPY packages/ packages/
COPY plugins/ plugins/

# Non-editable installs of the distributions a deployment needs; the embedded
# PostgreSQL (pgqueue-core[local]) is for development and is left out.
RUN pip install \
        ./packages/pgqueue-core \
        ./packages/pgqueue-worker \
        ./packages/pgqueue-api \
        ./plugins/pgqueue-examples \
    && useradd --create-home --uid 10001 pgqueue

USER pgqueue
WORKDIR /home/pgqueue
EXPOSE 8000
CMD ["pgqueue", "--help"]
