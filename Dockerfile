# A Hugging Face Space (Docker SDK) serving the dashboard, read-only, on the results shipped in cached_results/.
# The Space's README.md needs `sdk: docker` and `app_port: 8501` in its front matter.
#   docker build -t loopscope . && docker run -p 8501:8501 loopscope
FROM python:3.11-slim

# the app folder made here, owned by user: a WORKDIR it creates is root's under the classic builder (and podman),
# where `pip install --user .` then cannot write its build files
RUN useradd --create-home --uid 1000 user && install -d -o user -g user /home/user/app
USER user
ENV HOME=/home/user PATH=/home/user/.local/bin:$PATH PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /home/user/app

# torch's CPU wheel first (no CUDA build), then the package and its dependencies: a layer that survives code edits.
# TORCH_INDEX: another index holding that wheel and its dependencies (dev/checks/image-check.sh serves a local one)
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --user torch==2.13.0 --index-url "$TORCH_INDEX"
COPY --chown=user pyproject.toml README.md ./
COPY --chown=user engine engine
COPY --chown=user dashboard dashboard
RUN pip install --user .
COPY --chown=user .streamlit .streamlit
COPY --chown=user cached_results cached_results

ENV LOOPSCOPE_READ_ONLY=1 LOOPSCOPE_RESULTS=/home/user/app/cached_results
EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://localhost:8501/_stcore/health', timeout=4)"
# dashboard.serve: `streamlit run dashboard/app.py` without Streamlit's public /_stcore/metrics route. Every interface
# (the Space's proxy reaches it there): the app is read-only beyond localhost anyway, without LOOPSCOPE_REMOTE_JOBS.
CMD ["python3", "-m", "dashboard.serve", "--server.port=8501", "--server.address=0.0.0.0", "--server.headless=true"]
