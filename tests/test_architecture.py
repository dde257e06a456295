"""The wings of the package stay apart, checked on the source (every import, lazy ones included) and
at run time (what importing each module loads).

- ``errors`` imports nothing of ours; ``contract`` imports only ``errors`` and itself (stdlib only);
- ``runtime`` imports only ``contract``, ``errors`` and itself (it ships into the container);
- ``aws`` (the AWS schema every side uses: instance types, S3 objects, the request's and the tuning
  job's rules) imports only ``contract`` and ``errors``;
- ``launch`` (the laptop's SageMaker I/O) imports neither ``local`` nor ``runtime`` nor ``cli``, and
  neither ``host`` nor ``platforms`` imports ``launch``;
- ``host`` (what a host does around the ranks) serves ``local`` and ``platforms``, and imports neither;
- nothing but ``cli`` imports ``local`` (and ``local`` itself): the platforms run on ``host``;
- the SDK side never loads TensorFlow/Horovod, the runtime never loads the SageMaker SDK;
- only the registry of distributions (``contract/distributions.py``) compares a distribution's name;
- only the registry and local mode's launcher table (``local/launchers/table.py``) compare a launcher's
  name;
- only the registry of platforms (``cli/platforms.py``) compares a platform's name (and only the two
  registries a Kubernetes kind);
- only the contract (``contract/training_request.py``, ``contract/request_rules.py``) and the job spec
  read a CreateTrainingJob request's raw keys; everything else takes typed fields;
- on the SDK side only ``contract/environment.py`` reads (or writes) the process's environment;
- the core imports no framework: every runtime module outside the framework folders
  (``FRAMEWORK_SIDES``: ``runtime/tensorflow/`` and ``runtime/torch/``) imports none of tensorflow, keras,
  tf_keras, horovod, torch at any depth, and a framework's folder only inside a function (a convenience
  constructor), so importing the core loads no framework; the two folders import the core, never each
  other;
- no import circle between modules of ``sagemaker_dist`` (lazy imports included).
"""

from __future__ import annotations

import ast
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sagemaker_dist

PACKAGE = Path(sagemaker_dist.__file__).parent
WINGS = ("errors", "contract", "aws", "launch", "host", "local", "runtime", "platforms", "cli")
# wing -> the wings of ours it may import
ALLOWED = {
    "errors": set(),
    "contract": {"errors"},
    "runtime": {"errors", "contract"},
    "aws": {"errors", "contract"},
    "launch": {"errors", "contract", "aws"},
    "host": {"errors", "contract", "aws", "runtime"},
    "local": {"errors", "contract", "aws", "launch", "runtime", "host"},
    "platforms": {"errors", "contract", "aws", "host"},
    "cli": {"errors", "contract", "aws", "launch", "host", "local", "platforms"},
}
THIRD_PARTY_OK_IN_CONTRACT = {"crc32c"}  # stdlib only, but TFRecord's checksum (record_formats)

SDK_MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(sagemaker_dist.__path__, "sagemaker_dist.")
    if not m.name.startswith("sagemaker_dist.runtime") and not m.name.endswith("__main__")  # runs the CLI
)
RUNTIME_MODULES = sorted(
    m.name for m in pkgutil.walk_packages(sagemaker_dist.runtime.__path__, "sagemaker_dist.runtime.")
)


