"""The OpenAI-compatible endpoint: any agent program drives rollout engines over HTTP (docs/endpoint.md)."""
