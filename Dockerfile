# The autoscaler's image: the agents (default command), the Spark job runner (`autoscaler job run`)
# and, from the same pyspark install, a Spark standalone master and worker (see docker-compose.yml).
#
# Debian bookworm is pinned because Spark is verified with Java 17, which newer Debian lacks.
# Only classic Dockerfile syntax (no BuildKit mounts): docker-compose 1.29 builds without BuildKit.
FROM python:3.11-slim-bookworm

# Spark runs on the JRE; its launch scripts call `ps` (procps).
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first, read from pyproject.toml, so that a code change does not download pyspark
# (about 500 MB) again.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['spark']))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Only the packages, never the build context's virtualenv or local state.
COPY README.md ./
COPY contracts/ contracts/
COPY infra/ infra/
COPY knowledge/ knowledge/
COPY monitor/ monitor/
COPY analyze/ analyze/
COPY plan/ plan/
COPY execute/ execute/
COPY pipeline/ pipeline/
COPY stack/ stack/
COPY evaluation/ evaluation/
COPY capacity/ capacity/
COPY agent/ agent/
COPY bench/ bench/
# The dependencies (with the spark extra) are in already; pip check proves none is missing.
RUN pip install --no-deps . \
    && pip check \
    && rm -rf build ./*.egg-info

# The Spark distribution inside the pyspark wheel: spark-class starts the standalone master and
# worker. The build fails here, not at run time, if the wheel's layout or the JRE is wrong.
ENV SPARK_HOME=/usr/local/lib/python3.11/site-packages/pyspark
RUN test -x "$SPARK_HOME/bin/spark-class" \
    && java -version \
    && autoscaler --help > /dev/null

# Runs as an unprivileged user; /state holds job checkpoints (a volume in docker-compose.yml).
RUN useradd --create-home --uid 10001 autoscaler \
    && mkdir -p /state \
    && chown autoscaler /state /app
USER autoscaler

# 6066: the agents' /metrics and /ready.
EXPOSE 6066
CMD ["autoscaler", "agents"]
