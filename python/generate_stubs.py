#!/usr/bin/env python3
"""Generates the memplan.v1 protobuf and gRPC stubs of memplan_client from proto/.

    generate_stubs.py --out DIR [--proto-dir DIR] [--protoc PATH] [--grpc-python-plugin PATH]

Writes DIR/memplan_client/_proto/memplan/v1/planner_pb2{,_grpc}.py (and .pyi). The .proto is
compiled under the module path memplan_client/_proto/... so the stubs import each other inside
this package and install no top-level `memplan` module.

Compiler: `protoc` with `grpc_python_plugin` (Debian: protobuf-compiler, protobuf-compiler-grpc),
else the grpc_tools package's bundled protoc. Debian 12's python3-grpc-tools (1.14) bundles
protoc 3.6, which rejects proto3 `optional` fields (FixedKnobs), hence protoc first.
Used by python/setup.py (pip) and python/CMakeLists.txt (the build tree).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_FILES = ["memplan/v1/planner.proto"]
PACKAGE_PREFIX = os.path.join("memplan_client", "_proto")


def default_proto_dir():
    return os.path.join(os.path.dirname(HERE), "proto")


def protoc_command(protoc, plugin):
    """The compiler invocation prefix, or raises RuntimeError naming what is missing."""
    protoc = protoc or shutil.which("protoc")
    plugin = plugin or shutil.which("grpc_python_plugin")
    if protoc and plugin:
        return [protoc, "--plugin=protoc-gen-grpc_python=" + plugin]
    try:
        import grpc_tools  # noqa: F401  (only to see that it is there)
    except ImportError:
        raise RuntimeError(
            "no protobuf compiler for Python: install protoc and grpc_python_plugin "
            "(Debian: apt-get install protobuf-compiler protobuf-compiler-grpc) or grpcio-tools")
    import grpc_tools
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    return [sys.executable, "-m", "grpc_tools.protoc", "-I" + include]


def generate(out_dir, proto_dir=None, protoc=None, plugin=None):
    proto_dir = os.path.abspath(proto_dir or default_proto_dir())
    out_dir = os.path.abspath(out_dir)
    for name in PROTO_FILES:
        if not os.path.isfile(os.path.join(proto_dir, name)):
            raise RuntimeError(f"{os.path.join(proto_dir, name)} not found: build from a memplan "
                               "checkout (python/ next to proto/) or pass --proto-dir")
    command = protoc_command(protoc, plugin)
    with tempfile.TemporaryDirectory() as stage:
        # The .proto copied under the package path it is compiled to (see the module docstring).
        staged = []
        for name in PROTO_FILES:
            target = os.path.join(stage, PACKAGE_PREFIX, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(os.path.join(proto_dir, name), target)
            staged.append(os.path.join(PACKAGE_PREFIX, name))
        os.makedirs(out_dir, exist_ok=True)
        args = command + ["-I" + stage, "--python_out=" + out_dir, "--pyi_out=" + out_dir,
                          "--grpc_python_out=" + out_dir] + staged
        result = subprocess.run(args, cwd=stage, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError("protoc failed:\n" + " ".join(args) + "\n" + result.stderr)
    # Packages for every folder between memplan_client/ and the stubs.
    folder = os.path.join(out_dir, PACKAGE_PREFIX)
    for name in PROTO_FILES:
        parts = os.path.dirname(name).split("/")
        for depth in range(len(parts) + 1):
            init = os.path.join(folder, *parts[:depth], "__init__.py")
            if not os.path.exists(init):
                with open(init, "w"):
                    pass


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder that receives memplan_client/_proto")
    parser.add_argument("--proto-dir", default=None, help="the repository's proto/ (default: ../proto)")
    parser.add_argument("--protoc", default=None)
    parser.add_argument("--grpc-python-plugin", default=None)
    parser.add_argument("--stamp", default=None, help="file touched on success (for build tools)")
    args = parser.parse_args()
    try:
        generate(args.out, args.proto_dir, args.protoc, args.grpc_python_plugin)
    except RuntimeError as error:
        print(f"generate_stubs.py: {error}", file=sys.stderr)
        return 1
    if args.stamp:
        with open(args.stamp, "w"):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
