"""The optional C kernel of onebit's encode sweep and merges (``primitives/codecs/_sign_sweep.c``); everything
else is in pyproject.toml.  ``optional=True``: without a C compiler the package installs all the same and NumPy
runs them (bit for bit the same results, slower)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "primitives.codecs._sign_sweep", ["primitives/codecs/_sign_sweep.c"],
    # IEEE float32 arithmetic exactly as NumPy's loops: no fused multiply-adds, no fast-math
    extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math"], optional=True)])
