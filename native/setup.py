"""Build of the `aggkernel` extension (plain C, no dependencies)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "aggkernel",
            sources=["src/module.c", "src/csv.c", "src/jsonl.c"],
            depends=["src/agg.h", "src/scan.h"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fno-strict-aliasing"],
            # Without a C compiler the install goes on without the scanner: the engine then uses
            # its pyarrow path alone (same answers, slower) and the app logs a warning at start.
            optional=True,
        )
    ],
)
