"""What every service shares: configuration, structured logs, health and metrics."""
