"""Real servers (nats-server, S3) started by tests and benchmarks."""
