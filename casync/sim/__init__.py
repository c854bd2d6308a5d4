"""The model side: the cost model (``Profile``, ``ClusterModel``), measured op costs, and the simulator that
times a plan's one schedule (``casync.schedule``) on a cluster you do not have."""
from ..lazy import attach

# imported on first use: a rank that only reads a ClusterModel needs no simulator (nor its networkx op table)
__getattr__, __dir__ = attach(__name__, {"ClusterModel": ".costmodel", "Profile": ".costmodel",
                                         "Timeline": ".simulator", "simulate": ".simulator"})

__all__ = ["ClusterModel", "Profile", "Timeline", "simulate"]