def _wing(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "sagemaker_dist" and parts[1] in WINGS else None


def _node_imports(node: ast.AST, path: Path) -> list[str]:
    """The modules one statement imports (for ``from m import n``: ``m`` and ``m.n``, which may be one)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            raise AssertionError(f"{path}: relative import; write the full sagemaker_dist.* path")
        return [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
    return []


def _source_imports(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth (function-level imports too)."""
    return [name for node in ast.walk(ast.parse(path.read_text())) for name in _node_imports(node, path)]


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        yield module, path


def test_every_module_belongs_to_a_wing():
    stray = [m for m, _ in _sources() if m != "sagemaker_dist" and _wing(m) is None]
    assert stray == [], f"modules outside {WINGS}: {stray}"


def test_wings_import_only_what_they_may():
    broken = []
    for module, path in _sources():
        own = _wing(module)
        if own is None:
            continue
        for name in _source_imports(path):
            other = _wing(name)
            if other and other != own and other not in ALLOWED[own]:
                broken.append(f"{module} imports {name}")
    assert broken == []


def test_contract_is_stdlib_only():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    foreign = []
    for module, path in _sources():
        if _wing(module) in ("contract", "errors"):
            for name in _source_imports(path):
                top = name.split(".")[0]
                if top and top != "sagemaker_dist" and top not in stdlib | THIRD_PARTY_OK_IN_CONTRACT:
                    foreign.append(f"{module} imports {name}")
    assert foreign == []


def test_the_rule_check_catches_a_violation(tmp_path):
    """The checker itself: an import that breaks a rule is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from sagemaker_dist.local.job import run_local\n")
    assert "sagemaker_dist.local.job" in _source_imports(bad)
    assert _wing("sagemaker_dist.local.job") not in ALLOWED["launch"]
    assert _wing("sagemaker_dist.local.job") not in ALLOWED["platforms"]


def test_each_public_name_has_one_import_path():
    """The façades (``sagemaker_dist`` for the SDK side and local mode, ``sagemaker_dist.runtime`` in
    the container) are the only packages that re-export; no other package re-exports a public name."""
    import importlib

    import sagemaker_dist.runtime

    public = set(sagemaker_dist.__all__) | set(sagemaker_dist.runtime.__all__)
    assert set(sagemaker_dist.__all__).isdisjoint(sagemaker_dist.runtime.__all__)
    reexports = []
    for path in sorted(PACKAGE.rglob("__init__.py")):
        if path.parent in (PACKAGE, PACKAGE / "runtime"):
            continue
        module = ".".join(path.parent.relative_to(PACKAGE.parent).parts)
        package = importlib.import_module(module)
        names = set(getattr(package, "__all__", ())) | set(getattr(package, "_EXPORTS", ()))
        own = vars(package)  # its submodules are attributes too (tensorflow.keras): not re-exports
        names |= {n for n in public if n in own and getattr(own[n], "__name__", None) != f"{module}.{n}"}
        reexports += [f"{module}.{name}" for name in sorted(names & public)]
    assert reexports == []


def _loaded_after_import(modules: list[str], watched: list[str]) -> dict[str, list[str]]:
    """Import each module in a fresh interpreter; return which watched packages each one loaded."""
    code = (
        "import importlib, json, sys\n"
        f"watched = {watched!r}\n"
        f"modules = {modules!r}\n"
        "out = {}\n"
        "for name in modules:\n"
        "    importlib.import_module(name)\n"
        "    hit = [w for w in watched if w in sys.modules]\n"
        "    if hit:\n"
        "        out[name] = hit\n"
        "        break\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_module_lists_are_not_empty():
    assert "sagemaker_dist.runtime.stop" in CORE_MODULES
    assert "sagemaker_dist.runtime.checkpoint_format" in CORE_MODULES
    assert "sagemaker_dist.runtime.epoch_reader.reader" in CORE_MODULES
    assert "sagemaker_dist.runtime.tensorflow.keras.checkpoints" not in CORE_MODULES
    assert "sagemaker_dist.launch.sharding" in SDK_MODULES
    assert "sagemaker_dist.launch.estimator" in SDK_MODULES
    assert "sagemaker_dist.runtime.ranks" in RUNTIME_MODULES


def test_sdk_side_never_imports_tensorflow_or_horovod():
    assert _loaded_after_import(SDK_MODULES, ["tensorflow", "horovod", "keras"]) == {}


def test_runtime_never_imports_the_sagemaker_sdk():
    assert _loaded_after_import(RUNTIME_MODULES, ["sagemaker", "sagemaker.core"]) == {}


def test_public_api_resolves():
    for name in sagemaker_dist.__all__:
        assert getattr(sagemaker_dist, name) is not None, name


def test_public_api_lists_the_error_families_and_the_types_users_get():
    for name in (
        "SageMakerDistError",
        "ConfigurationError",
        "AwsError",
        "DataError",
        "JobFailedError",
        "PreparedJob",
        "LocalJobResult",
        "LocalBackend",
        "TrainingJobHandle",
    ):
        assert name in sagemaker_dist.__all__, name
    from sagemaker_dist.errors import ConfigurationError, SageMakerDistError

    assert issubclass(ConfigurationError, ValueError) and issubclass(ConfigurationError, SageMakerDistError)


def test_the_compiled_readers_start_up_loads_no_python_reader():
    """A fresh process's PipeModeDataset pays for its imports before its first batch: the Python
    reader's framers and crc32c (about 6 ms) are imported only where that reader runs."""
    watched = ["crc32c", "sagemaker_dist.runtime.framing", "sagemaker_dist.runtime.epoch_reader.reader"]
    assert _loaded_after_import(["sagemaker_dist.runtime.tensorflow.data.pipe_dataset"], watched) == {}


REGISTRY_MODULE = "sagemaker_dist.contract.distributions"
NAME_MODULES = (REGISTRY_MODULE, "sagemaker_dist.contract.layout")  # where the names' constants live
COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def _name_constants() -> set[str]:
    """Module-level names in the registry (and the layout, which keeps its old names) bound to a
    registered distribution name or to the tuple of them."""
    import importlib

    from sagemaker_dist.contract.distributions import NAMES

    found = set()
    for module in NAME_MODULES:
        for key, value in vars(importlib.import_module(module)).items():
            if isinstance(value, (str, tuple)) and (value in NAMES or value == NAMES):
                found.add(key)
    return found


def _distribution_name_comparisons(
    path: Path, names: tuple[str, ...], constants: set[str], name_modules: tuple[str, ...] = NAME_MODULES
) -> list[str]:
    """Each comparison (==, !=, in, not in, is, match) in ``path`` with an operand that is a
    distribution's name (or another family of ``names``): a string literal equal to one (alone or in a
    tuple, list or set literal), or a constant of ``name_modules`` that holds one (imported by name,
    read off the module, or the file's own)."""
    tree = ast.parse(path.read_text())
    imported, modules = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in name_modules:
            imported |= {a.asname or a.name for a in node.names if a.name in constants}
        elif isinstance(node, ast.ImportFrom):
            modules |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in name_modules}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name in name_modules}

    def is_name(operand) -> bool:
        if isinstance(operand, ast.Constant):
            return isinstance(operand.value, str) and operand.value in names
        if isinstance(operand, (ast.Tuple, ast.List, ast.Set)):
            return any(is_name(e) for e in operand.elts)
        if isinstance(operand, ast.Name):
            return operand.id in imported
        if isinstance(operand, ast.Attribute):
            return operand.attr in constants and ast.unparse(operand.value) in modules
        return False

    for node in tree.body:  # the file's own constants bound to a name (as the layout defined its names)
        if isinstance(node, ast.Assign) and is_name(node.value):
            imported |= {t.id for t in node.targets if isinstance(t, ast.Name)}

    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, COMPARISONS) for op in node.ops):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        if any(is_name(o) for o in operands):
            hits.append(f"{node.lineno}: {ast.unparse(node)}")
    return hits


