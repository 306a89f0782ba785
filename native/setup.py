"""Build of the `aggkernel` extension (plain C, no dependencies), profile-guided where GCC can.

Profile-guided (PGO): compiled with -fprofile-generate into a temporary folder, trained there by
pgo_train.py (subprocesses importing only that build, one per build of the scans:
TRAINED_BUILDS), then compiled again with -fprofile-use.
If any step fails (no profiling support, a cross build whose module cannot be imported, a failed
training), one line says so and the plain build runs. AGGKERNEL_PGO=0: the plain build only.
CFLAGS / LDFLAGS from the environment apply to every build.
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
TRAIN_TIMEOUT = 300
"""Seconds each training run may take (about one on a quiet machine)."""
TRAINED_BUILDS = ("portable", "x86-64-v2", "")
"""The scans' builds trained, each in a run of its own (`AGGKERNEL_BUILD` caps the import's
choice; "" leaves it to the CPU): each gets its profile, whichever the instances' CPUs pick."""


class PgoBuildExt(build_ext):  # type: ignore[misc]
    """build_ext with a profile-guided build of each extension, the plain one as fallback."""

    def build_extension(self, ext: Extension) -> None:
        """The PGO build when asked for and out of date, else (or if it fails) the plain one."""
        if (
            os.environ.get("AGGKERNEL_PGO", "1") == "0"
            or self.compiler.compiler_type != "unix"
            or self._current(ext)
        ):
            super().build_extension(ext)
            return
        try:
            with tempfile.TemporaryDirectory(prefix="aggkernel-pgo-") as tmp:
                self._build_pgo(ext, Path(tmp))
        except Exception as exc:  # any failure: the plain build decides (optional=True still applies)
            said = str(getattr(exc, "stderr", None) or exc).strip().splitlines() or [type(exc).__name__]
            print(f"aggkernel: profile-guided build failed ({said[-1][:200]}): plain build", file=sys.stderr)
            with self._set(force=True):  # whatever the failed build left is replaced
                super().build_extension(ext)

    def _current(self, ext: Extension) -> bool:
        """Whether the built module is newer than its sources and depends (the build skips it)."""
        target = Path(self.get_ext_fullpath(ext.name))
        inputs = [Path(p) for p in [*ext.sources, *ext.depends]]
        if self.force or not target.exists() or not all(p.exists() for p in inputs):
            return False
        return target.stat().st_mtime >= max(p.stat().st_mtime for p in inputs)

    def _build_pgo(self, ext: Extension, tmp: Path) -> None:
        """Instrumented build in tmp, training, then the build with the profile. Both builds put
        their objects in the same place: GCC names a profile after its object's path."""
        profile, objects, lib = tmp / "profile", str(tmp / "obj"), tmp / "lib"
        with self._set(build_temp=objects, build_lib=str(lib), force=True):
            super().build_extension(
                _with_flags(ext, [f"-fprofile-generate={profile}"], ["-fprofile-generate"])
            )
        for build in TRAINED_BUILDS:
            subprocess.run(
                [sys.executable, "-I", str(HERE / "pgo_train.py"), str(lib)],
                cwd=tmp,
                env={**os.environ, "AGGKERNEL_BUILD": build},
                check=True,
                timeout=TRAIN_TIMEOUT,
                capture_output=True,
                text=True,
            )
        if not any(profile.rglob("*.gcda")):
            raise RuntimeError("the training wrote no profile")
        # a function the training never ran is built as without a profile (-O3), not for size
        use = [
            f"-fprofile-use={profile}",
            "-fprofile-correction",
            "-Wno-missing-profile",
            "-fprofile-partial-training",
        ]
        with self._set(build_temp=objects, force=True):
            super().build_extension(_with_flags(ext, use, []))

    @contextlib.contextmanager
    def _set(self, **attributes: Any) -> Iterator[None]:
        """This command's attributes set for a while."""
        saved = {name: getattr(self, name) for name in attributes}
        try:
            for name, value in attributes.items():
                setattr(self, name, value)
            yield
        finally:
            for name, value in saved.items():
                setattr(self, name, value)


def _with_flags(ext: Extension, compile_args: list[str], link_args: list[str]) -> Extension:
    """A copy of `ext` with more compiler and linker arguments (after the environment's CFLAGS)."""
    out = copy.copy(ext)
    out.extra_compile_args = [*ext.extra_compile_args, *compile_args]
    out.extra_link_args = [*ext.extra_link_args, *link_args]
    return out


setup(
    ext_modules=[
        Extension(
            "aggkernel",
            sources=[
                "src/module.c",
                "src/csv.c",
                "src/csv_v2.c",
                "src/csv_v3.c",
                "src/jsonl.c",
                "src/jsonl_v2.c",
                "src/dict.c",
                "src/pq.c",
            ],
            # the build and its training too: a module older than either is built again
            depends=["src/agg.h", "src/scan.h", "src/fold.h", "setup.py", "pgo_train.py"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fno-strict-aliasing"],
            # Without a C compiler the install goes on without the scanner: the engine then uses
            # its pyarrow path alone (same answers, slower) and the app logs a warning at start.
            optional=True,
        )
    ],
    cmdclass={"build_ext": PgoBuildExt},
)
