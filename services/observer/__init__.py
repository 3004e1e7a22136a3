"""The observer: one per cluster; publishes what its scheduler shows of dispatch's objects
(docs/runtime.md, "Observer")."""
