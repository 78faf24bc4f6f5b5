"""setuptools hook: generates the gRPC stubs from ../proto when the package is built.

Everything else is in pyproject.toml. The stubs are written into the build folder only (never
into the source tree); see generate_stubs.py for the compiler it looks for.
"""
import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def _generator():
    spec = importlib.util.spec_from_file_location("generate_stubs",
                                                  os.path.join(HERE, "generate_stubs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        # An editable install imports from this folder: the stubs go next to the sources there
        # (memplan_client/_proto/, ignored by git).
        out = HERE if getattr(self, "editable_mode", False) else self.build_lib
        try:
            _generator().generate(out, proto_dir=os.environ.get("MEMPLAN_PROTO_DIR"))
        except RuntimeError as error:
            raise SystemExit(f"memplan-client: {error}")


setup(cmdclass={"build_py": BuildPyWithStubs})
