"""Weights from the trainer to rollout instances: manifests, chunks and checksums (the gRPC weight
service of the elastic-instance issue builds on `manifest`)."""
