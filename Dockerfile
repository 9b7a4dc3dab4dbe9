# pdd-router: the router, the simulated engines, the CLI and redis-server in one image.
#
# BASE_IMAGE is any Debian bookworm root filesystem. The default, pdd-base:bookworm, is made
# locally by scripts/compose-base-image.sh (debootstrap, no image registry needed); where a
# registry is reachable, --build-arg BASE_IMAGE=debian:bookworm-slim does the same.
# Python and redis-server come from Debian, the project and its dependencies from PyPI.
# Build with BuildKit (docker >= 23, docker compose v2, or DOCKER_BUILDKIT=1): behind a
# TLS-intercepting proxy, pass its CA bundle with --secret id=pip_ca,src=FILE (used by pip
# during the build only, never stored in the image).
ARG BASE_IMAGE=pdd-base:bookworm
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv redis-server \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && python3 -m venv /opt/venv \
    && useradd --create-home pdd

WORKDIR /app

# The dependencies first, read from pyproject.toml alone: a change to the code reuses this layer.
COPY pyproject.toml ./
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi \
    && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt hatchling \
    && rm /tmp/requirements.txt

COPY README.md ./
COPY policies ./policies
COPY engines_adapter ./engines_adapter
COPY engine_sim ./engine_sim
COPY router ./router
COPY bench ./bench
COPY replay ./replay
COPY cli ./cli
RUN pip install --no-cache-dir --no-deps --no-build-isolation . && pdd-router --help >/dev/null

USER pdd
EXPOSE 8000
ENTRYPOINT ["pdd-router"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
