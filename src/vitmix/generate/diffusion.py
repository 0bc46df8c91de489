"""The diffusion process moved to :mod:`vitmix.models.diffusion` (the robot policy shares it); this
name stays for existing imports."""
from ..models.diffusion import *  # noqa: F401,F403
from ..models.diffusion import __all__  # noqa: F401
