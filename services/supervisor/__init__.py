"""The supervisor: folds each job's record, plans, carries out the steps and commits what
happened (docs/runtime.md, "Supervisor"). Any number of replicas share the work."""
