"""Run transformers' own model tests over vaswani_mt, for the transformers release that is installed.

    python scripts/run_transformers_tests.py                 # every test; exit code = pytest's
    python scripts/run_transformers_tests.py -k "sdpa or tied"
    python scripts/run_transformers_tests.py --cache DIR --keep-tree -- -x --tb=long

A model inside transformers is reviewed by its model test mixins (`ModelTesterMixin`, `ConfigTester`,
`PipelineTesterMixin`) run over a small tester written for it. Those mixins are not in the wheel, only in the source
distribution (sdist), and they change from release to release. So this script:

1. downloads the sdist of the installed version (`pip download --no-binary :all:`) into a cache folder
   (`~/.cache/vaswani_mt/transformers-tests/VERSION/`), once: a download lands under a temporary name and is renamed
   only after it opens and holds the mixins, so a broken download is never reused;
2. lays out a throwaway test tree in a temporary folder: the mixin files taken from the sdist, our stand-ins for the
   modules they import that the sdist lacks (`tests/generation/test_utils.py`, `tests/exporters/test_export.py`,
   `tests/utils/...`), our tester as `tests/models/vaswani/test_modeling_vaswani.py` and our conftest, all kept in
   tests/transformers_suite/ (names that the project's own pytest run does not collect);
3. runs pytest there in a subprocess, with the repository on PYTHONPATH and as many threads as this machine has
   cores, and exits with pytest's code. pytest's summary lists each failure and each skip with its reason.

Test requirements of the mixins that the environment lacks (`parameterized`) are installed into the cache folder,
never into the environment.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SUITE = REPO_ROOT / "tests" / "transformers_suite"
DEFAULT_CACHE_ROOT = Path.home() / ".cache" / "vaswani_mt" / "transformers-tests"
# The top-level files of the sdist's tests/ that the tester imports.
MIXIN_FILES = ("test_modeling_common.py", "test_configuration_common.py", "test_pipeline_mixin.py")
# Where each file of tests/transformers_suite/ goes in the throwaway tree.
TREE_FILES = {
    "conftest.py": "harness_conftest.py",
    "pytest.ini": "pytest.ini",
    "tests/models/vaswani/test_modeling_vaswani.py": "vaswani_tester.py",
    "tests/generation/test_utils.py": "generation_mixin.py",
    "tests/exporters/test_export.py": "export_mixin.py",
    "tests/utils/test_configuration_utils.py": "configuration_kwargs.py",
    "tests/utils/tiny_model_summary.json": "tiny_model_summary.json",
    # test_pipeline_mixin.py imports `src/transformers` beside tests/: an empty package whose import hands back the
    # installed transformers (transformers.utils.direct_transformers_import returns sys.modules["transformers"]).
    "src/transformers/__init__.py": "empty_package.py",
}
PACKAGES = ("tests", "tests/models", "tests/models/vaswani", "tests/generation", "tests/exporters", "tests/utils")
# Modules the mixins import that transformers does not require (its "testing" extra).
TEST_REQUIREMENTS = ("parameterized",)


def installed_transformers_version() -> str:
    return importlib.metadata.version("transformers")


def sdist_name(version: str) -> str:
    return f"transformers-{version}.tar.gz"


def run_pip(args: list[str], what: str) -> None:
    """`python -m pip ARGS`; a failure (no index reachable, no such release) ends the script with pip's message."""
    result = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"run_transformers_tests: could not {what} (pip exited {result.returncode}):\n"
                 f"{result.stdout[-2000:]}{result.stderr[-4000:]}")


def check_sdist(path: Path, version: str) -> None:
    """Raise `ValueError` unless `path` is a readable sdist of `version` holding every file of MIXIN_FILES."""
    with tarfile.open(path) as archive:
        names = set(archive.getnames())
    missing = [name for name in MIXIN_FILES if f"transformers-{version}/tests/{name}" not in names]
    if missing:
        raise ValueError(f"{path.name} lacks tests/{', tests/'.join(missing)}")


