"""dispatch's services: observer, supervisor, notifier and api (DESIGN.md section 1)."""
