"""Build of the `aggkernel` extension (plain C, no dependencies)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "aggkernel",
            sources=["src/module.c", "src/csv.c", "src/jsonl.c"],
            depends=["src/agg.h", "src/scan.h"],
            extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-Wextra", "-fno-strict-aliasing"],
        )
    ],
)