def fetch_sdist(version: str, cache: Path) -> Path:
    """The sdist of transformers `version` in `cache`, downloaded the first time."""
    target = cache / sdist_name(version)
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    print(f"run_transformers_tests: downloading the transformers {version} sdist into {cache}", flush=True)
    partial = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    try:
        run_pip(["download", "--quiet", "--no-deps", "--no-binary", ":all:", f"transformers=={version}",
                 "-d", str(partial)], f"download the transformers {version} sdist")
        downloaded = partial / sdist_name(version)
        try:
            check_sdist(downloaded, version)
        except (OSError, tarfile.TarError, ValueError) as error:
            sys.exit(f"run_transformers_tests: the downloaded sdist is unusable: {error}")
        os.replace(downloaded, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def missing_requirements() -> list[str]:
    return [name for name in TEST_REQUIREMENTS if importlib.util.find_spec(name) is None]


def fetch_requirements(cache: Path) -> Path | None:
    """A folder to put on PYTHONPATH holding the test requirements the environment lacks, or None if none is."""
    missing = missing_requirements()
    if not missing:
        return None
    site = cache / "site-packages"
    if all((site / name).exists() for name in missing):
        return site
    print(f"run_transformers_tests: installing {', '.join(missing)} into {site}", flush=True)
    partial = Path(tempfile.mkdtemp(prefix=".site-packages-", dir=cache))
    try:
        run_pip(["install", "--quiet", "--no-deps", "--target", str(partial), *missing],
                f"install {', '.join(missing)}")
        shutil.rmtree(site, ignore_errors=True)
        os.replace(partial, site)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return site


def extract_mixins(sdist: Path, version: str, tests_dir: Path) -> None:
    """Write MIXIN_FILES of the sdist's tests/ into `tests_dir` (only those: the rest of the sdist is not needed)."""
    with tarfile.open(sdist) as archive:
        for name in MIXIN_FILES:
            member = archive.extractfile(f"transformers-{version}/tests/{name}")
            (tests_dir / name).write_bytes(member.read())


def lay_out_tree(root: Path, sdist: Path, version: str) -> None:
    """The throwaway tree under `root`: packages, the sdist's mixins and the files of tests/transformers_suite/."""
    for package in PACKAGES:
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").touch()
    for destination, source in TREE_FILES.items():
        (root / destination).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SUITE / source, root / destination)
    extract_mixins(sdist, version, root / "tests")


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def child_environment(extra_paths: list[Path]) -> dict[str, str]:
    """This process's environment, plus the repository (and any fetched requirements) on PYTHONPATH, threads limited
    to the cores there are, and the Hub switched off (no test here needs it; the pipeline tests that do skip)."""
    env = dict(os.environ)
    paths = [str(REPO_ROOT), *map(str, extra_paths), *filter(None, [env.get("PYTHONPATH")])]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    threads = str(cpu_count())
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = threads
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def pytest_command(root: Path, keyword: str | None, extra: list[str]) -> list[str]:
    command = [sys.executable, "-m", "pytest", str(root / "tests" / "models" / "vaswani"),
               "-c", str(root / "pytest.ini"), "--rootdir", str(root), "-p", "no:cacheprovider", "-q", "-rfEs",
               "--tb=short"]
    if keyword:
        command += ["-k", keyword]
    return command + extra


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, help=f"folder for the sdist (default {DEFAULT_CACHE_ROOT}/VERSION)")
    parser.add_argument("-k", dest="keyword", help="pytest's -k expression: run only the matching tests")
    parser.add_argument("--keep-tree", action="store_true", help="keep the throwaway test tree and print its path")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    version = installed_transformers_version()
    cache = args.cache or DEFAULT_CACHE_ROOT / version
    sdist = fetch_sdist(version, cache)
    site = fetch_requirements(cache)
    root = Path(tempfile.mkdtemp(prefix=f"vaswani-transformers-{version}-tests-"))
    try:
        lay_out_tree(root, sdist, version)
        print(f"run_transformers_tests: transformers {version}, tests from {sdist}, {cpu_count()} threads", flush=True)
        command = pytest_command(root, args.keyword, args.pytest_args)
        return subprocess.run(command, cwd=root, env=child_environment([site] if site else [])).returncode
    finally:
        if args.keep_tree:
            print(f"run_transformers_tests: the test tree is kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
