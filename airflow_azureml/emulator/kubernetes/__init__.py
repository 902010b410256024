"""The Kubernetes side of an attached cluster: the ``InstanceType`` custom-objects API.

Azure ML reads a Kubernetes compute's instance types from ``InstanceType`` custom resources
(``amlarc.azureml.com/v1alpha1``, cluster-scoped) in the attached cluster. The emulator serves that API
under ``/k8s/{cluster}`` on its own port, so the official ``kubernetes`` client (and kubectl) can
create, read, list, patch, replace and delete them with a kubeconfig whose ``server`` is
``https://127.0.0.1:<port>/k8s/<cluster>``. One module per concept, imported in this order:

- ``api``: what any Kubernetes API server answers: ``Status`` errors (404 NotFound, 409
  AlreadyExists/Conflict, 422 Invalid...), the ``/k8s/`` prefix, cluster names.
- ``patches``: JSON merge patch (RFC 7386) and JSON patch (RFC 6902).
- ``store``: one cluster's stored objects (``KubeCluster``). ``resourceVersion`` changes only when the
  stored object changes (spec, labels, annotations), ``generation`` only when the spec changes, as in
  Kubernetes; preconditions, selectors. Bodies are validated with the emulator's own copy of Azure's
  rules (``emulator.azure_rules``, never the provider's code).
- ``attachment``: the cluster as a workspace compute: its objects in the compute's ARM JSON
  (``properties.properties.instanceTypes``), and the kubeconfig that reaches it.
- ``discovery``: the version, API group and OpenAPI documents clients read before they call.
- ``routes``: the HTTP binding (``KubernetesRoutes``), plus control routes under ``/_emulator``.

Cluster ``X`` is the Kubernetes compute ``X`` of the workspace. A cluster exists before it is attached
(objects applied to it are kept and show up on attach).
"""