def test_only_the_registry_compares_distribution_names():
    """Everything asks the registry of distributions (``contract/distributions.py``) what a
    distribution does; no other module compares a distribution's name, so a new distribution is one
    entry there and its launcher, not a branch in every module."""
    from sagemaker_dist.contract.distributions import NAMES

    constants = _name_constants()
    assert {"HOROVOD", "TF_MWMS", "DISTRIBUTIONS"} <= constants
    hits = []
    for module, path in _sources():
        if module != REGISTRY_MODULE:
            rel = path.relative_to(PACKAGE.parent)
            hits += [f"{rel}:{hit}" for hit in _distribution_name_comparisons(path, NAMES, constants)]
    assert hits == []


def test_the_registry_rule_catches_a_comparison(tmp_path):
    """The checker itself: each way of comparing a name is reported; asking the registry is not."""
    from sagemaker_dist.contract.distributions import NAMES

    bad = tmp_path / "bad.py"
    bad.write_text(
        "from sagemaker_dist.contract.layout import TF_MWMS as T, HOROVOD\n"
        "from sagemaker_dist.contract import layout\n"
        "import sagemaker_dist.contract.distributions as reg\n"
        "a = job.distribution == 'tf-mwms'\n"
        "b = x != T\n"
        "c = d in ('horovod', 'other')\n"
        "e = HOROVOD == y\n"
        "f = z not in layout.DISTRIBUTIONS\n"
        "g = reg.TF_MWMS is w\n"
        "match q:\n"
        "    case 'horovod':\n"
        "        pass\n"
        "ok = reg.distribution(job.distribution).mpi and name == 'ShardedByS3Key' and h == HOROVOD_X\n"
        "DISTRIBUTIONS = ('horovod', 'tf-mwms')\n"
        "def own(d):\n"
        "    return d not in DISTRIBUTIONS\n"
        "DEFAULT = 'other'\n"
        "ok = d == DEFAULT\n"
    )
    hits = _distribution_name_comparisons(bad, NAMES, _name_constants())
    assert [h.split(":")[0] for h in hits] == ["4", "5", "6", "7", "8", "9", "11", "16"], hits


LAUNCHER_TABLE_MODULE = "sagemaker_dist.local.launchers.table"
# where the launchers' names live: the registry, and the launchers' package that re-exports them
LAUNCHER_NAME_MODULES = (REGISTRY_MODULE, "sagemaker_dist.local.launchers")


def _launcher_names() -> tuple[str, ...]:
    from sagemaker_dist.contract.distributions import REGISTRY, USER_LAUNCHERS

    return tuple(sorted(set(USER_LAUNCHERS) | {n for d in REGISTRY.values() for n in d.local_launchers}))


