# reqcrypt service image: slim Python, non-root, migrations applied on start.
# Every Python package comes from requirements/runtime.txt, checked against its hashes:
# nothing is resolved at build time, so two builds install the same versions.
# A build stage compiles the C extensions (app/_native.c, app/engine/_model.c) into the wheel
# with the locked setuptools; the runtime image has no compiler (its libssl3 is the libcrypto
# the extension links). Migrations (top-level migrations/) ship inside the wheel as
# app.migrations (setup.py).
FROM python:3.11-slim AS build
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements/runtime.txt requirements/runtime.txt
RUN pip install --no-cache-dir --require-hashes -r requirements/runtime.txt
COPY pyproject.toml setup.py README.md ./
COPY app ./app
COPY migrations ./migrations
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    REQCRYPT_DATA_DIR=/var/lib/reqcrypt \
    REQCRYPT_HOST=0.0.0.0 \
    REQCRYPT_PORT=8000 \
    MALLOC_MMAP_THRESHOLD_=67108864 \
    MALLOC_TRIM_THRESHOLD_=134217728

RUN groupadd --system reqcrypt && useradd --system --gid reqcrypt --home /app reqcrypt

WORKDIR /app
COPY requirements/runtime.txt /tmp/runtime.txt
COPY --from=build /wheels /tmp/wheels
RUN pip install --require-hashes --only-binary :all: -r /tmp/runtime.txt \
    && pip install --no-deps /tmp/wheels/*.whl && pip check && rm -rf /tmp/wheels /tmp/runtime.txt \
    && mkdir -p /var/lib/reqcrypt && chown reqcrypt:reqcrypt /var/lib/reqcrypt

USER reqcrypt
VOLUME ["/var/lib/reqcrypt"]
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status == 200 else 1)"

ENTRYPOINT ["reqcrypt"]
CMD ["serve"]
