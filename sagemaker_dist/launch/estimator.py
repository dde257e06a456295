"""Launch a data-parallel Pipe-mode training job (Horovod, tf-mwms, torchrun) on SageMaker in a few lines
(orchestration only).

``DistributedEstimator`` holds the job's settings and runs the steps, each of which lives in its own
module: inputs are parsed once (``inputs``), the layout planned (``contract.layout``), bare prefixes
sharded (``sharding``, ``shard_writer``), the request rendered by one pure function (``request``)
and validated (``request_validation``), and the job run by a backend: SageMaker (``backends``) or,
with ``backend=LocalBackend()`` (``sagemaker_dist.LocalBackend``), this machine.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass, field

import boto3

from sagemaker_dist.aws.request_validation import validate_request
from sagemaker_dist.aws.s3_objects import MissingBucketError, S3AccessError, s3_client
from sagemaker_dist.contract.distributions import DEFAULT as DEFAULT_DISTRIBUTION
from sagemaker_dist.contract.distributions import distribution as registered
from sagemaker_dist.contract.draft import PLACEHOLDER_ACCOUNT, PLACEHOLDER_OUTPUT, placeholder_channel_uri
from sagemaker_dist.contract.layout import PER_WORKER, SINGLE, ChannelLayout, RoleLayout, plan_layout
from sagemaker_dist.contract.s3_uri import join_s3
from sagemaker_dist.contract.toolkit import DEFAULT_TOOLKIT_VERSION
from sagemaker_dist.launch.account import check_job_name_free, role_arn
from sagemaker_dist.launch.backends import PreparedJob, SageMakerBackend, TrainingBackend
from sagemaker_dist.launch.estimator_checks import check_settings, check_shared_channels
from sagemaker_dist.launch.images import distribution_image_uri
from sagemaker_dist.launch.inputs import ChannelSource, EstimatorError, JobInputs, parse_inputs
from sagemaker_dist.launch.request import (
    JobSettings,
    RequestSettings,
    ResolvedNames,
    default_job_name,
    framework_hyperparameters,
    render_request,
)
from sagemaker_dist.launch.runtime_package import is_sagemaker_dist_image, runtime_requirements
from sagemaker_dist.launch.source_package import (
    MAX_SOURCE_BYTES,
    TARBALL_NAME,
    SourcePackage,
    pack_source,
    resolve_entry_point,
    upload_source,
)
from sagemaker_dist.launch.staging import plan_role_shards


@dataclass
class DistributedEstimator(JobSettings):
    """Describe a distributed job once; ``launch(inputs)`` (alias ``fit``) shards, uploads and runs it.

    ``inputs`` maps ``train`` (required), ``validation`` and ``eval`` to S3 prefixes, URI lists or
    ShardSets; other keys become extra channels every rank shares. A bare prefix for a per-worker
    role is sharded into balanced manifests (no copying) under the job's output path.

    Construction checks everything that needs no AWS call and raises EstimatorError (a ValueError).
    ``processes_per_host`` defaults to the GPUs of ``instance_type``; give it for CPU types or to run
    fewer processes than GPUs. ``validation`` is how a validation *prefix* is used: ``'single'`` (one
    channel every rank reads in full) or ``'per-worker'`` (sharded). ``shared_channel_input_mode`` is
    the input mode of channels all ranks share (single roles, extra channels): File by default,
    since a Pipe FIFO can have only one reader. ``mpi_options`` extend ``DEFAULT_MPI_OPTIONS``
    (drop those with ``default_mpi_options=False``). ``toolkit_version`` is the image's
    sagemaker-training (the TF DLCs carry 4.8.3): a hyperparameter it would hand the script changed
    gets a ``ToolkitArgumentWarning`` here, before any AWS call. ``distribution`` is an entry of the
    registry (``contract/distributions.py``): ``horovod`` (the default), ``tf-mwms`` or ``torchrun``.
    ``source_exclude`` replaces ``DEFAULT_SOURCE_EXCLUDES``, what is never packed from ``source_dir``
    (caches, ``.git/``, secrets by convention: ``.env*``, ``.netrc``, ``.aws/``, ``.ssh/``).
    With no ``image_uri`` the job runs in our image of its distribution (``container/build_and_push.sh``;
    tf-mwms: AWS's DLC); an image without the package (an AWS DLC) gets it in the source tarball
    (``ship_package``: None decides by the image's repository name, ``sagemaker-dist*`` has it).
    ``object_order_seed`` writes each worker's manifest in an order drawn from the seed and the shard,
    so objects laid out by class, day or source are spread over its stream (name order without it; the
    same order every epoch, unlike ``shuffle_seed``'s ShuffleConfig).
    The keyword arguments the request says (input modes, records, checkpoints, TensorBoard, limits,
    spot, volumes, VPC, tags, environment, mpirun options) are ``launch.request.JobSettings``'s,
    declared there once with their defaults.
    """

    entry_point: str
    role: str
    instance_type: str
    instance_count: int = 1
    _: KW_ONLY
    source_dir: str | None = None
    image_uri: str | None = None
    processes_per_host: int | None = None
    strategy: str = "auto"
    distribution: str = DEFAULT_DISTRIBUTION
    validation: str = SINGLE
    output_path: str | None = None
    code_location: str | None = None
    default_mpi_options: bool = True
    base_job_name: str = "sagemaker-dist"
    toolkit_version: str = DEFAULT_TOOLKIT_VERSION
    max_source_bytes: int = MAX_SOURCE_BYTES
    source_exclude: Sequence[str] | None = None
    ship_package: bool | None = None
    object_order_seed: int | None = None
    sagemaker_session: object = field(default=None, repr=False)

    def __post_init__(self):
        check_settings(self)

    @property
    def request_settings(self) -> RequestSettings:
        """What the request says of these settings, frozen (``render_request`` takes it)."""
        return RequestSettings.of(self)

    @property
    def world_size(self) -> int:
        """Total ranks (workers): hosts x processes per host."""
        return self.instance_count * self.processes_per_host

    def plan(self, inputs) -> ChannelLayout:
        """The channel layout for these inputs (pure: no AWS call)."""
        inputs = parse_inputs(inputs)
        layout = plan_layout(
            self.instance_count,
            self.processes_per_host,
            strategy=self.strategy,
            validation=inputs.validation_spread(self.validation),
            eval_channel="eval" in inputs.roles,
            extra_channels=tuple(inputs.extras),
            reserved_channels=1 if self.enable_network_isolation else 0,  # the code channel
            input_mode=self.input_mode,
            record_wrapper=self.record_wrapper,
            shuffle_seed=self.shuffle_seed,
            distribution=self.distribution,
        )
        check_shared_channels(self.shared_channel_input_mode, layout)
        return layout

    def framework_hyperparameters(self, layout: ChannelLayout, program: str, submit_directory: str) -> dict:
        """The hyperparameters the sagemaker-training toolkit reads to run mpirun on every host."""
        return framework_hyperparameters(layout, program, submit_directory, self.mpi_options)

    def source_uri(self, output_path: str, job_name: str) -> str:
        """Where the job's ``sourcedir.tar.gz`` goes: ``<code_location or output_path>/<job>/source/``."""
        return join_s3(self.code_location or output_path, job_name, "source", TARBALL_NAME)

    def _program(self) -> str:
        return resolve_entry_point(self.entry_point, self.source_dir, self.source_exclude)[1]

    def _render(self, layout, inputs: JobInputs, sources, names: ResolvedNames, program=None) -> dict:
        request = render_request(
            self.request_settings, layout, inputs, sources, names, program or self._program()
        )
        validate_request(request)
        return request

    def build_request(self, inputs, job_name: str | None = None, *, submit_directory: str | None = None,
                      role: str | None = None) -> dict:  # fmt: skip
        """The CreateTrainingJob request for already-sharded inputs, validated; no S3 writes.

        Per-worker roles need one URI per channel (a ShardSet or a list). ``role`` overrides the
        resolved role ARN; a role *name* is turned into an ARN with one STS call.
        """
        inputs = parse_inputs(inputs)
        layout = self.plan(inputs)
        job_name = job_name or default_job_name(self.base_job_name)
        output_path = self._output_path()
        role = role or role_arn(self.role, self._region(), boto_session=self._boto_session())
        names = ResolvedNames(
            job_name,
            role,
            output_path,
            submit_directory or self.source_uri(output_path, job_name),
            self._image(account=role.split(":")[4]),  # our image is in the role's account: no STS call
        )
        return self._render(layout, inputs, inputs.roles, names)

    def draft_request(self, inputs, job_name: str | None = None) -> dict:
        """The request with stand-ins for what needs AWS, validated; makes no AWS call.

        Each per-worker channel of a bare prefix gets a stand-in URI (``contract/draft.py``) where a
        launch would write its shard manifest; account 000000000000 stands for the caller's account
        (a role name, our image) and a placeholder bucket for an unset output path. Hosts refuse a
        request with stand-ins; ``dry_run`` plans the real manifests where S3 can be asked.
        """
        inputs = parse_inputs(inputs)
        layout = self.plan(inputs)
        return self._draft(inputs, layout, job_name or default_job_name(self.base_job_name))

    def dry_run(self, inputs, job_name: str | None = None, *, printer: Callable[[str], None] | None = print):
        """``(request, planned)``: the request a launch would send, made without writing anything.

        With S3 reachable, every bare prefix of a per-worker role is listed and balanced exactly as a
        launch does (the same checks: too few objects for the workers is an error), and the request
        names the manifest URIs a launch would write; ``planned`` lists each (role, manifest URI,
        objects, bytes). Where S3 cannot be asked, a line says why and the request is the draft, with
        stand-ins that hosts refuse; ``planned`` is then empty."""
        say = printer or (lambda _line: None)
        inputs = parse_inputs(inputs)
        layout = self.plan(inputs)
        job_name = job_name or default_job_name(self.base_job_name)
        output = self._output_path(resolve=False)
        try:
            staged = plan_role_shards(
                inputs, layout, join_s3(output, job_name, "shards") + "/", self._s3_client(), say,
                self.object_order_seed,
            )  # fmt: skip
        except MissingBucketError:
            raise
        except S3AccessError as exc:
            say(f"S3 could not be asked ({exc}): the request below is a draft, its per-worker channels are "
                "stand-ins (sagemaker-dist local --request refuses it)")  # fmt: skip
            return self._draft(inputs, layout, job_name), []
        planned = [
            (role, uri, len(keys), sum(sizes))
            for plan, _prefix, role in staged.writes
            for uri, keys, sizes in zip(staged.sources[role].uris, plan.shards, plan.sizes)
        ]
        return self._draft(inputs, layout, job_name, staged.sources), planned

    def _draft(self, inputs: JobInputs, layout: ChannelLayout, job_name: str, sources=None) -> dict:
        if sources is None:
            sources = {r.role: self._draft_source(inputs.roles[r.role], r) for r in layout.roles}
        output = self._output_path(resolve=False)
        role = role_arn(self.role, self._region(), account=PLACEHOLDER_ACCOUNT)
        names = ResolvedNames(
            job_name, role, output, self.source_uri(output, job_name), self._image(account=role.split(":")[4])
        )
        return self._render(layout, inputs, sources, names)

    @staticmethod
    def _draft_source(spec, role: RoleLayout):
        if not isinstance(spec, str):
            return spec
        if role.spread == PER_WORKER and role.count > 1:  # a launch writes a manifest per worker here
            return ChannelSource(tuple(placeholder_channel_uri(role.role, i) for i in range(role.count)))
        return ChannelSource((spec,) * role.count)

    def ships_package(self) -> bool:
        """Whether the sagemaker_dist package travels in the source tarball: ``ship_package``, else
        when the image is not ours by name (an AWS DLC, as given or as the distribution's default)."""
        if self.ship_package is not None:
            return self.ship_package
        if self.image_uri is None:
            return registered(self.distribution).image is not None
        return not is_sagemaker_dist_image(self.image_uri)

    def _shipped_line(self) -> str:
        image = self.image_uri or f"AWS's {registered(self.distribution).title} DLC"
        return (
            f"image {image} has no sagemaker_dist: the package travels in {TARBALL_NAME} and the toolkit "
            f"installs its runtime's requirements ({', '.join(runtime_requirements())}) from "
            "requirements.txt first; its compiled readers are left out (numpy paths), and the image's "
            "entry point does not forward SIGTERM, so a stop (spot, StopTrainingJob) ends the ranks "
            "without a stop checkpoint: they resume from the last step or epoch checkpoint. The image "
            "container/build_and_push.sh builds has both (ship_package=False for an image with the package)"
        )

    def _image(self, account: str | None = None) -> str:
        """``image_uri``, else the distribution's default: our container in ``account``'s ECR (None: the
        caller's, one STS call), or AWS's DLC."""
        if self.image_uri:
            return self.image_uri
        return distribution_image_uri(self.distribution, self._region(), self.instance_type, account)

    def _region(self) -> str | None:
        if self.sagemaker_session is not None:
            return self.sagemaker_session.boto_region_name
        return boto3.session.Session().region_name

    def _output_path(self, resolve: bool = True) -> str:
        if self.output_path:
            return self.output_path.rstrip("/")
        if not resolve:
            return PLACEHOLDER_OUTPUT
        if self.sagemaker_session is None:
            raise EstimatorError(
                "no output_path and no sagemaker_session; pass output_path='s3://bucket/prefix' or "
                "sagemaker_session=Session(default_bucket=...)"
            )
        return f"s3://{self.sagemaker_session.default_bucket()}/{self.base_job_name}"

    def _s3_client(self):
        return s3_client(session=self._boto_session())

    def _boto_session(self):
        if self.sagemaker_session is not None:
            return self.sagemaker_session.boto_session
        return boto3.Session()

    def check_job_name_free(self, job_name: str) -> None:
        """Raise EstimatorError if a training job called ``job_name`` exists (DescribeTrainingJob)."""
        check_job_name_free(job_name, self._boto_session())

    def prepare(
        self,
        inputs,
        job_name: str | None = None,
        *,
        printer: Callable[[str], None] | None = print,
        check_job_name: bool | None = None,
        backend: TrainingBackend | None = None,
    ) -> PreparedJob:
        """Everything up to CreateTrainingJob: check, shard, upload the source, return the request.

        All local checks (layout, entry script, source size, the whole request with placeholders for
        what needs AWS) run before the first AWS call, and the job name is checked to be free before
        the first write, so bad input leaves nothing behind. The request is validated as ``backend``
        (default SageMaker) will run it, config-file defaults included. ``check_job_name=False``
        skips the DescribeTrainingJob call, for runs that create no SageMaker job (local mode).
        """
        say = printer or (lambda _line: None)
        backend = backend or SageMakerBackend(self._boto_session())
        if isinstance(backend, SageMakerBackend):  # before any AWS call: torchrun runs on GPU types only
            registered(self.distribution).check_sagemaker_instance_type(self.instance_type)
        check_job_name = backend.checks_job_name if check_job_name is None else check_job_name
        inputs = parse_inputs(inputs)
        layout = self.plan(inputs)
        job_name = job_name or default_job_name(self.base_job_name)
        with tempfile.TemporaryDirectory(prefix="sagemaker-dist-src-") as tmp:
            ships = backend.runs_request_image and self.ships_package()
            package = pack_source(
                self.entry_point,
                self.source_dir,
                dest_dir=tmp,
                max_bytes=self.max_source_bytes,
                exclude=self.source_exclude,
                runtime_package=ships,
            )
            if package.left_out_line():
                say(package.left_out_line())
            if ships:
                say(self._shipped_line())
            self._draft(inputs, layout, job_name)
            for line in layout.explain():
                say(line)
            request = self._prepare_on_aws(inputs, layout, job_name, package, say, check_job_name, backend)
        return PreparedJob(request, layout, package)

    def _prepare_on_aws(self, inputs: JobInputs, layout: ChannelLayout, job_name: str, package: SourcePackage,
                        say, check, backend) -> dict:  # fmt: skip
        """The AWS part of ``prepare``: resolve output and role, shard bare prefixes, upload the source.

        Every role is listed and planned, and the whole request built and validated from the planned
        manifest URIs, before the first write: a role that cannot be sharded leaves nothing behind.
        """
        output_path = self._output_path()
        role = role_arn(self.role, self._region(), boto_session=self._boto_session())
        if check:
            self.check_job_name_free(job_name)
        client = self._s3_client()
        shards_uri = join_s3(output_path, job_name, "shards") + "/"
        staged = plan_role_shards(inputs, layout, shards_uri, client, say, self.object_order_seed)
        submit = self.source_uri(output_path, job_name)
        names = ResolvedNames(job_name, role, output_path, submit, self._image(account=role.split(":")[4]))
        request = render_request(
            self.request_settings, layout, inputs, staged.sources, names, package.entry_point
        )
        request = validate_request(backend.complete_request(request, say))
        staged.write(client)
        upload_source(package, submit, client=client)
        say(f"uploaded {len(package.files)} source file(s) ({package.source_bytes} bytes) to {submit}")
        return request

    def launch(
        self,
        inputs,
        job_name: str | None = None,
        *,
        backend: TrainingBackend | None = None,
        wait: bool = True,
        poll: float = 30.0,
        timeout: float | None = None,
        printer: Callable[[str], None] | None = print,
    ):
        """Prepare the job and run it on ``backend``; returns what the backend returns.

        The default backend creates the job on SageMaker and returns a ``TrainingJobHandle`` (with
        ``wait``, it prints progress until the job ends). ``backend=LocalBackend()`` (from
        ``sagemaker_dist.local``) runs the very same request on this machine and returns its
        ``LocalJobResult``.
        """
        backend = backend or SageMakerBackend(self._boto_session())
        prepared = self.prepare(inputs, job_name, printer=printer, backend=backend)
        source_dir = resolve_entry_point(self.entry_point, self.source_dir, self.source_exclude)[0]
        return backend.run(
            prepared, source_dir=source_dir, wait=wait, poll=poll, timeout=timeout, printer=printer
        )

    fit = launch

    def tune(
        self,
        inputs,
        *,
        objective_metric: str,
        ranges,
        max_jobs: int | None = None,
        max_parallel_jobs: int = 1,
        objective_type: str = "Maximize",
        strategy: str = "Bayesian",
        early_stopping: str = "Off",
        warm_start=None,
        metrics: Sequence[str] | None = None,
        seed: int | None = None,
        tuning_job_name: str | None = None,
        backend: TrainingBackend | None = None,
        wait: bool = True,
        poll: float = 60.0,
        timeout: float | None = None,
        printer: Callable[[str], None] | None = print,
    ):
        """A tuning job over this job's very request (sharded once, checked before any AWS call): on
        SageMaker, a ``TuningJobHandle``; with ``backend=LocalBackend()``, every trial here and a
        ``LocalTuningResult``. ``ranges`` and ``metrics``: see ``TuningSpec.build``."""
        from sagemaker_dist.aws.tuning import TuningSpec
        from sagemaker_dist.launch.tuning_job import launch_tuning

        spec = TuningSpec.build(
            objective_metric=objective_metric,
            ranges=ranges,
            max_jobs=max_jobs,
            max_parallel_jobs=max_parallel_jobs,
            objective_type=objective_type,
            strategy=strategy,
            early_stopping=early_stopping,
            metrics=metrics,
            warm_start=warm_start,
            seed=seed,
        )
        run = {"backend": backend, "wait": wait, "poll": poll, "timeout": timeout, "printer": printer}
        return launch_tuning(self, inputs, spec, tuning_job_name, **run)