def _launcher_name_constants() -> set[str]:
    """Module-level names of the registry and the launchers' package bound to a launcher's name or to
    a tuple of them."""
    import importlib

    names = _launcher_names()
    found = set()
    for module in LAUNCHER_NAME_MODULES:
        for key, value in vars(importlib.import_module(module)).items():
            if (isinstance(value, str) and value in names) or (
                isinstance(value, tuple) and value and all(isinstance(v, str) and v in names for v in value)
            ):
                found.add(key)
    return found


def test_only_the_registry_and_the_launcher_table_compare_launcher_names():
    """Local mode turns a launcher's name into code in one place, ``local/launchers/table.py`` (name ->
    implementation of ``launchers/base.Launcher``); the registry says which launchers run a
    distribution. No other module compares a launcher's name: a new launcher is one class and one row."""
    constants = _launcher_name_constants()
    assert {"HOROVODRUN", "TOOLKIT", "CONTAINER", "TF_CONFIG", "USER_LAUNCHERS", "LAUNCHERS"} <= constants
    hits = []
    for module, path in _sources():
        if module not in (REGISTRY_MODULE, LAUNCHER_TABLE_MODULE):
            rel = path.relative_to(PACKAGE.parent)
            found = _distribution_name_comparisons(path, _launcher_names(), constants, LAUNCHER_NAME_MODULES)
            hits += [f"{rel}:{hit}" for hit in found]
    assert hits == []


def test_the_launcher_rule_catches_a_comparison(tmp_path):
    """The checker itself: a launcher's name compared as a literal, an imported constant or one read
    off the package is reported; asking the table is not."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from sagemaker_dist.local.launchers import CONTAINER, LAUNCHERS as L\n"
        "from sagemaker_dist.local import launchers\n"
        "from sagemaker_dist.contract.distributions import TF_CONFIG_LAUNCHER\n"
        "a = launcher == 'toolkit'\n"
        "b = x != CONTAINER\n"
        "c = y in L\n"
        "d = z == launchers.HOROVODRUN\n"
        "e = w is TF_CONFIG_LAUNCHER\n"
        "ok = launcher_class(name).defaults_to_one_host and name == 'toolkits'\n"
    )
    found = _distribution_name_comparisons(
        bad, _launcher_names(), _launcher_name_constants(), LAUNCHER_NAME_MODULES
    )
    assert [h.split(":")[0] for h in found] == ["4", "5", "6", "7", "8"], found


PLATFORM_REGISTRY_MODULE = "sagemaker_dist.cli.platforms"
# where the platforms' names live: the registry of platforms, and the registry of distributions for
# Kubernetes' kinds (MPIJob, TrainJob: the k8s row's options, which a job's distribution picks)
PLATFORM_NAME_MODULES = (PLATFORM_REGISTRY_MODULE, REGISTRY_MODULE)


def _platform_names() -> tuple[str, ...]:
    from sagemaker_dist.cli.platforms import NAMES
    from sagemaker_dist.contract.distributions import REGISTRY

    return tuple(sorted({*NAMES, *(d.kubernetes for d in REGISTRY.values() if d.kubernetes)}))


def _platform_name_constants() -> set[str]:
    """Module-level names of the two registries bound to a platform's name or a tuple of them."""
    import importlib

    names = _platform_names()
    found = set()
    for module in PLATFORM_NAME_MODULES:
        for key, value in vars(importlib.import_module(module)).items():
            if (isinstance(value, str) and value in names) or (
                isinstance(value, tuple) and value and all(isinstance(v, str) and v in names for v in value)
            ):
                found.add(key)
    return found


def test_only_the_registries_compare_platform_names():
    """The CLI and ``tune`` look a platform up in ``cli/platforms.py`` (one row each: SageMaker, local
    mode, Kubernetes, Slurm) and call only its protocol; the Kubernetes kind is the registry of
    distributions' word, looked up by the planners. No other module compares a platform's name: a new
    platform is a module and a row, not a branch in the CLI, ``tune`` and the docs."""
    constants = _platform_name_constants()
    assert {"sagemaker", "local", "slurm", "k8s", "MPIJob", "TrainJob"} <= set(_platform_names())
    assert {"NAMES", "DEFAULT_TUNING", "MPIJOB", "TRAINJOB"} <= constants
    hits = []
    for module, path in _sources():
        if module not in PLATFORM_NAME_MODULES:
            rel = path.relative_to(PACKAGE.parent)
            found = _distribution_name_comparisons(path, _platform_names(), constants, PLATFORM_NAME_MODULES)
            hits += [f"{rel}:{hit}" for hit in found]
    assert hits == [], "a platform's name compared outside the registries:\n" + "\n".join(hits)


