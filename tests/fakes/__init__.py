"""Test doubles for parts that cannot run on the project's machines.

* ``kube_controller``: TEST DOUBLE, the scripted cluster simulator (Trainer, JobSet, Job, Kueue,
  scheduler, kubelet controllers), writing through the lane's real kube-apiserver.
* ``kube_schema``: the CRD structural schema with CEL rules and strict unknown fields, what the
  lane's kube-apiserver 1.20 can't check (unit tests against the unchanged Trainer CRD).
* ``kube_patch``: RFC 6902 JSON patch, applied in unit tests to the gate's patches.
"""
