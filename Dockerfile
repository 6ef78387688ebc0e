# The procbus worker image: procbus, its Temporal CLI and a Java runtime for Spark jobs.
FROM python:3.11-slim-bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY procbus ./procbus
COPY workflows ./workflows
COPY activities ./activities
COPY worker ./worker
COPY starter ./starter
RUN pip install --no-cache-dir ".[all]"
ENV PROCBUS_STATE_DIR=/var/lib/procbus
CMD ["procbus", "worker"]