def test_the_platform_rule_catches_a_comparison(tmp_path):
    """The checker itself: a platform's name or a Kubernetes kind compared as a literal, an imported
    constant or one read off the registry is reported; asking the registry is not."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from sagemaker_dist.cli.platforms import DEFAULT_TUNING, NAMES as N\n"
        "from sagemaker_dist.contract.distributions import TRAINJOB\n"
        "from sagemaker_dist.cli import platforms\n"
        "a = mode == 'local'\n"
        "b = mode != 'k8s'\n"
        "c = x in ('slurm', 'other')\n"
        "d = experiment['kind'] == 'TrainJob'\n"
        "e = y == DEFAULT_TUNING\n"
        "f = z in N\n"
        "g = w is TRAINJOB\n"
        "h = v == platforms.DEFAULT_TUNING\n"
        "match m:\n"
        "    case 'sagemaker':\n"
        "        pass\n"
        "ok = platform(args.platform).tune_option and name == 'locals' and TRIALS[kind]\n"
    )
    found = _distribution_name_comparisons(
        bad, _platform_names(), _platform_name_constants(), PLATFORM_NAME_MODULES
    )
    assert [h.split(":")[0] for h in found] == ["4", "5", "6", "7", "8", "9", "10", "11", "13"], found


FRAMEWORKS = ("tensorflow", "keras", "tf_keras", "horovod", "torch")
# The runtime's framework folders: TensorFlow, Keras and Horovod, PyTorch. Every other runtime module is
# the framework-neutral core; a third framework is a third folder here.
FRAMEWORK_SIDES = ("sagemaker_dist.runtime.tensorflow", "sagemaker_dist.runtime.torch")


def _on_a_side(module: str) -> bool:
    return any(module == side or module.startswith(side + ".") for side in FRAMEWORK_SIDES)


CORE_MODULES = sorted(
    m for m, _ in _sources() if m.startswith("sagemaker_dist.runtime") and not _on_a_side(m)
)


def _framework_imports(path: Path) -> list[str]:
    """What ``path`` imports of a framework (at any depth) or, at module level, of a framework's side."""
    tree = ast.parse(path.read_text())
    functions = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    lazy = {id(node) for function in functions for node in ast.walk(function)}
    found = []
    for node in ast.walk(tree):
        for name in _node_imports(node, path):
            if name.split(".")[0] in FRAMEWORKS:
                found.append(f"{name} (line {node.lineno})")
            elif _on_a_side(name) and id(node) not in lazy:
                found.append(f"{name} at module level (line {node.lineno})")
    return found


def test_the_runtime_core_imports_no_framework():
    """The core (config, ranks, FIFO, framing, the epoch reader, the stop agreement, the checkpoint
    format and its atomic write, S3 mirror and TensorBoard sync, ...) serves every framework's side,
    so it imports none: a module that needs TensorFlow or PyTorch belongs in ``tensorflow/`` or ``torch/``
    (or a new framework's folder beside them, added to ``FRAMEWORK_SIDES``)."""
    hits = []
    for module, path in _sources():
        if module in CORE_MODULES:
            hits += [f"{module} imports {name}" for name in _framework_imports(path)]
    assert hits == [], "the framework-neutral runtime core imports a framework:\n" + "\n".join(hits)


