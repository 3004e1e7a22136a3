"""Test doubles for parts that cannot run on the project's machines.

* ``kube_apiserver``: TEST DOUBLE of the Kubernetes API server (aiohttp, real HTTP), with
  ``kube_store`` (registry rules), ``kube_schema`` (CRD structural schema), ``kube_patch`` and
  ``kube_selectors``.
* ``kube_controller``: scripted cluster simulator (Trainer, JobSet, Job, Kueue, kubelet).
* ``pytest_kube``: fixtures ``kube_server``, ``kube_api_client``, ``kube_cluster``.
"""
