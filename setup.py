"""What pyproject.toml cannot say: the package layout and the optional C kernel.

The repository keeps ``primitives/`` and ``strategies/`` at its top, but they install as ``casync.primitives`` and
``casync.strategies`` (``package_dir``): two generic top-level names would collide with unrelated PyPI packages.
The C kernel of onebit's encode sweep and merges (``primitives/codecs/_sign_sweep.c``) is ``optional=True``:
without a C compiler the package installs all the same and NumPy runs them (bit for bit the same, slower)."""
from setuptools import Extension, find_packages, setup

MOVED = {"casync.primitives": "primitives", "casync.strategies": "strategies"}  # installed name -> folder

packages = find_packages(include=["casync", "casync.*"])
for name, folder in MOVED.items():
    packages += [name] + [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=MOVED, ext_modules=[Extension(
    "casync.primitives.codecs._sign_sweep", ["primitives/codecs/_sign_sweep.c"],
    # IEEE float32 arithmetic exactly as NumPy's loops: no fused multiply-adds, no fast-math
    extra_compile_args=["-O2", "-ffp-contract=off", "-fno-fast-math"], optional=True)])