def test_the_core_rule_catches_a_framework_import(tmp_path):
    """The checker itself: a framework imported in a function, or a side at module level, is reported;
    a side imported inside a function (a convenience constructor) is not."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import numpy\n"
        "from sagemaker_dist.runtime.tensorflow.keras import callbacks\n"
        "def f():\n"
        "    import torch.distributed as dist\n"
        "    from tf_keras import layers\n"
        "    from sagemaker_dist.runtime.tensorflow.keras.callbacks import MetricLine\n"
    )
    found = _framework_imports(bad)
    assert [f.split(" ")[0] for f in found] == [
        "sagemaker_dist.runtime.tensorflow.keras",
        "sagemaker_dist.runtime.tensorflow.keras.callbacks",
        "torch.distributed",
        "tf_keras",
        "tf_keras.layers",
    ], found


def test_the_framework_sides_import_the_core_not_each_other():
    torch_side = "sagemaker_dist.runtime.torch"
    crossing = []
    for module, path in _sources():
        if _on_a_side(module):
            on_torch = module.startswith(torch_side)
            for name in _source_imports(path):
                if _on_a_side(name) and name.startswith(torch_side) != on_torch:
                    crossing.append(f"{module} imports {name}")
    assert crossing == [], "one framework's side imports another's:\n" + "\n".join(crossing)


def test_importing_the_core_loads_no_framework():
    assert _loaded_after_import(CORE_MODULES, list(FRAMEWORKS)) == {}


def _module_names() -> set[str]:
    """Our modules: the Python sources and the compiled extensions (``framing/_*.c``)."""
    names = {module for module, _ in _sources()}
    for source in PACKAGE.rglob("*.c"):
        names.add(".".join(source.relative_to(PACKAGE.parent).with_suffix("").parts))
    return names


def _import_graph(sources, known: set[str]) -> dict[str, set[str]]:
    """module -> the modules of ours it imports, lazy imports included. ``from p import n`` is an edge to
    ``p.n`` where that is a module, else to ``p`` (the package whose name it reads)."""
    graph = {}
    for module, path in sources:
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                targets = [f"{node.module}.{a.name}" for a in node.names]
                edges |= {t if t in known else node.module for t in targets}
            else:
                edges |= {name for name in _node_imports(node, path) if name in known}
        graph[module] = {e for e in edges if e in known and e != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected set of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            members = []
            while not members or members[-1] != node:
                members.append(stack.pop())
                on_stack.discard(members[-1])
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_between_modules():
    """No module of ours imports, through any chain of imports (lazy ones too), a module that imports it:
    a convenience constructor on one side imports the other side lazily, in one direction only."""
    circles = _circles(_import_graph(_sources(), _module_names()))
    assert circles == [], "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_catches_a_circle(tmp_path):
    """The checker itself: a circle through a lazy import is reported, a one-way chain is not."""
    files = {
        "a": "from b import f\n",
        "b": "import c\ndef f():\n    from a import g\n",
        "c": "import d\n",
        "d": "",
    }
    sources = []
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
        sources.append((name, tmp_path / f"{name}.py"))
    assert _circles(_import_graph(sources, set(files))) == [["a", "b"]]


def _private_imports(sources, known: set[str]) -> list[str]:
    """``from ours import _name`` where ``_name`` is not a module: a private name read across modules,
    which ties one module to another's insides (a module that shares it names it publicly)."""
    found = []
    for module, path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in known:
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and f"{node.module}.{alias.name}" not in known:
                        found.append(f"{module}:{node.lineno} imports {node.module}.{alias.name}")
    return found


def test_no_module_imports_another_modules_private_name():
    found = _private_imports(_sources(), _module_names())
    assert found == [], "private names imported across modules:\n" + "\n".join(found)


def test_the_private_import_rule_catches_one_and_not_a_module(tmp_path):
    files = {"a": "from b import _helper\nfrom pkg import _ext\n", "b": "def _helper():\n    pass\n"}
    sources = []
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
        sources.append((name, tmp_path / f"{name}.py"))
    assert _private_imports(sources, {"a", "b", "pkg", "pkg._ext"}) == ["a:1 imports b._helper"]


CONTRACT_PREFIX = "sagemaker_dist.contract"
_OPT_ML_PATH = re.compile(r"(^|:)/opt/ml(/|$)")


