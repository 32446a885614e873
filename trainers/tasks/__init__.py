"""Tasks: datasets, prompt formats and rewards that the engine trains on (``load_task``)."""

from .base import Task
from .mixture import MixtureTask
from .registry import build_rewards, load_task

__all__ = ["MixtureTask", "Task", "build_rewards", "load_task"]
