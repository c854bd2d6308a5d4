"""The model side: the cost model (``Profile``, ``ClusterModel``), measured op costs, and the simulator that
times a plan's one schedule (``casync.schedule``) on a cluster you do not have."""
from .costmodel import ClusterModel, Profile
from .simulator import Timeline, simulate

__all__ = ["ClusterModel", "Profile", "Timeline", "simulate"]