def _opt_ml_paths(path: Path) -> list[str]:
    """String literals (f-strings' literal parts too) that are ``/opt/ml`` paths: starting with it, or
    after a colon as in a volume spec; prose that mentions the tree is left alone."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _OPT_ML_PATH.search(node.value):
            found.append(f"line {node.lineno}: {node.value[:60]!r}")
    return found


def _found_outside(find, allowed: tuple[str, ...]) -> list[str]:
    """What ``find(path)`` reports in every module but ``allowed`` ones (a module, or a package and
    everything in it)."""

    def is_allowed(module: str) -> bool:
        return any(module == a.rstrip(".") or module.startswith(a.rstrip(".") + ".") for a in allowed)

    return [f"{module} {hit}" for module, path in _sources() if not is_allowed(module) for hit in find(path)]


def test_opt_ml_is_spelled_only_in_the_contract():
    """SageMaker's container root is one contract rule (``contract.paths.DEFAULT_ROOT`` and the paths
    under it): a launcher, host or platform module that writes the literal drifts from it unseen."""
    hits = _found_outside(_opt_ml_paths, (CONTRACT_PREFIX,))
    assert hits == [], "/opt/ml spelled outside the contract:\n" + "\n".join(hits)


def test_the_opt_ml_rule_catches_a_path_and_not_prose(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        'ROOT = "/opt/ml"\n'
        'volume = f"{tree}:/opt/ml"\n'
        'model = "/opt/ml/model"\n'
        'help = "where the per-host /opt/ml trees go"\n'
    )
    assert sorted(hit.split(":")[0] for hit in _opt_ml_paths(bad)) == ["line 1", "line 2", "line 3"]


# The CreateTrainingJob request's members (and those of its parts) that a reader of the raw dict names.
REQUEST_KEYS = frozenset(
    """TrainingJobName RoleArn AlgorithmSpecification TrainingImage TrainingInputMode MetricDefinitions
    HyperParameters InputDataConfig ChannelName DataSource S3DataSource S3Uri S3DataType
    S3DataDistributionType InputMode ContentType CompressionType RecordWrapperType ShuffleConfig Seed
    OutputDataConfig S3OutputPath KmsKeyId ResourceConfig InstanceCount InstanceType VolumeSizeInGB
    VolumeKmsKeyId StoppingCondition MaxRuntimeInSeconds MaxWaitTimeInSeconds CheckpointConfig LocalPath
    TensorBoardOutputConfig Environment EnableManagedSpotTraining VpcConfig Subnets SecurityGroupIds Tags
    EnableNetworkIsolation RetryStrategy Regex""".split()
)
# Where the raw request may be read: the contract (``training_request.py`` reads it into typed fields,
# ``request_rules.py`` checks it whole) and the job spec built from it. The runtime reads the container's
# config files (``inputdataconfig.json``), which SageMaker writes with some of the same names.
REQUEST_READERS = ("sagemaker_dist.contract.", "sagemaker_dist.host.job_spec", "sagemaker_dist.runtime")
# Modules that read AWS's responses, whose members share the request's names (a tuning job's trial
# summaries name each trial's TrainingJobName), and the local demo's prepared request, which its
# owner moves to ``PreparedJob.training`` and ``edited_request``.
NOT_THE_REQUEST = {
    "sagemaker_dist.launch.tuning_handle": "TrialSummary.from_summary reads ListTrainingJobs' summaries",
}
_KEY_READERS = ("get", "pop", "setdefault")


def _request_key_reads(path: Path) -> list[str]:
    """Each read of a request member by its name in ``path``: ``x["Key"]`` (not an assignment to it),
    ``x.get("Key")`` / ``pop`` / ``setdefault``, and ``"Key" in x``. Dict literals that write a request,
    and names in prose, are not reads."""

    def is_key(node) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and node.value in REQUEST_KEYS
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(is_key(e) for e in node.elts)

    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        read = (
            (isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Store) and is_key(node.slice))
            or (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _KEY_READERS
                and bool(node.args)
                and is_key(node.args[0])
            )
            or (
                isinstance(node, ast.Compare)
                and any(isinstance(op, (ast.In, ast.NotIn, ast.LtE, ast.GtE)) for op in node.ops)
                and is_key(node.left)
            )
        )
        if read:
            hits.append((node.lineno, f"{node.lineno}: {ast.unparse(node)[:80]}"))
    return [hit for _, hit in sorted(hits)]


def test_the_request_is_read_only_by_the_contract_and_the_job_spec():
    """A CreateTrainingJob request is read once, into ``contract.training_request.TrainingRequest`` (and
    the ``JobSpec`` that extends it for a host): every other module takes typed fields, so a member's
    default or shape is decided in one place and no reader re-reads the dict its own way."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    members, shapes = set(), [model.operation_model("CreateTrainingJob").input_shape]
    while shapes:
        shape = shapes.pop()
        nested = getattr(shape, "members", None) or {}
        if shape.type_name == "list":
            shapes.append(shape.member)
        for name, member in nested.items():
            if name not in members:
                members.add(name)
                shapes.append(member)
    assert REQUEST_KEYS <= members, sorted(REQUEST_KEYS - members)  # every key is the request's own
    hits = _found_outside(_request_key_reads, (*REQUEST_READERS, *NOT_THE_REQUEST))
    assert hits == [], "the raw request read outside the contract and the job spec:\n" + "\n".join(hits)


def test_the_request_rule_catches_a_read(tmp_path):
    """The checker itself: each way of reading a member by name is reported; writing a request and
    reading a typed field are not."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        'a = request["InputDataConfig"]\n'
        'b = (request.get("CheckpointConfig") or {}).get("S3Uri")\n'
        'c = "Environment" in request\n'
        'd = request["HyperParameters"].pop("epochs")\n'
        'e = {"AlgorithmSpecification", "InputDataConfig"} <= set(request)\n'
        'request["ResourceConfig"] = {"InstanceType": "ml.p4d.24xlarge"}\n'
        'ok = job.checkpoint_s3_uri and {"TrainingJobName": name} and response["Key"]\n'
    )
    assert [h.split(":")[0] for h in _request_key_reads(bad)] == ["1", "2", "2", "3", "4", "5"]


# What a job's hosts derive from its request, each worked out in one module: the hosts' names and the
# ranks' slots (the job spec, from the contract's rule), the script's argument list (the job spec), the
# trees and the source package (the host lifecycle, for local mode and every pipe agent alike).
DERIVED_ONCE = {
    "rank_slots": ("sagemaker_dist.contract.rank_slots", "sagemaker_dist.host.job_spec"),
    "host_names": ("sagemaker_dist.contract.rank_slots", "sagemaker_dist.host.job_spec"),
    "toolkit_args": ("sagemaker_dist.contract.toolkit", "sagemaker_dist.host.job_spec"),
    "build_host_trees": ("sagemaker_dist.host.lifecycle",),
    "host_trees_for": ("sagemaker_dist.host.lifecycle",),
    "fetch_source_dir": ("sagemaker_dist.host.lifecycle",),
}


def _calls_of(name: str):
    def find(path: Path) -> list[str]:
        return [
            f"{node.lineno}: {ast.unparse(node)[:80]}"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call)
            and name in (getattr(node.func, "id", None), getattr(node.func, "attr", None))
        ]

    return find


@pytest.mark.parametrize("name", sorted(DERIVED_ONCE))
def test_what_the_hosts_derive_from_the_request_is_worked_out_in_one_module(name):
    """The request is read once (above), and what its hosts derive from it is worked out once: a
    launcher, the rank entry or a platform reads the job spec's ``host_names``, ``slots`` and
    ``toolkit_args`` and the lifecycle's trees, not a formula of its own beside them."""
    hits = _found_outside(_calls_of(name), DERIVED_ONCE[name])
    assert hits == [], f"{name}() called outside {DERIVED_ONCE[name]}:\n" + "\n".join(hits)


