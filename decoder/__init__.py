"""decoder: the runtime (no offline package). ``load_deployment`` loads a pair's deployment bundle
(decoder/deploy/deployment.py: NumPy, safetensors and pydantic, no torch)."""

from decoder.deploy.deployment import Deployment, DeploymentError, load_deployment

__all__ = ["Deployment", "DeploymentError", "load_deployment"]
