"""SQLAlchemy 2.0 models of the trajectory store (see ARCHITECTURE.md, "The data that flows")."""

from core.models.artifact import EpisodeArtifact
from core.models.auth import ApiToken, DashboardSession
from core.models.base import Base
from core.models.counts import RunEpisodeCounts, RunFlagCounts, RunGroupCounts
from core.models.environment import Environment, Task
from core.models.episode import Episode, EpisodeGroup, Turn
from core.models.regrade import EpisodeRegrade
from core.models.run import PolicyVersion, Run, RunEnvironment, TrainingStep
from core.models.sandbox import SandboxEvent, SandboxImage
from core.models.task_rate import RunTaskRate
from core.models.worker import Worker

__all__ = [
    "ApiToken",
    "Base",
    "DashboardSession",
    "Environment",
    "Episode",
    "EpisodeArtifact",
    "EpisodeGroup",
    "EpisodeRegrade",
    "PolicyVersion",
    "Run",
    "RunEnvironment",
    "RunEpisodeCounts",
    "RunFlagCounts",
    "RunGroupCounts",
    "RunTaskRate",
    "SandboxEvent",
    "SandboxImage",
    "Task",
    "TrainingStep",
    "Turn",
    "Worker",
]