def test_the_derivation_rule_catches_a_call(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("a = rank_slots(names, 2)\nb = slots.rank_slots(names, 2)\nc = job.slots\n")
    assert [h.split(":")[0] for h in _calls_of("rank_slots")(bad)] == ["1", "2"]


ENVIRONMENT_MODULE = "sagemaker_dist.contract.environment"
RUNTIME_ENVIRONMENT_MODULE = "sagemaker_dist.runtime.environment"
USER_SCRIPTS = "sagemaker_dist.local.demo_job"  # the demo's training scripts: a user's, as any script
RANK_SIDE = ("sagemaker_dist.runtime", USER_SCRIPTS)
_ENVIRON_CALLS = ("getenv", "putenv", "unsetenv", "getenvb")


def _environment_reads(path: Path) -> list[str]:
    """Each use of this process's environment in ``path``: ``os.environ`` (read, written or copied) and
    ``os.getenv``/``putenv``/``unsetenv``, as ``os.x`` or imported from ``os`` by name."""
    tree = ast.parse(path.read_text())
    names = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "os"
        for alias in node.names
        if alias.name in ("environ", "environb", *_ENVIRON_CALLS)
    }
    hits = []
    for node in ast.walk(tree):
        named = (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in ("environ", "environb", *_ENVIRON_CALLS)
        ) or (isinstance(node, ast.Name) and node.id in names)
        if named:
            hits.append((node.lineno, f"{node.lineno}: {ast.unparse(node)}"))
    return [hit for _, hit in sorted(hits)]


def test_the_sdk_side_reads_the_environment_in_one_module():
    """Every variable the SDK side reads (the CLI, the launcher, local mode, the hosts, the platforms) is
    named once in ``contract/environment.py`` and read through its accessors, so what sagemaker-dist
    takes from the environment is one list. The runtime and the demo's training scripts run in the
    ranks (``SM_*`` is their input, as for any script): they are not the SDK side."""
    hits = _found_outside(_environment_reads, (ENVIRONMENT_MODULE, *RANK_SIDE))
    assert hits == [], "the environment read outside contract/environment.py:\n" + "\n".join(hits)


def test_the_runtime_reads_the_environment_in_one_module():
    """Every variable the runtime reads in the ranks (SageMaker's ``SM_*``, torchrun's rendezvous, the
    collective timeout and stop grace, the reader and its build, the AWS endpoint, ...) is named once in
    ``runtime/environment.py`` and read (or set) through its accessors; code that takes ``environ=``
    asks it for the mapping. The demo's training scripts are user scripts (they read ``SM_*`` as any
    script does): not the runtime."""
    hits = [
        f"{module} {hit}"
        for module, path in _sources()
        if (module == "sagemaker_dist.runtime" or module.startswith("sagemaker_dist.runtime."))
        and module != RUNTIME_ENVIRONMENT_MODULE
        for hit in _environment_reads(path)
    ]
    assert hits == [], "the environment read outside runtime/environment.py:\n" + "\n".join(hits)
    module_path = PACKAGE / "runtime" / "environment.py"
    assert _environment_reads(module_path), "runtime/environment.py reads the environment itself"


def test_the_environment_rule_catches_a_read(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os\n"
        "from os import environ as env, getenv\n"
        "a = os.environ.get('AWS_ENDPOINT_URL')\n"
        "b = dict(os.environ)\n"
        "os.environ['X'] = '1'\n"
        "c = os.getenv('HOME')\n"
        "d = env['PATH'] + getenv('PATH')\n"
        "ok = os.path.join('a', 'b') and environment.endpoint_url() and job.environment\n"
    )
    assert [h.split(":")[0] for h in _environment_reads(bad)] == ["3", "4", "5", "6", "7", "7"]
