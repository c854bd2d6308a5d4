"""The Ray runtime: the Ray layer (connect, placement, failures, release), ``RayEngine`` and its actors,
the object-store transport, and calibration of what running on Ray costs.  Only this package and
``casync.training`` import Ray."""
