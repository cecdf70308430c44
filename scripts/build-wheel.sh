#!/usr/bin/env bash
# Builds the Python package as a wheel that carries libsluice inside it, so
# that `pip install dist/sluice-*.whl` gives a trainer's environment (a venv,
# a container) the client without cmake:
#
#   scripts/build-wheel.sh [BUILD] [OUTDIR]      (make wheel: build, dist)
#
# The wheel holds client/python/sluice/*.py, BUILD/client/libsluice.so as
# sluice/libsluice.so and an _installed.py that points the loader there
# (docs/python.md). It is tagged py3-none-<platform>: any Python 3 loads the
# library through ctypes, but the library is this machine's build and links
# to the system's libevent, jansson and OpenSSL (Debian 12: libevent-2.1-7,
# libevent-openssl-2.1-7, libevent-pthreads-2.1-7, libjansson4, libssl3).
# NumPy is a requirement of the package; PyTorch only of sluice.torch.
# Built offline with the system's setuptools and wheel (no build isolation).
set -euo pipefail
build=${1:-build}
out=${2:-dist}
cd "$(dirname "$0")/.."
lib=$build/client/libsluice.so
if [ ! -e "$lib" ]; then
    echo "build-wheel: $lib is missing: build it first (make build)" >&2
    exit 1
fi
version=$(sed -n "s/^__version__ = '\(.*\)'$/\1/p" client/python/sluice/__init__.py)
if [ -z "$version" ]; then
    echo "build-wheel: no __version__ in client/python/sluice/__init__.py" >&2
    exit 1
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/sluice"
cp client/python/sluice/*.py "$stage/sluice/"
cp "$(readlink -f "$lib")" "$stage/sluice/libsluice.so"
printf '"""Written by scripts/build-wheel.sh: libsluice is in this package."""\nLIBDIR = "."\n' \
    > "$stage/sluice/_installed.py"
cat > "$stage/setup.py" <<EOF
from setuptools import setup
from setuptools.dist import Distribution
from wheel.bdist_wheel import bdist_wheel


class WithLibrary(Distribution):
    """The package carries a shared library: installed as platform code."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """Not pure (it carries a shared library), but for any Python 3: ctypes loads it."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return ('py3', 'none', super().get_tag()[2])


setup(name='sluice', version='$version', description='The Python client of the Sluice input-data service',
      packages=['sluice'], package_data={'sluice': ['libsluice.so']}, python_requires='>=3.9',
      install_requires=['numpy'], cmdclass={'bdist_wheel': PlatformWheel}, distclass=WithLibrary, zip_safe=False)
EOF
mkdir -p "$out"
/usr/bin/python3 -m pip wheel --quiet --no-build-isolation --no-deps --no-index -w "$out" "$stage"
ls "$out"/sluice-"$version"-py3-none-*.whl
