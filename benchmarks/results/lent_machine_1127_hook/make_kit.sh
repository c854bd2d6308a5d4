#!/bin/bash
# How `.devrun/` (ignored through .git/info/exclude, carried to the lent machine) was made on the development
# host, from the repository root: what `run.sh` needs on a machine with Python 3.12 and no network.
#   site.tar.xz  Ray 2.60.0 and jsonschema's packages for CPython 3.12, unpacked, Java/RLlib/Serve/LLM removed
#   netkit/      iproute2's ip and tc with their libraries, run through the machine's own loader; a ray CLI wrapper
# and the onebit kernel built for CPython 3.12 beside the host's build (carried by naming it in the run).
set -eu
mkdir -p .devrun/whl && cd .devrun
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d whl \
  ray==2.60.0 jsonschema referencing jsonschema-specifications rpds-py
rm -rf site && python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --target site whl/*.whl
rm -rf site/ray/jars site/ray/rllib site/ray/llm site/ray/serve
tar -C site -cf - . | xz -T2 -6 > site.tar.xz && rm -rf site whl
rm -rf netkit && mkdir -p netkit/bin netkit/real netkit/lib
cp /usr/sbin/ip /usr/sbin/tc netkit/real/
for l in libbpf.so.1 libbsd.so.0 libcap.so.2 libelf.so.1 libmd.so.0 libmnl.so.0 libxtables.so.12 libz.so.1; do
  cp -L /lib/x86_64-linux-gnu/$l netkit/lib/
done
for t in ip tc; do
  printf '#!/bin/sh\nD=$(cd "$(dirname "$0")/.." && pwd)\nexec /lib64/ld-linux-x86-64.so.2 --library-path "$D/lib" "$D/real/%s" "$@"\n' $t > netkit/bin/$t
done
printf '#!/bin/sh\nexec python3 -c %s "$@"\n' \
  "'import sys; from ray.scripts.scripts import main; sys.argv[0] = \"ray\"; sys.exit(main())'" > netkit/bin/ray
chmod +x netkit/bin/* netkit/real/*
cp ../benchmarks/results/lent_machine_1127_hook/run.sh run.sh
cd ..
PY312=${PY312:-$(pyenv root)/versions/3.12.1/bin/python3.12}
gcc -shared -fPIC -O2 -ffp-contract=off -fno-fast-math -I"$("$PY312" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
  primitives/codecs/_sign_sweep.c -o primitives/codecs/_sign_sweep.cpython-312-x86_64-linux-gnu.so
