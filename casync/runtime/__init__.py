"""Engines that run plans on other processes; ``program`` is Ray-free, ``ray_*`` modules import Ray."""
