# The vqueues node image: `docker build -t vqueues .`
FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY vqueues ./vqueues
COPY clients/python ./clients/python
RUN pip install --no-cache-dir . ./clients/python
USER nobody
EXPOSE 8080
ENTRYPOINT ["vqueues"]
CMD ["serve", "--http-host", "0.0.0.0"]
