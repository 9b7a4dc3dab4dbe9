# pdd-router: the router, the simulated engines and the CLI in one image.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY policies ./policies
COPY engines_adapter ./engines_adapter
COPY router ./router
COPY replay ./replay
COPY cli ./cli
RUN pip install --no-cache-dir . && useradd --create-home pdd
USER pdd
EXPOSE 8000
ENTRYPOINT ["pdd-router"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
