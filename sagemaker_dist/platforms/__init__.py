"""Other platforms than SageMaker: a Pipe-mode agent per node (``pipe_agent``) and the manifests that
run the same job under Kubernetes (``k8s_mpijob``: a Kubeflow MPIJob with the agent as a sidecar).
"""
